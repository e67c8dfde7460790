package main

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
)

// The fleet section's scenarios where only the engines know what they
// hold (issue 13): KV pressure (engines evict), traffic that bypasses the
// gateway after a cache warm-up, and engine restarts. Each runs lb_policy
// llm on the KV index (precise) and on the approximate tree alone
// (llm-approx: no KV events), against least_conn and round_robin.

// FleetScenario is one such scenario on the simulated fleet.
type FleetScenario struct {
	Name     string       `json:"name"`
	Desc     string       `json:"desc"`
	Engines  int          `json:"engines"`
	Workload WorkloadSpec `json:"workload"` // Groups is the fleet's, not per engine
	Rho      float64      `json:"rho"`      // the resident set's share of the fleet's KV cache
	Load     float64      `json:"load"`     // × the fleet's no-hit capacity
	Requests int          `json:"requests"`
	// The simulation's options (see fleetsim.Params).
	BypassShare  float64 `json:"bypass_share,omitempty"`
	Warm         bool    `json:"warm,omitempty"`
	RestartEvery float64 `json:"restart_every_seconds,omitempty"`
	Gateways     int     `json:"gateways,omitempty"` // Caddy instances sharing the fleet, clients spread across them
}

// FleetScenarioRun is one policy's outcome in a scenario.
type FleetScenarioRun struct {
	Scenario, Variant           string
	Rate, Rho                   float64
	KVBlocks                    int
	HitRate                     float64 // of the requests the gateway routed (bypass left out)
	TTFT                        Pcts
	Completed, Rejected, Failed int
	Bypassed                    int
	// Outcomes is the llm decisions' mix, "tier/outcome" → count.
	Outcomes map[string]int `json:"outcomes,omitempty"`
}

// scenarioVariants are the policies every scenario runs.
var scenarioVariants = []struct{ name, policy string }{
	{"llm", fleetsim.PolicyLLM}, {"llm-approx", fleetsim.PolicyLLM},
	{"least_conn", fleetsim.PolicyLeastConn}, {"round_robin", fleetsim.PolicyRoundRobin},
}

func runScenarios(ctx context.Context, p FleetParams) ([]FleetScenarioRun, error) {
	var out []FleetScenarioRun
	if p.ScenarioModel.MaxNumSeqs > 0 {
		p.Model = p.ScenarioModel
	}
	m := p.Model
	for _, sc := range p.Scenarios {
		blocks, rho := m.KVBlocks(sc.Workload, sc.Engines, sc.Rho)
		w := sc.Workload
		rate := sc.Load * float64(sc.Engines) * m.Capacity(w.SystemTokens+w.QuestionTokens, 0, w.OutputTokens)
		for _, v := range scenarioVariants {
			sp := p.simParams(sc.Engines, blocks, w, rate, v.policy)
			sp.Requests, sp.Approximate, sp.Gateways = sc.Requests, v.name == "llm-approx", sc.Gateways
			sp.BypassShare, sp.Warm, sp.RestartEvery = sc.BypassShare, sc.Warm, sc.RestartEvery
			r, err := fleetsim.Run(ctx, sp)
			if err != nil {
				return out, fmt.Errorf("scenario %s/%s: %w", sc.Name, v.name, err)
			}
			run := FleetScenarioRun{Scenario: sc.Name, Variant: v.name, Rate: rate, Rho: rho, KVBlocks: blocks, TTFT: percentiles(r.TTFT),
				Completed: r.Completed, Rejected: r.Rejected, Failed: r.Failed, Bypassed: r.Bypassed, Outcomes: r.Outcomes}
			if n := r.PromptTokens - r.BypassPromptTokens; n > 0 {
				run.HitRate = float64(r.CachedTokens-r.BypassCachedTokens) / float64(n)
			}
			log.Printf("fleet scenario %-12s %-12s rate %6.1f: hit %.3f ttft p50 %.2fs p90 %.2fs done %d rej %d failed %d bypassed %d decisions %v",
				sc.Name, v.name, rate, run.HitRate, run.TTFT.P50, run.TTFT.P90, run.Completed, run.Rejected, run.Failed, run.Bypassed, run.Outcomes)
			out = append(out, run)
		}
	}
	return out, nil
}

// renderFleetScenarios is the scenarios' part of the fleet section.
func renderFleetScenarios(b *strings.Builder, p FleetParams, runs []FleetScenarioRun) {
	if len(runs) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### Where only the engines know\n\n")
	if m := p.ScenarioModel; m.MaxNumSeqs > 0 {
		w("On section 2's cost model (prefill %.0f tokens/s, decode step %.0f ms, %d-token steps, max_num_seqs %d). ", m.PrefillTokensPerSec, m.DecodeStepSeconds*1000, m.MaxBatchedTokens, m.MaxNumSeqs)
	}
	w("`llm` routes on the KV index built from the engines' events (precise); `llm-approx` is the same policy for engines without events, on the prefix tree of what this gateway routed itself. Hit rates are of the requests the gateway routed (bypassing ones left out); TTFT of every completed request.\n\n")
	for _, sc := range p.Scenarios {
		w("**%s** — %s\n\n", sc.Name, sc.Desc)
		w("| variant | rate req/s | KV ρ | hit rate | TTFT p50 | p90 | completed | 503 | lost to restarts | bypassed |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range runs {
			if r.Scenario != sc.Name {
				continue
			}
			w("| `%s` | %.1f | %.2f | %.1f%% | %s | %s | %d | %d | %d | %d |\n",
				r.Variant, r.Rate, r.Rho, r.HitRate*100, secs(r.TTFT.P50), secs(r.TTFT.P90), r.Completed, r.Rejected, r.Failed, r.Bypassed)
		}
		w("\n")
	}
}
