package main

import (
	"context"
	"fmt"
	"log"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
)

// The fleet section's burst scenario (issue 13): groups arrive as bursts
// of requests within a few milliseconds, each burst a prefix no engine
// holds yet, so the first request's KV events cannot have arrived when
// the rest are routed. Speculative entries are what keeps such a burst
// together; the scenario runs with and without them.

// FleetBurstPlan configures the burst scenario.
type FleetBurstPlan struct {
	Engines  int                 `json:"engines"`
	Size     int                 `json:"size"`           // requests per burst
	Window   float64             `json:"window_seconds"` // a burst's requests arrive within it
	Load     float64             `json:"load"`           // × the fleet's no-hit capacity
	Requests int                 `json:"requests"`
	Workload WorkloadSpec        `json:"workload"` // Groups: one per burst
	Variants []FleetBurstVariant `json:"variants"`
}

// FleetBurstVariant is one routing configuration of the burst scenario.
type FleetBurstVariant struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
	// SpeculativeOff runs the llm policy with speculative_ttl 0.
	SpeculativeOff bool `json:"speculative_off,omitempty"`
}

// FleetBurstRun is one variant's outcome.
type FleetBurstRun struct {
	Variant string  `json:"variant"`
	Rate    float64 `json:"rate"`
	// Engines per burst: median, max, and the bursts on more than two.
	EnginesP50, EnginesMax, Over2, Bursts int
	// BurstHitRate is the hit rate of every burst's requests after its
	// first; HitRate that of all requests.
	BurstHitRate, HitRate float64
	TTFT                  Pcts
	Completed, Rejected   int
}

func runBursts(ctx context.Context, p FleetParams) ([]FleetBurstRun, error) {
	bp := p.Bursts
	if bp == nil {
		return nil, nil
	}
	w := bp.Workload
	w.Groups = (bp.Requests + bp.Size - 1) / bp.Size // every burst a new prefix
	blocks, _ := p.Model.KVBlocks(w, bp.Engines, p.Rho)
	rate := bp.Load * float64(bp.Engines) * p.Model.Capacity(w.SystemTokens+w.QuestionTokens, 0, w.OutputTokens)
	var out []FleetBurstRun
	for _, v := range bp.Variants {
		sp := p.simParams(bp.Engines, blocks, w, rate, v.Policy)
		sp.Requests, sp.BurstSize, sp.BurstWindow = bp.Requests, bp.Size, bp.Window
		if v.SpeculativeOff {
			sp.SpeculativeTTL = -1
		}
		start := time.Now()
		r, err := fleetsim.Run(ctx, sp)
		if err != nil {
			return out, fmt.Errorf("bursts %s: %w", v.Name, err)
		}
		run := burstRun(v.Name, rate, &r)
		log.Printf("fleet bursts %-16s rate %6.1f: engines/burst p50 %d max %d (>2: %d of %d) burst hit %.3f hit %.3f ttft p90 %.2fs wall %.1fs",
			v.Name, rate, run.EnginesP50, run.EnginesMax, run.Over2, run.Bursts, run.BurstHitRate, run.HitRate, run.TTFT.P90, time.Since(start).Seconds())
		out = append(out, run)
	}
	return out, nil
}

// burstRun turns a simulation's result into the scenario's figures.
func burstRun(name string, rate float64, r *fleetsim.Result) FleetBurstRun {
	run := FleetBurstRun{Variant: name, Rate: rate, Completed: r.Completed, Rejected: r.Rejected, TTFT: percentiles(r.TTFT)}
	e := slices.Clone(r.BurstEngines)
	slices.Sort(e)
	if len(e) > 0 {
		run.Bursts, run.EnginesP50, run.EnginesMax = len(e), e[len(e)/2], e[len(e)-1]
	}
	for _, n := range e {
		if n > 2 {
			run.Over2++
		}
	}
	if r.BurstPromptTokens > 0 {
		run.BurstHitRate = float64(r.BurstCachedTokens) / float64(r.BurstPromptTokens)
	}
	if r.PromptTokens > 0 {
		run.HitRate = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	return run
}

// renderBursts is the burst scenario's part of the fleet section.
func renderBursts(b *strings.Builder, p FleetParams, runs []FleetBurstRun) {
	bp := p.Bursts
	if bp == nil || len(runs) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("### Bursts\n\n")
	w("%d engines; requests arrive as bursts of %d within %.0f ms (bursts a Poisson process, %.1f× the no-hit capacity in requests), each burst a %d-token prefix nobody holds yet plus %d tokens of its own, %d output tokens; %d requests. The first request of a burst is routed before any engine has announced its blocks, so only speculative entries (the llm app's `speculative_ttl`, default 2 s: a routed prompt counts as held on its engine until that engine's own events confirm it) can keep the rest with it; `llm-nospec` is the same policy with `speculative_ttl 0`. *Engines per burst* counts the engines a burst's requests went to; *burst hit rate* is the cache hit rate of every burst's requests after its first.\n\n",
		bp.Engines, bp.Size, bp.Window*1000, bp.Load, bp.Workload.SystemTokens, bp.Workload.QuestionTokens, bp.Workload.OutputTokens, bp.Requests)
	w("| variant | rate req/s | engines per burst p50 / max | bursts on > 2 engines | burst hit rate | hit rate | TTFT p50 | p90 | completed | 503 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		w("| `%s` | %.1f | %d / %d | %d of %d | %.1f%% | %.1f%% | %s | %s | %d | %d |\n",
			r.Variant, r.Rate, r.EnginesP50, r.EnginesMax, r.Over2, r.Bursts, r.BurstHitRate*100, r.HitRate*100, secs(r.TTFT.P50), secs(r.TTFT.P90), r.Completed, r.Rejected)
	}
	w("\n")
}
