package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
)

// The fleet section runs internal/sim/fleetsim: the gateway's own core (a real
// fleet.Fleet: admission, routing, accounting, the KV index fed vLLM
// event batches) against a discrete-event model of N engines, at fleet
// sizes one machine cannot run as processes.

// FleetParams configure the section.
type FleetParams struct {
	Sizes    []int        `json:"sizes"`
	Requests int          `json:"requests"`
	Workload WorkloadSpec `json:"workload"` // Groups is set per size
	// GroupsPerEngine scales the number of prefix groups with the fleet.
	GroupsPerEngine int         `json:"groups_per_engine"`
	Model           EngineModel `json:"model"`
	Rho             float64     `json:"rho"`

	PollInterval float64 `json:"poll_interval_seconds"`
	KVLimit      float64 `json:"admission_kv_limit"`
	// InflightX is max_inflight as a multiple of max_num_seqs (0 = 1).
	InflightX float64        `json:"inflight_x,omitempty"`
	MaxPark   float64        `json:"max_park_seconds"`
	QueueSize int            `json:"queue_size"`
	Variants  []FleetVariant `json:"variants"`
	Seed      uint64         `json:"seed"`
	// Bursts is the burst scenario (nil: not run).
	Bursts *FleetBurstPlan `json:"bursts,omitempty"`
	// Scenarios are the cases where only the engines know what they hold.
	Scenarios []FleetScenario `json:"scenarios,omitempty"`
	// ScenarioModel is the engine the scenarios run on (section 2's cost
	// model); zero: Model.
	ScenarioModel EngineModel `json:"scenario_model,omitempty"`
	// CPUTier is the cpu-tier scenario, on ScenarioModel (nil: not run).
	CPUTier *FleetTierPlan `json:"cpu_tier,omitempty"`
}

// FleetVariant is one routing configuration at one load.
type FleetVariant struct {
	Name string `json:"name"`
	// Policy: "llm" (the fleet's Route on the KV index), "least_conn"
	// (Caddy's least_conn) or "round_robin".
	Policy string `json:"policy"`
	// Load is the arrival rate as a multiple of the fleet's capacity
	// without cache hits.
	Load float64 `json:"load"`
	// InflightX is max_inflight (admission and the policy's saturation
	// rule) as a multiple of max_num_seqs; 0 means 1.
	InflightX float64 `json:"inflight_x,omitempty"`
}

// FleetRun is one (size, variant) result. Times are simulated seconds,
// except the gateway's CPU figures, which are host time.
type FleetRun struct {
	Engines   int     `json:"engines"`
	Variant   string  `json:"variant"`
	Policy    string  `json:"policy"`
	Load      float64 `json:"load"`
	InflightX float64 `json:"inflight_x,omitempty"`
	Groups    int     `json:"groups"`
	KVBlocks  int     `json:"kv_blocks"`
	Rate      float64 `json:"rate"`
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`
	Rejected  int     `json:"rejected"`
	HitRate   float64 `json:"hit_rate"`
	TTFT      Pcts    `json:"ttft"`
	E2E       Pcts    `json:"e2e"`
	// Park is the time requests waited in the gateway's admission queue,
	// Queue the time they then waited in the engine's queue before it
	// admitted them (at their last admission, after any preemption).
	Park  Pcts `json:"park"`
	Queue Pcts `json:"queue"`
	// IdleWhenRefused is the mean number of sequence slots that were
	// actually free in the fleet when the admission gate (reading gauges
	// up to a poll interval old) refused a request.
	IdleWhenRefused float64 `json:"idle_when_refused"`
	Refusals        int     `json:"refusals"`
	OutputTPS       float64 `json:"output_tps"`
	SimSeconds      float64 `json:"sim_seconds"`
	Preemptions     int     `json:"preemptions"`
	// Gateway cost (llm policy): host nanoseconds per routing decision
	// (keys + index match + Pick), host microseconds of event decoding and
	// mirror updates per request, index heap and blocks mirrored.
	DecisionNs     Pcts           `json:"decision_ns"`
	EventUsPerReq  float64        `json:"event_us_per_request"`
	EventBatches   int            `json:"event_batches"`
	IndexBytes     int64          `json:"index_bytes"`
	IndexBlocks    int            `json:"index_blocks"`
	Outcomes       map[string]int `json:"outcomes,omitempty"`
	WallSeconds    float64        `json:"wall_seconds"`
	MirrorProblems uint64         `json:"mirror_problems"` // unchainable + malformed + decode errors: should be 0
}

// FleetResult is the section's output.
type FleetResult struct {
	Params    FleetParams        `json:"params"`
	Runs      []FleetRun         `json:"runs"`
	Bursts    []FleetBurstRun    `json:"bursts,omitempty"`
	Scenarios []FleetScenarioRun `json:"scenarios,omitempty"`
	CPUTier   []FleetTierRun     `json:"cpu_tier,omitempty"`
}

func runFleet(ctx context.Context, p FleetParams) (*FleetResult, error) {
	res := &FleetResult{Params: p}
	for _, n := range p.Sizes {
		for _, v := range p.Variants {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			r, err := simulateFleet(ctx, p, n, v)
			if err != nil {
				return res, fmt.Errorf("fleet %d/%s: %w", n, v.Name, err)
			}
			log.Printf("fleet %4d engines %-18s rate %6.1f: done %d rej %d hit %.3f park p90 %.2fs queue p90 %.2fs ttft p50 %.2fs p90 %.2fs p99 %.2fs tok/s %.0f decision %.1fµs (p99 %.1fµs) events %.1fµs/req index %.1f MiB %d blocks wall %.1fs",
				n, v.Name, r.Rate, r.Completed, r.Rejected, r.HitRate, r.Park.P90, r.Queue.P90, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.OutputTPS,
				r.DecisionNs.Mean/1000, r.DecisionNs.P99/1000, r.EventUsPerReq, float64(r.IndexBytes)/(1<<20), r.IndexBlocks, r.WallSeconds)
			res.Runs = append(res.Runs, r)
		}
	}
	var err error
	if res.Bursts, err = runBursts(ctx, p); err != nil {
		return res, err
	}
	if res.Scenarios, err = runScenarios(ctx, p); err != nil {
		return res, err
	}
	res.CPUTier, err = runCPUTier(ctx, p)
	return res, err
}

// simulateFleet runs one (size, variant) of the section.
func simulateFleet(ctx context.Context, p FleetParams, n int, v FleetVariant) (FleetRun, error) {
	w := p.Workload
	w.Groups = p.GroupsPerEngine * n
	blocks, _ := p.Model.KVBlocks(w, n, p.Rho)
	capMiss := float64(n) * p.Model.Capacity(w.SystemTokens+w.QuestionTokens, 0, w.OutputTokens)
	run := FleetRun{Engines: n, Variant: v.Name, Policy: v.Policy, Load: v.Load, InflightX: v.InflightX, Groups: w.Groups, KVBlocks: blocks,
		Rate: v.Load * capMiss, Requests: p.Requests}
	m := p.Model
	start := time.Now()
	sp := p.simParams(n, blocks, w, run.Rate, v.Policy)
	sp.Requests, sp.MaxInflight = p.Requests, int(max(1, v.InflightX)*float64(m.MaxNumSeqs))
	r, err := fleetsim.Run(ctx, sp)
	if err != nil {
		return run, err
	}
	run.WallSeconds = time.Since(start).Seconds()
	fillFleetRun(&run, &r)
	return run, nil
}

// simParams is one simulation of the section: engines × blocks of the
// section's model, the workload, the section's admission limits and seed,
// at rate with policy; max_inflight is max_num_seqs. Callers set the
// request count and any scenario options.
func (p FleetParams) simParams(engines, blocks int, w WorkloadSpec, rate float64, policy string) fleetsim.Params {
	m := p.Model
	return fleetsim.Params{
		Engines: engines, KVBlocks: blocks,
		Model: fleetsim.Model{MaxNumSeqs: m.MaxNumSeqs, BlockSize: m.BlockSize, PrefillTokensPerSec: m.PrefillTokensPerSec,
			DecodeStepSeconds: m.DecodeStepSeconds, MaxBatchedTokens: m.MaxBatchedTokens},
		Groups: w.Groups, SystemTokens: w.SystemTokens, QuestionTokens: w.QuestionTokens, OutputTokens: w.OutputTokens,
		Rate: rate, Policy: policy, MaxInflight: m.MaxNumSeqs, KVLimit: p.KVLimit,
		PollInterval: p.PollInterval, MaxPark: p.MaxPark, QueueSize: p.QueueSize, Seed: p.Seed,
	}
}

// fillFleetRun turns a simulation's raw result into the section's figures.
func fillFleetRun(run *FleetRun, r *fleetsim.Result) {
	run.SimSeconds = r.SimSeconds
	run.Completed, run.Rejected = r.Completed, r.Rejected
	if r.PromptTokens > 0 {
		run.HitRate = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	run.TTFT, run.E2E = percentiles(r.TTFT), percentiles(r.E2E)
	run.Park, run.Queue = percentiles(r.Park), percentiles(r.Queue)
	run.Refusals = r.Refusals
	if r.Refusals > 0 {
		run.IdleWhenRefused = float64(r.RefusedIdle) / float64(r.Refusals)
	}
	if r.SimSeconds > 0 {
		run.OutputTPS = float64(r.OutputTokens) / r.SimSeconds
	}
	run.Preemptions = r.Preemptions
	if run.Policy == fleetsim.PolicyLLM {
		run.DecisionNs = percentiles(r.DecisionNs)
		run.EventUsPerReq = float64(r.EventTime.Microseconds()) / float64(max(1, r.Completed))
		run.EventBatches = r.EventBatches
		run.Outcomes = r.Outcomes
		run.IndexBlocks, run.MirrorProblems, run.IndexBytes = r.IndexBlocks, r.MirrorProblems, r.IndexBytes
	}
}
