package main

import (
	"context"
	"fmt"
	"log"
	"math"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
)

// The trace section (go -C bench run . -trace FILE) replays a production
// trace in the Mooncake format: through the fleet simulation at full token
// counts on 16 and 64 engines of section 2's 32B cost model, and through
// real Caddy in front of simulated engines with the prompts scaled down
// (tracecaddy.go). Each replay runs a time-compression ladder — the
// trace's timestamps divided by each speedup — for lb_policy llm,
// least_conn and round_robin, beside the trace's infinite-cache hit
// ceiling.

// TraceParams configure the section.
type TraceParams struct {
	File string `json:"file"`
	// Requests replays the trace's first Requests requests (0: all).
	Requests int `json:"requests,omitempty"`
	// Model is the engines' cost model (section 2's 32B model).
	Model    EngineModel   `json:"model"`
	Ladders  []TraceLadder `json:"ladders"`
	Policies []string      `json:"policies"`

	PollInterval float64 `json:"poll_interval_seconds"`
	KVLimit      float64 `json:"admission_kv_limit"`
	MaxPark      float64 `json:"max_park_seconds"`
	QueueSize    int     `json:"queue_size"`
	Seed         uint64  `json:"seed"`
	// Caddy is the real-Caddy replay (nil: not run).
	Caddy *TraceCaddyPlan `json:"caddy,omitempty"`
}

// TraceLadder is one fleet size's compression ladder.
type TraceLadder struct {
	Engines  int       `json:"engines"`
	Speedups []float64 `json:"speedups"`
}

// TracePooled is the pooled-cache ceiling of one fleet size.
type TracePooled struct {
	Engines   int     `json:"engines"`
	Blocks    int     `json:"blocks"` // of 512 tokens
	BlockRate float64 `json:"block_rate"`
	TokenRate float64 `json:"token_rate"`
	// OptimalBlockRate is the share of blocks the same room finds under
	// Belady's MIN (fleetsim.OptimalCeiling): a bound on any eviction
	// order's.
	OptimalBlockRate float64 `json:"optimal_block_rate,omitempty"`
}

// TraceRun is one (replay, engines, speedup, policy) outcome. Times are
// simulated seconds.
type TraceRun struct {
	Replay  string  `json:"replay"` // "fleetsim" or "caddy"
	Engines int     `json:"engines"`
	Speedup float64 `json:"speedup"`
	// Rate is the compressed trace's mean arrival rate.
	Rate      float64 `json:"rate"`
	Policy    string  `json:"policy"`
	HitRate   float64 `json:"hit_rate"`
	TTFT      Pcts    `json:"ttft"`
	Completed int     `json:"completed"`
	Rejected  int     `json:"rejected"`
	// Errors counts requests that failed otherwise (caddy: broken
	// streams, timeouts).
	Errors      int     `json:"errors,omitempty"`
	WallSeconds float64 `json:"wall_seconds"`
}

// TraceResult is the section's output.
type TraceResult struct {
	Params TraceParams `json:"params"`
	// Commit is the checkout the replays ran on (checkoutCommit).
	Commit string `json:"commit"`
	// Ceiling is the replayed requests' infinite-cache hit ceiling.
	Ceiling fleetsim.TraceCeiling `json:"ceiling"`
	// KVBlocks is each simulated engine's KV cache (traceKVBlocks).
	KVBlocks int `json:"kv_blocks"`
	// Pooled is, per fleet size, the hit ceiling of the fleet's whole KV
	// cache as one LRU cache (fleetsim.PooledCeiling): what the trace
	// allows at that cache size, whatever the routing.
	Pooled []TracePooled `json:"pooled,omitempty"`
	Runs   []TraceRun    `json:"runs"`
	// CaddyCeiling is the ceiling of the requests the real-Caddy replay
	// sends, CaddyKVBlocks its engines' KV cache in scaled blocks.
	CaddyCeiling  *fleetsim.TraceCeiling `json:"caddy_ceiling,omitempty"`
	CaddyKVBlocks int                    `json:"caddy_kv_blocks,omitempty"`
}

// traceKVBlocks sizes an engine's KV cache for a trace as the fleet
// section sizes it for a workload's working set: 1.25 × max_num_seqs
// requests of the trace's mean size (prompt and output) — but never below
// its largest request, which an engine must be able to hold whole. The
// real-Caddy replay's engines hold prompts promptScale and outputs
// outputScale times shorter (1 and 1: full counts).
func traceKVBlocks(reqs []fleetsim.TraceRequest, m EngineModel, promptScale, outputScale int) int {
	var sum float64
	largest := 0
	for _, r := range reqs {
		n := (r.InputLength+promptScale-1)/promptScale + (r.OutputLength+outputScale-1)/outputScale
		sum += float64(n)
		largest = max(largest, (n+m.BlockSize-1)/m.BlockSize)
	}
	mean := sum / float64(max(1, len(reqs))) / float64(m.BlockSize)
	return max(largest, int(math.Ceil(workingSetHeadroom*float64(m.MaxNumSeqs)*mean)))
}

// traceRate is the mean arrival rate of reqs compressed by speedup.
func traceRate(reqs []fleetsim.TraceRequest, speedup float64) float64 {
	span := float64(reqs[len(reqs)-1].Timestamp-reqs[0].Timestamp) / 1000
	if span <= 0 {
		return 0
	}
	return float64(len(reqs)) / span * speedup
}

// runTrace runs the section: the fleet simulation's ladders, then the
// real-Caddy replay.
func runTrace(ctx context.Context, env *Env, p TraceParams) (*TraceResult, error) {
	reqs, err := fleetsim.ReadTraceFile(p.File, fleetsim.TraceLimits{})
	if err != nil {
		return nil, err
	}
	if p.Requests > 0 && p.Requests < len(reqs) {
		reqs = reqs[:p.Requests]
	}
	res := &TraceResult{Params: p, Ceiling: fleetsim.Ceiling(reqs), KVBlocks: traceKVBlocks(reqs, p.Model, 1, 1),
		Commit: checkoutCommit(ctx, env.Root)}
	c := res.Ceiling
	log.Printf("trace %s: %d requests over %.0f s, %d distinct blocks, infinite-cache ceiling %.1f%% of blocks (%.1f%% of tokens); %d KV blocks per engine",
		p.File, c.Requests, c.Seconds, c.DistinctBlocks, c.BlockRate*100, c.TokenRate*100, res.KVBlocks)
	for _, l := range p.Ladders {
		blocks := l.Engines * res.KVBlocks * p.Model.BlockSize / fleetsim.TraceBlockTokens
		pc, opt := fleetsim.PooledCeiling(reqs, blocks), fleetsim.OptimalCeiling(reqs, blocks)
		res.Pooled = append(res.Pooled, TracePooled{Engines: l.Engines, Blocks: blocks, BlockRate: pc.BlockRate, TokenRate: pc.TokenRate, OptimalBlockRate: opt.BlockRate})
		log.Printf("trace: %d engines' KV cache pooled in one LRU (%d blocks of 512) would hit %.1f%% of tokens; Belady's MIN would find %.1f%% of blocks", l.Engines, blocks, pc.TokenRate*100, opt.BlockRate*100)
		for _, x := range l.Speedups {
			for _, pol := range p.Policies {
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				run, err := p.simulate(ctx, reqs, traceRung{engines: l.Engines, blocks: res.KVBlocks, speedup: x, policy: pol})
				if err != nil {
					return res, fmt.Errorf("trace fleetsim %d engines %.2fx %s: %w", l.Engines, x, pol, err)
				}
				logTraceRun(run)
				res.Runs = append(res.Runs, run)
			}
		}
	}
	if p.Caddy == nil {
		return res, nil
	}
	return res, res.runCaddy(ctx, env, reqs)
}

func logTraceRun(r TraceRun) {
	log.Printf("trace %-8s %3d engines %5.2fx (%5.1f req/s) %-12s hit %.3f ttft p50 %.2fs p90 %.2fs p99 %.2fs done %d rej %d err %d wall %.1fs",
		r.Replay, r.Engines, r.Speedup, r.Rate, r.Policy, r.HitRate, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.Completed, r.Rejected, r.Errors, r.WallSeconds)
}

// traceRung is one replay of a ladder: the fleet size, each engine's KV
// blocks, the time compression and the policy.
type traceRung struct {
	engines, blocks int
	speedup         float64
	policy          string
}

// simulate is one fleet-simulation replay.
func (p TraceParams) simulate(ctx context.Context, reqs []fleetsim.TraceRequest, rung traceRung) (TraceRun, error) {
	engines, blocks, speedup, policy := rung.engines, rung.blocks, rung.speedup, rung.policy
	m := p.Model
	run := TraceRun{Replay: "fleetsim", Engines: engines, Speedup: speedup, Rate: traceRate(reqs, speedup), Policy: policy}
	sp := fleetsim.Params{
		Engines: engines, KVBlocks: blocks,
		Model: fleetsim.Model{MaxNumSeqs: m.MaxNumSeqs, BlockSize: m.BlockSize, PrefillTokensPerSec: m.PrefillTokensPerSec,
			DecodeStepSeconds: m.DecodeStepSeconds, MaxBatchedTokens: m.MaxBatchedTokens},
		Trace: reqs, TraceSpeedup: speedup, Policy: policy, MaxInflight: m.MaxNumSeqs, KVLimit: p.KVLimit,
		PollInterval: p.PollInterval, MaxPark: p.MaxPark, QueueSize: p.QueueSize, Seed: p.Seed,
	}
	start := time.Now()
	r, err := fleetsim.Run(ctx, sp)
	if err != nil {
		return run, err
	}
	run.WallSeconds = time.Since(start).Seconds()
	run.Completed, run.Rejected, run.TTFT = r.Completed, r.Rejected, percentiles(r.TTFT)
	if r.PromptTokens > 0 {
		run.HitRate = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	return run, nil
}

// saturation is the lowest speedup of (replay, engines) at which
// round_robin's TTFT p90 is at least twice its p90 at the ladder's lowest
// speedup, or at which it refuses requests, as section 1 defines
// saturation; 0 when round_robin never saturates on the ladder.
func (r *TraceResult) saturation(replay string, engines int) float64 {
	var base float64
	for _, run := range r.Runs {
		if run.Replay != replay || run.Engines != engines || run.Policy != fleetsim.PolicyRoundRobin {
			continue
		}
		if base == 0 {
			base = run.TTFT.P90
			continue
		}
		if run.TTFT.P90 >= 2*base || run.Rejected > 0 {
			return run.Speedup
		}
	}
	return 0
}
