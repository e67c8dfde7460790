package main

import (
	"fmt"
	"strings"
)

// The late-join scenario's part of the report: per case, both gateways'
// precise hit rates on the same requests, and what the routed requests
// cost.

// lateJoinGoal is the least ratio of the new gateway's precise hit rate
// to the reference's that issue 35 accepts.
const lateJoinGoal = 0.95

// hitSummary condenses one gateway's explains over some compared
// requests.
type hitSummary struct {
	// Requests both gateways explained; Errors, those either failed to.
	Requests, Errors int
	// Prompt, Picked and Best sum the rows' PickedBlocks.
	Prompt, Picked, Best int
	// Holding counts the picks that hold at least one block.
	Holding int
}

// rate is the precise hit rate: blocks held at the pick over prompt
// blocks.
func (h hitSummary) rate() float64 {
	if h.Prompt == 0 {
		return 0
	}
	return float64(h.Picked) / float64(h.Prompt)
}

// holdingShare is the share of requests whose pick holds a block.
func (h hitSummary) holdingShare() float64 {
	if h.Requests == 0 {
		return 0
	}
	return float64(h.Holding) / float64(h.Requests)
}

func newSide(r *LateJoinRow) PickedBlocks { return r.New }
func refSide(r *LateJoinRow) PickedBlocks { return r.Ref }

// summarizeHits sums side's explains over the rows keep accepts (every
// row when keep is nil). A row either gateway could not explain is left
// out of both gateways' sums alike, and counted in Errors.
func summarizeHits(rows []LateJoinRow, side func(*LateJoinRow) PickedBlocks, keep func(i int) bool) hitSummary {
	var h hitSummary
	for i := range rows {
		r := &rows[i]
		if keep != nil && !keep(i) {
			continue
		}
		if r.New.Err != "" || r.Ref.Err != "" {
			h.Errors++
			continue
		}
		p := side(r)
		h.Requests++
		h.Prompt += p.Prompt
		h.Picked += p.Picked
		h.Best += p.Best
		if p.Picked > 0 {
			h.Holding++
		}
	}
	return h
}

// firstSightings marks the rows whose group no earlier row had: no event
// since the new gateway subscribed can have named their prefix, so no
// gateway that learns from events can know it yet.
func firstSightings(rows []LateJoinRow) []bool {
	seen := map[string]bool{}
	out := make([]bool, len(rows))
	for i, r := range rows {
		out[i] = !seen[r.Group]
		seen[r.Group] = true
	}
	return out
}

// routedSummary is what the requests of a case cost where they were
// routed.
type routedSummary struct {
	TTFT      Pcts
	EngineHit float64 // Σ cached ÷ Σ prompt tokens, from the engines' usage
	Failed    int
	// Agree of Picks requests went to the engine the routing gateway's
	// explain picked (admission may place a request elsewhere).
	Agree, Picks int
}

// summarizeRouted sums a case's routed requests.
func summarizeRouted(c LateJoinCase) routedSummary {
	var s routedSummary
	var ttft []float64
	var prompt, cached int
	for i := range c.Rows {
		r := &c.Rows[i]
		if r.Err != "" {
			s.Failed++
			continue
		}
		ttft = append(ttft, r.TTFT)
		prompt += r.Prompt
		cached += r.Cached
		pick := r.Ref.Pick
		if c.NewRoutes {
			pick = r.New.Pick
		}
		if pick != "" && r.Upstream != "" {
			s.Picks++
			if pick == r.Upstream {
				s.Agree++
			}
		}
	}
	s.TTFT = percentiles(ttft)
	if prompt > 0 {
		s.EngineHit = float64(cached) / float64(prompt)
	}
	return s
}

// lateJoinResult finds a late-join workload's result.
func (q *QualityResult) lateJoinResult(workload string) *LateJoinResult {
	for i := range q.LateJoin {
		if q.LateJoin[i].Workload == workload {
			return &q.LateJoin[i]
		}
	}
	return nil
}

// gatewayNames names a case's new and reference gateways.
func (c LateJoinCase) gatewayNames() (nw, ref string) {
	if c.Restart {
		return "restarted", "reference"
	}
	return "late", "early"
}

// router names the gateway that routed the compared requests.
func (c LateJoinCase) router() string {
	nw, ref := c.gatewayNames()
	if c.NewRoutes {
		return nw
	}
	return ref
}

// renderLateJoin writes the late-join scenario's section: the options
// the gateways ran with, a row per case and what the columns mean.
func renderLateJoin(b *strings.Builder, q *QualityResult, qw QualityWorkload) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### %s\n\n%s\n\n", qw.Spec.Name, qw.Scenario.Desc)
	lj := q.lateJoinResult(qw.Spec.Name)
	if lj == nil || len(lj.Cases) == 0 {
		w("No results in this run.\n\n")
		return
	}
	w("%s\n\n", appOptionsNote(lj))
	w("| case | routed by | precise hit rate: new gateway | reference | ratio | ratio past first sightings | first sightings | first 10: new / reference | picks holding ≥ 1 block: new / reference | engine hit rate | TTFT p50 | p90 | mean | failed | went to the explained pick | mirrored blocks at the end: new / reference |\n")
	w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range lj.Cases {
		w("%s\n", lateJoinRow(c))
	}
	w("\n%s\n\n", lateJoinDefinitions(lj))
	if qw.Scenario.Why != "" {
		w("Why: %s\n\n", qw.Scenario.Why)
	}
}

// lateJoinRow is one case's table row.
func lateJoinRow(c LateJoinCase) string {
	first := firstSightings(c.Rows)
	nw, ref := summarizeHits(c.Rows, newSide, nil), summarizeHits(c.Rows, refSide, nil)
	past := func(i int) bool { return !first[i] }
	nwPast, refPast := summarizeHits(c.Rows, newSide, past), summarizeHits(c.Rows, refSide, past)
	ten := func(i int) bool { return i < 10 }
	nw10, ref10 := summarizeHits(c.Rows, newSide, ten), summarizeHits(c.Rows, refSide, ten)
	firstIn10 := 0
	for i := range min(10, len(first)) {
		if first[i] {
			firstIn10++
		}
	}
	rt := summarizeRouted(c)
	name := c.Name
	if errs := nw.Errors; errs > 0 {
		name += fmt.Sprintf(" (%d requests not explained)", errs)
	}
	return fmt.Sprintf("| %s | %s | %.1f%% | %.1f%% | **%s** | %s | %d of %d | %.1f%% / %.1f%% (%d first sightings) | %.0f%% / %.0f%% | %.1f%% | %s | %s | %s | %d | %d/%d | %d / %d |",
		name, c.router(), nw.rate()*100, ref.rate()*100, ratio(nw.rate(), ref.rate()), ratio(nwPast.rate(), refPast.rate()),
		count(first), len(first), nw10.rate()*100, ref10.rate()*100, firstIn10, nw.holdingShare()*100, ref.holdingShare()*100,
		rt.EngineHit*100, secs(rt.TTFT.P50), secs(rt.TTFT.P90), secs(rt.TTFT.Mean), rt.Failed, rt.Agree, rt.Picks, c.NewBlocks, c.RefBlocks)
}

// count is the number of true values.
func count(v []bool) int {
	n := 0
	for _, x := range v {
		if x {
			n++
		}
	}
	return n
}

// appOptionsNote says which llm app options the gateways ran with, and
// which of the plan's this build rejected.
func appOptionsNote(lj *LateJoinResult) string {
	quote := func(lines []string) string {
		var q []string
		for _, l := range lines {
			q = append(q, "`"+l+"`")
		}
		return strings.Join(q, ", ")
	}
	s := "Every gateway ran with the app options " + quote(strings.Split(lj.AppBody, "\n")) + "."
	if lj.AppBody == "" {
		s = "Every gateway ran with the default app options."
	}
	if len(lj.Rejected) > 0 {
		s += " This build rejected " + quote(lj.Rejected) + " as unknown, so the gateways ran without it: these figures are of a gateway without that option."
	}
	return s
}

// lateJoinDefinitions states what the table's columns measure.
func lateJoinDefinitions(lj *LateJoinResult) string {
	n := 0
	if len(lj.Cases) > 0 {
		n = len(lj.Cases[0].Rows)
	}
	return fmt.Sprintf("Each case runs on a fresh fleet. The warm-up sends %d requests through the gateway present from the start; then the new gateway subscribes, and the next %d requests go one at a time through the gateway named under *routed by*. "+
		"*late, observing*: the early gateway warmed the engines and routes, the late one (started after the warm-up) only answers explain. *late, routing*: the late gateway routes and the early one only answers explain. "+
		"*restart*: the only routing gateway warmed the engines and was stopped; the same config started anew routes, and a reference gateway subscribed since before the warm-up, which routes nothing, answers explain. "+
		"**Precise hit rate**: the blocks each gateway's pick holds by its KV index — precise tier, confirmed by the engines' events, its own speculative entries left out — over the prompts' full blocks, from the admin `POST /llm/explain` just before the request is routed; the next request is explained only once both gateways have applied every event the last one caused, so both answer on the same engine state. "+
		"**Ratio**: new ÷ reference, over the same requests (issue 35 asks ≥ %.2f). A request is a **first sighting** when no earlier compared request had its group: no live event since the new gateway subscribed has named that prefix, so the gateway can know it there only from what the engine's replay buffer held; *past first sightings* leaves them out. "+
		"**Engine hit rate** (cached ÷ prompt tokens from the engines' usage) and **TTFT** (simulated seconds; one request at a time on an otherwise idle fleet, so it is the prefill the pick saved or not, no queueing) are of the routed requests.",
		lj.Warm, n, lateJoinGoal)
}

// lateJoinGoals states each late-join case in which the new gateway
// routed against issue 35's goal.
func lateJoinGoals(q *QualityResult) []string {
	var out []string
	for _, lj := range q.LateJoin {
		for _, c := range lj.Cases {
			if !c.NewRoutes {
				continue
			}
			nwName, refName := c.gatewayNames()
			nw, ref := summarizeHits(c.Rows, newSide, nil), summarizeHits(c.Rows, refSide, nil)
			verdict := "below"
			if ref.rate() > 0 && nw.rate() >= lateJoinGoal*ref.rate() {
				verdict = "meets"
			}
			line := fmt.Sprintf("%s, %s: the %s gateway's precise hit rate over its first %d requests %.1f%% = %s the %s gateway's %.1f%% over the same requests (%s the goal of %.2f×; %d of them first sightings)",
				lj.Workload, c.Name, nwName, nw.Requests, nw.rate()*100, ratio(nw.rate(), ref.rate()), refName, ref.rate()*100, verdict, lateJoinGoal, count(firstSightings(c.Rows)))
			if len(lj.Rejected) > 0 {
				line += "; gateways without " + strings.Join(lj.Rejected, ", ")
			}
			out = append(out, line)
		}
	}
	return out
}
