package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	gwfleet "github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// The dp-ranks scenario (issue 40): prefix-high at 1× cap₀ through the
// same gateway, once in front of 4 separate engines (`llm`) and once in
// front of one data-parallel server whose 4 ranks are engines of the same
// size (`llm-dp`: `vllm serve --data-parallel-size 4`, declared with
// data_parallel_size 4). Precise routing should not care which: the
// gateway has 4 targets either way, each rank with its own KV events on
// the server's event port + rank, reached through the one port with the
// X-data-parallel-rank header. The simulator counts the requests that
// reached it without a rank it has, and names in every answer the rank
// that served it, which the harness checks against the gateway's pick.

// dpPolicy is the data-parallel arm of the dp-ranks scenario: `llm` in
// front of one data-parallel server.
const dpPolicy = "llm-dp"

// RankStats are a data-parallel run's figures: what the server counted
// of the rank header, and how the ranks that served the client's
// requests compare with the gateway's picks.
type RankStats struct {
	// Pinned is, by rank, the requests that reached the server naming it
	// in X-data-parallel-rank; Unpinned those without the header (vLLM's
	// own load balancer would place them), Refused those naming a rank the
	// server lacks (answered 400).
	Pinned   []uint64 `json:"pinned"`
	Unpinned uint64   `json:"unpinned"`
	Refused  uint64   `json:"refused"`
	// Checked counts the client's requests a rank answered (those with
	// the server's X-Vllmsim-Data-Parallel-Rank header); Mismatched, of
	// those, the ones whose rank is not the one the gateway's
	// X-LLM-Upstream header names (or that name none).
	Checked    int `json:"checked"`
	Mismatched int `json:"mismatched"`
}

// serverRankStats reads a data-parallel server's rank counters.
func serverRankStats(d *vllmsim.DPServer) *RankStats {
	return &RankStats{Pinned: d.Pinned(), Unpinned: d.Unpinned(), Refused: d.Refused()}
}

// Requests is how many requests reached the server to run on a rank.
func (s *RankStats) Requests() uint64 {
	n := s.Unpinned + s.Refused
	for _, p := range s.Pinned {
		n += p
	}
	return n
}

// Unranked is how many requests reached the server without a valid rank
// header: none, or a rank it lacks.
func (s *RankStats) Unranked() uint64 { return s.Unpinned + s.Refused }

// compare checks every record a rank of the server at dial answered: the
// gateway's pick (X-LLM-Upstream, the rank's key dial#r) must name the
// rank that served it.
func (s *RankStats) compare(recs []Record, dial string) {
	for i := range recs {
		r := &recs[i]
		if r.ServedRank == "" {
			continue
		}
		s.Checked++
		rank, err := strconv.Atoi(r.ServedRank)
		if err != nil || r.Upstream != gwfleet.RankKey(dial, rank) {
			s.Mismatched++
		}
	}
}

// prefixHigh is section 1's prefix-high workload: 40 groups of 8
// requests sharing a 2048-token system prompt, each with 256 tokens of
// its own and 256 of output.
func prefixHigh() WorkloadSpec {
	return WorkloadSpec{Name: "prefix-high", Kind: "prefix", Groups: 40, PerGroup: 8, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 256,
		Reference: "256×16, 2048/256/256 (high cache)", Seed: 1}
}

// dpRanksPlan is the dp-ranks scenario: prefix-high at 1× cap₀ on 4
// separate engines and on one server of 4 ranks, the two runs one after
// the other.
func dpRanksPlan() QualityPlan {
	w := prefixHigh()
	w.Name, w.Reference = "dp-ranks", "prefix-high: "+w.Reference
	return QualityPlan{Workload: w, Rates: []float64{1},
		Scenario: &ScenarioOptions{Engines: 4, Policies: []string{"llm", dpPolicy}, Why: dpRanksWhy,
			Desc: "prefix-high's workload (40 groups of 8, 2048/256/256) at 1× cap₀ through the same gateway (`lb_policy llm`, KV events), in front of 4 separate engines (`llm`) " +
				"and in front of one simulated `vllm serve --data-parallel-size 4` whose 4 ranks are engines of the same size, behind one port (`llm-dp`): " +
				"declared with `data_parallel_size 4`, the gateway routes to the ranks as 4 targets, each fed by its rank's KV events (the server's event port + rank), " +
				"and names its pick in the `X-data-parallel-rank` header. The server counts the requests that reached it without a rank it has, " +
				"and names in every answer the rank that served it, which the harness checks against the gateway's pick (`X-LLM-Upstream`)."}}
}

// tinyDPRanksPlan is the dp-ranks scenario of the -quick run: 2 engines
// against one server of 2 ranks, 4 groups of 3.
func tinyDPRanksPlan() QualityPlan {
	w := WorkloadSpec{Name: "dp-ranks", Kind: "prefix", Groups: 4, PerGroup: 3, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 32, Seed: 1}
	return QualityPlan{Workload: w, Rates: []float64{1}, Scenario: &ScenarioOptions{Desc: "tiny", Engines: 2, Policies: []string{"llm", dpPolicy}}}
}

// dpRanksWhy bounds the dp-ranks scenario's figures from its shape.
const dpRanksWhy = "each prompt is 2,317 tokens (2,048 of system prompt, 256 of question, the chat template's 13); a group's first request misses and the other 7 can hit the system prompt, so no router's hit rate passes 7/8 × 2048/2317 = 77.3%. " +
	"Each rank is an engine of the separate engines' size with its own scheduler, KV cache and events, and the gateway scrapes each rank's gauges from the server's one `/metrics` page by their `engine` label, " +
	"so the gateway faces the same 4 targets in both runs: the two should differ by what differs between any two runs of the same load (arrival times are the same; the engines' timing on a shared host is not)."

// dataParallel reports whether the plan has a data-parallel arm: the
// dp-ranks scenario.
func (sc *ScenarioOptions) dataParallel() bool {
	return sc != nil && slices.Contains(sc.Policies, dpPolicy)
}

// renderDPRanks writes the dp-ranks scenario's table: per arm the
// client's figures, the requests each engine or rank served, and what the
// server counted of the rank header.
func renderDPRanks(b *strings.Builder, q *QualityResult, qw QualityWorkload) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	name := qw.Spec.Name
	w("### %s\n\n%s\n\n", name, qw.Scenario.Desc)
	w("| rate | fleet | policy | hit rate | TTFT p50 | p90 | completed | 503 | failed | requests per engine / rank | reached the server without a valid rank header | served by a rank other than the gateway's pick | sim lag |\n")
	w("|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
	for _, x := range q.rates(name) {
		for _, pol := range q.Params.Policies {
			r := q.at(name, pol.Name, x)
			if r == nil {
				continue
			}
			s := r.Summary
			w("| %.1f/s (%g×) | %s | `%s` | %.1f%% | %s | %s | %d/%d | %d | %d | %s | %s | %s | %s |\n",
				r.Rate, x, dpFleetText(r, pol.DataParallel), pol.Name, s.HitRate*100, secs(s.TTFT.P50), secs(s.TTFT.P90),
				s.OK, s.Requests, s.Rejected, s.Errors+s.Timeouts, perEngineText(r.PerEngine), unrankedText(r.Ranks), mismatchText(r.Ranks), lagText(r, q.Params))
		}
	}
	w("\n")
	if qw.Scenario.Why != "" {
		w("Why: %s\n\n", qw.Scenario.Why)
	}
}

// dpFleetText is "4 engines" or "1 server × 4 ranks".
func dpFleetText(r *QualityRun, dp bool) string {
	if dp {
		return fmt.Sprintf("1 server × %d ranks", len(r.PerEngine))
	}
	return fmt.Sprintf("%d engines", len(r.PerEngine))
}

// perEngineText is "80 / 81 / 79 / 80".
func perEngineText(n []uint64) string {
	parts := make([]string, len(n))
	for i, v := range n {
		parts[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(parts, " / ")
}

// unrankedText is "0 of 320", or "–" for a run without a data-parallel
// server.
func unrankedText(s *RankStats) string {
	if s == nil {
		return "–"
	}
	return fmt.Sprintf("%d of %d", s.Unranked(), s.Requests())
}

// mismatchText is "0 of 320", or "–" without a data-parallel server.
func mismatchText(s *RankStats) string {
	if s == nil {
		return "–"
	}
	return fmt.Sprintf("%d of %d", s.Mismatched, s.Checked)
}

// dpGoal is issue 40's data-parallel figure for the dp-ranks scenario at
// rate x: the hit rate through the ranks against the separate engines'
// in the same run (the goal: within 3 points), and the requests that
// reached the server without their rank or on another rank than the
// gateway picked (the goal: none).
func dpGoal(q *QualityResult, name string, x float64) string {
	sep, dp := q.at(name, "llm", x), q.at(name, dpPolicy, x)
	if sep == nil || dp == nil || dp.Ranks == nil {
		return ""
	}
	diff := (dp.Summary.HitRate - sep.Summary.HitRate) * 100
	met := "meets"
	if diff < -3 || diff > 3 {
		met = "misses"
	}
	return fmt.Sprintf("%s at %.1f req/s (%g× cap₀): hit rate through one server's %d ranks %.1f%% vs %d separate engines %.1f%% (%+.1f points: %s the goal of within 3), "+
		"TTFT p50 %s vs %s, p90 %s vs %s; at the server %s requests came without a valid `X-data-parallel-rank` and %s were served by a rank other than the gateway's pick",
		name, dp.Rate, x, len(dp.PerEngine), dp.Summary.HitRate*100, len(sep.PerEngine), sep.Summary.HitRate*100, diff, met,
		secs(dp.Summary.TTFT.P50), secs(sep.Summary.TTFT.P50), secs(dp.Summary.TTFT.P90), secs(sep.Summary.TTFT.P90),
		unrankedText(dp.Ranks), mismatchText(dp.Ranks))
}
