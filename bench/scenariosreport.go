package main

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"
)

// The scenarios section of the report (issue 13): per scenario its
// table, and against the goals the comparison at the rate where
// round_robin saturates.

// plotScenarios draws the scenarios' hit rates at the rate where
// round_robin saturates, and TTFT p90 against the rate for every
// scenario with a ladder.
func plotScenarios(dir, ext string, q *QualityResult) ([]string, error) {
	if len(q.Runs) == 0 {
		return nil, nil // a late-join run alone: nothing on a rate ladder
	}
	hit, err := plotHitRate(dir, ext, "scenarios_hit_rate", q, q.satRate)
	if err != nil {
		return nil, err
	}
	names := []string{hit}
	for _, w := range q.Workloads {
		if len(q.rates(w.Spec.Name)) < 2 {
			continue
		}
		name, err := plotTTFT(dir, ext, q, w.Spec.Name)
		if err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, nil
}

func renderScenarios(b *strings.Builder, q *QualityResult, f SectionFile, plotsRel string, plots []string) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p := q.Params
	w("## 2. Where only the engines know: real Caddy\n\n")
	w("Command: `%s` (%s of this run).\n\n", f.rerun("scenarios"), time.Duration(f.Seconds*float64(time.Second)).Round(time.Second))
	w("The setup of section 1 — a fresh fleet of %d `vllmsim` engines and fresh Caddy processes per run, the same load generator, hit rate from the engines' `usage` — in the conditions where a gateway's own guess of what the engines hold goes wrong: engines evicting, several gateways sharing the fleet, traffic that never passes a gateway, engines restarting, bursts of one new prefix, engines serving different models, prompts that carry images, and one data-parallel server's ranks in place of separate engines. `llm` routes on the KV index built from the engines' events (precise); `llm-approx` is the same policy without KV events, on the prefix tree of what that gateway routed itself.\n\n", p.Engines)
	w("%s\n\n", scenarioModelNote)
	w("| scenario | shape | requests | engines × max_num_seqs | KV blocks/engine | ρ | time scale | cap₀ req/s | cap₁ req/s | rates (× cap₀) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, qw := range q.Workloads {
		var rs []string
		for _, x := range q.rates(qw.Spec.Name) {
			rs = append(rs, fmt.Sprintf("%g", x))
		}
		if qw.Scenario.lateJoin() {
			rs = append(rs, fmt.Sprintf("warm-up at %g, then one at a time", qw.Scenario.LateJoin.WarmRate))
		}
		engines := p.Engines
		if qw.Engines > 0 {
			engines = qw.Engines
		}
		w("| %s | %s | %d | %d × %d | %d | %.2f | %g× | %.1f | %.1f | %s |\n", qw.Spec.Name, qw.Spec.Shape(), qw.Spec.Requests(), engines, qw.Model.MaxNumSeqs,
			qw.KVBlocks, qw.Rho, qw.TimeScale, qw.CapMiss, qw.CapHit, strings.Join(rs, ", "))
	}
	w("\n")
	for _, pl := range plots {
		w("![%s](%s)\n\n", strings.TrimSuffix(pl, filepath.Ext(pl)), filepath.ToSlash(filepath.Join(plotsRel, pl)))
	}
	for _, qw := range q.Workloads {
		renderScenario(b, q, qw)
	}
	if goals := scenarioGoals(q); len(goals) > 0 {
		w("### Against the goals\n\n")
		for _, g := range goals {
			w("- %s\n", g)
		}
		w("\n")
	}
}

// renderScenario writes one scenario's table.
func renderScenario(b *strings.Builder, q *QualityResult, qw QualityWorkload) {
	if qw.Scenario.lateJoin() {
		renderLateJoin(b, q, qw)
		return
	}
	if qw.Scenario.models() != nil {
		renderMultiModel(b, q, qw)
		return
	}
	if qw.Spec.Kind == "images" {
		renderImages(b, q, qw)
		return
	}
	if qw.Scenario.dataParallel() {
		renderDPRanks(b, q, qw)
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	name := qw.Spec.Name
	desc := ""
	if qw.Scenario != nil {
		desc = qw.Scenario.Desc
	}
	w("### %s\n\n%s\n\n", name, desc)
	bursts := qw.Scenario != nil && qw.Scenario.BurstSize > 1
	w("| rate | policy | hit rate | TTFT p50 | p90 | p99 | output tok/s | completed | 503 | failed |")
	if bursts {
		w(" engines per burst p50 / max | bursts on > 2 engines | burst hit rate |")
	}
	w(" bypassed | restarts | sim lag | decisions |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	if bursts {
		w("---:|---:|---:|")
	}
	w("---:|---:|---:|---|\n")
	for _, x := range q.rates(name) {
		for _, pol := range q.Params.Policies {
			r := q.at(name, pol.Name, x)
			if r == nil {
				continue
			}
			s := r.Summary
			w("| %.1f/s (%g×) | `%s` | %.1f%% | %s | %s | %s | %.0f | %d/%d | %d | %d |", r.Rate, x, pol.Name, s.HitRate*100,
				secs(s.TTFT.P50), secs(s.TTFT.P90), secs(s.TTFT.P99), s.OutputTPS, s.OK, s.Requests, s.Rejected, s.Errors+s.Timeouts)
			if bursts {
				w(" %s | %s | %s |", burstEngines(r.Bursts), burstSpread(r.Bursts), burstHit(r.Bursts))
			}
			w(" %d | %d | %s | %s |\n", r.Bypassed, r.Restarts, lagText(r, q.Params), decisions(r.Decisions))
		}
	}
	w("\n")
	if qw.Scenario != nil && qw.Scenario.Why != "" {
		w("Why: %s\n\n", qw.Scenario.Why)
	}
}

func lagText(r *QualityRun, p QualityParams) string {
	lag := fmt.Sprintf("%.2f", r.SimLag)
	if r.SimLag == 0 {
		lag = "–"
	}
	if r.Attempts > 1 {
		lag += fmt.Sprintf(" (%d tries)", r.Attempts)
	}
	if r.SimLag > p.LagThreshold {
		lag = "**" + lag + "**"
	}
	return lag
}

func burstEngines(s *BurstStats) string {
	if s == nil || s.EnginesMax == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f / %d", s.EnginesP50, s.EnginesMax)
}

func burstSpread(s *BurstStats) string {
	if s == nil || s.EnginesMax == 0 {
		return "–"
	}
	return fmt.Sprintf("%d of %d", s.Spread, s.Bursts)
}

func burstHit(s *BurstStats) string {
	if s == nil {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", s.HitRate*100)
}

// scenarioGoals compares precise with approximate routing (and with
// round_robin) in every scenario at the rate where round_robin
// saturates, and gateways-N with gateways-1, as issue 13 states its
// goals.
func scenarioGoals(q *QualityResult) []string {
	var out []string
	for _, qw := range q.Workloads {
		name := qw.Spec.Name
		for _, x := range q.rates(name) {
			if x < q.satRate(name)-1e-9 && !strings.HasPrefix(name, "gateways") {
				continue
			}
			if qw.Scenario.models() != nil {
				if g := loraGoal(q, name, x); g != "" {
					out = append(out, g)
				}
				continue
			}
			if qw.Spec.Kind == "images" {
				if g := imagesGoal(q, name, x); g != "" {
					out = append(out, g)
				}
				continue
			}
			if qw.Scenario.dataParallel() {
				if g := dpGoal(q, name, x); g != "" {
					out = append(out, g)
				}
				continue
			}
			if g := goalLine(q, name, x); g != "" {
				out = append(out, g)
			}
		}
	}
	for _, qw := range q.Workloads {
		name := qw.Spec.Name
		if !strings.HasPrefix(name, "gateways-") || name == "gateways-1" {
			continue
		}
		for _, x := range q.rates(name) {
			one, many := q.at("gateways-1", "llm", x), q.at(name, "llm", x)
			if one == nil || many == nil || one.Summary.HitRate == 0 {
				continue
			}
			out = append(out, fmt.Sprintf("%s at %g× cap₀: `llm` hit rate %.1f%% = %.3f × gateways-1's %.1f%%",
				name, x, many.Summary.HitRate*100, many.Summary.HitRate/one.Summary.HitRate, one.Summary.HitRate*100))
		}
	}
	return append(out, lateJoinGoals(q)...)
}

// goalLine is one scenario's comparison at rate x.
func goalLine(q *QualityResult, name string, x float64) string {
	llm := q.at(name, "llm", x)
	if llm == nil {
		return ""
	}
	var parts []string
	if ap := q.at(name, "llm-approx", x); ap != nil {
		parts = append(parts, fmt.Sprintf("hit rate `llm` %.1f%% vs `llm-approx` %.1f%% (%+.1f points), TTFT p90 %s vs %s (%s)",
			llm.Summary.HitRate*100, ap.Summary.HitRate*100, (llm.Summary.HitRate-ap.Summary.HitRate)*100,
			secs(llm.Summary.TTFT.P90), secs(ap.Summary.TTFT.P90), ratio(llm.Summary.TTFT.P90, ap.Summary.TTFT.P90)))
	}
	if ns := q.at(name, "llm-nospec", x); ns != nil && llm.Bursts != nil && ns.Bursts != nil {
		parts = append(parts, fmt.Sprintf("engines per burst p50/max %s vs %s without speculative entries, burst hit rate %s vs %s",
			burstEngines(llm.Bursts), burstEngines(ns.Bursts), burstHit(llm.Bursts), burstHit(ns.Bursts)))
	}
	if rr := q.at(name, "round_robin", x); rr != nil {
		parts = append(parts, fmt.Sprintf("`round_robin` hit rate %.1f%%, TTFT p90 %s (`llm` at %s of it)",
			rr.Summary.HitRate*100, secs(rr.Summary.TTFT.P90), ratio(llm.Summary.TTFT.P90, rr.Summary.TTFT.P90)))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("%s at %.1f req/s (%g× cap₀): %s", name, llm.Rate, x, strings.Join(parts, "; "))
}

// ratio formats a ÷ b as "0.42×".
func ratio(a, b float64) string {
	if b <= 0 || math.IsNaN(a) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// headlineRate is the rate a scenario is summed up at: where round_robin
// saturates, or for gateways-N (compared past saturation) its highest.
func headlineRate(q *QualityResult, name string) float64 {
	if rs := q.rates(name); strings.HasPrefix(name, "gateways") && len(rs) > 0 {
		return rs[len(rs)-1]
	}
	return q.satRate(name)
}

// comparedPolicy is what precise routing is set against in a scenario's
// summary: the approximate tier, for bursts the same policy without
// speculative entries, for images the same gateway without the image
// token id, for dp-ranks the same gateway in front of one data-parallel
// server.
func comparedPolicy(qw QualityWorkload) string {
	if qw.Scenario != nil && qw.Scenario.BurstSize > 1 {
		return "llm-nospec"
	}
	if qw.Spec.Kind == "images" {
		return "llm-textkeys"
	}
	if qw.Scenario.dataParallel() {
		return dpPolicy
	}
	return "llm-approx"
}

// renderScenarioHeadline is the headline's table of the scenarios: each
// at the rate where round_robin saturates (gateways-N at its highest
// rate), precise against approximate routing and round_robin.
func renderScenarioHeadline(b *strings.Builder, q *QualityResult) {
	if len(q.Runs) == 0 {
		return // a late-join run alone: its figures are in section 2
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("Where only the engines know what they hold (section 2: real Caddy, %d engines of a 32B-like cost model; hit rate and TTFT p90 in simulated seconds):\n\n", q.Params.Engines)
	w("| scenario | rate | `llm` (precise) | `llm-approx` | `round_robin` |\n|---|---:|---:|---:|---:|\n")
	for _, qw := range q.Workloads {
		name, x := qw.Spec.Name, headlineRate(q, qw.Spec.Name)
		cell := func(policy string) string {
			r := q.at(name, policy, x)
			if r == nil {
				return "–"
			}
			label := ""
			if policy == "llm-nospec" || policy == "llm-textkeys" || policy == dpPolicy {
				label = "`" + policy + "`: "
			}
			return fmt.Sprintf("%s%.1f%%, %s", label, r.Summary.HitRate*100, secs(r.Summary.TTFT.P90))
		}
		llm := q.at(name, "llm", x)
		if llm == nil {
			continue
		}
		w("| %s | %.1f/s (%g×) | %s | %s | %s |\n", name, llm.Rate, x, cell("llm"), cell(comparedPolicy(qw)), cell("round_robin"))
	}
	w("\n")
}

// scenarioFinding condenses the scenarios for the findings: per
// scenario the precise and approximate hit rates at the headline's rate.
func scenarioFinding(q *QualityResult) string {
	var parts []string
	for _, qw := range q.Workloads {
		name, x := qw.Spec.Name, headlineRate(q, qw.Spec.Name)
		llm, ap := q.at(name, "llm", x), q.at(name, comparedPolicy(qw), x)
		if llm == nil || ap == nil {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.0f%% vs %.0f%%", name, llm.Summary.HitRate*100, ap.Summary.HitRate*100))
	}
	if len(parts) == 0 {
		return ""
	}
	return "hit rate of precise `llm` vs `llm-approx` (`llm-nospec` for burst, `llm-textkeys` for images, `llm-dp` for dp-ranks): " + strings.Join(parts, "; ")
}
