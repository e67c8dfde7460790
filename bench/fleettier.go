package main

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
	"github.com/llmgw/caddy-llmgw/routing"
)

// The fleet section's cpu-tier scenario (issue 40): engines with a CPU
// offload tier half their GPU cache's size, under KV pressure, so that
// prefixes the GPUs evict live on in the engines' CPU tiers, announced by
// the OffloadingConnector's token-less CPU events. It compares lb_policy
// llm crediting those tiers (cpu_tier_weight 0.75, the default) with the
// same policy matching GPU blocks only (weights -1), both as the product
// runs them (admission places the request) and routed by Fleet.Route
// alone, against round_robin and against llm on engines without a tier.

// FleetTierPlan is the cpu-tier scenario.
type FleetTierPlan struct {
	Name     string       `json:"name"`
	Engines  int          `json:"engines"`
	Workload WorkloadSpec `json:"workload"` // Groups is the fleet's
	// Rho is the resident set's share of the fleet's GPU KV cache: above 1,
	// the GPUs cannot hold every group's prefix.
	Rho float64 `json:"rho"`
	// CPUShare is each engine's CPU tier as a share of its GPU blocks.
	CPUShare float64 `json:"cpu_share"`
	Load     float64 `json:"load"` // × the fleet's no-hit capacity
	Requests int     `json:"requests"`
}

// FleetTierRun is one variant's outcome in the cpu-tier scenario.
type FleetTierRun struct {
	Variant, Desc       string
	Policy              string
	Rate, Rho           float64
	KVBlocks, CPUBlocks int
	// GPUHitRate is the GPU prefix-cache hits' share of the prompt tokens,
	// CPUHitRate the share loaded from the CPU tier.
	GPUHitRate, CPUHitRate float64
	TTFT                   Pcts
	Completed, Rejected    int
	// Offloaded is the blocks the GPUs evicted into the tiers;
	// IndexCPUBlocks and EngineCPUBlocks what the gateway's index and the
	// engines held in them at the end; TierUnknown the CPU blocks the
	// index could not apply.
	Offloaded, IndexCPUBlocks, EngineCPUBlocks int
	TierUnknown                                uint64
}

// tierVariant is one configuration of the cpu-tier scenario.
type tierVariant struct {
	name, desc string
	policy     string
	gpuOnly    bool // cpu_tier_weight and storage_tier_weight -1
	unplaced   bool // routed by Fleet.Route, admission not placing
	noTier     bool // engines without a CPU tier
}

var tierVariants = []tierVariant{
	{name: "llm", desc: "tier credits (defaults), placed by admission", policy: fleetsim.PolicyLLM},
	{name: "llm-gpu-only", desc: "GPU blocks only (tier weights -1), placed by admission", policy: fleetsim.PolicyLLM, gpuOnly: true},
	{name: "llm-route", desc: "tier credits, routed by Fleet.Route (no placement)", policy: fleetsim.PolicyLLM, unplaced: true},
	{name: "llm-route-gpu-only", desc: "GPU blocks only, routed by Fleet.Route (no placement)", policy: fleetsim.PolicyLLM, unplaced: true, gpuOnly: true},
	{name: "round_robin", desc: "Caddy's round_robin", policy: fleetsim.PolicyRoundRobin},
	{name: "llm-no-tier", desc: "tier credits, engines without a CPU tier", policy: fleetsim.PolicyLLM, noTier: true},
}

func runCPUTier(ctx context.Context, p FleetParams) ([]FleetTierRun, error) {
	tp := p.CPUTier
	if tp == nil {
		return nil, nil
	}
	if p.ScenarioModel.MaxNumSeqs > 0 {
		p.Model = p.ScenarioModel
	}
	w := tp.Workload
	blocks, rho := p.Model.KVBlocks(w, tp.Engines, tp.Rho)
	rate := tp.Load * float64(tp.Engines) * p.Model.Capacity(w.SystemTokens+w.QuestionTokens, 0, w.OutputTokens)
	var out []FleetTierRun
	for _, v := range tierVariants {
		sp := p.simParams(tp.Engines, blocks, w, rate, v.policy)
		sp.Requests, sp.Unplaced = tp.Requests, v.unplaced
		if !v.noTier {
			sp.CPUBlocks = int(tp.CPUShare * float64(blocks))
		}
		if v.gpuOnly {
			sp.Cost = routing.Config{CPUTierWeight: -1, StorageTierWeight: -1}
		}
		r, err := fleetsim.Run(ctx, sp)
		if err != nil {
			return out, fmt.Errorf("%s/%s: %w", tp.Name, v.name, err)
		}
		run := FleetTierRun{Variant: v.name, Desc: v.desc, Policy: v.policy, Rate: rate, Rho: rho, KVBlocks: blocks, CPUBlocks: sp.CPUBlocks,
			TTFT: percentiles(r.TTFT), Completed: r.Completed, Rejected: r.Rejected, Offloaded: r.Offloaded,
			IndexCPUBlocks: r.IndexCPUBlocks, EngineCPUBlocks: r.CPUTierBlocks, TierUnknown: r.TierUnknown}
		if r.PromptTokens > 0 {
			run.GPUHitRate = float64(r.CachedTokens) / float64(r.PromptTokens)
			run.CPUHitRate = float64(r.CPUCachedTokens) / float64(r.PromptTokens)
		}
		log.Printf("fleet %s %-18s rate %5.1f: hit gpu %.3f cpu %.3f ttft p50 %.2fs p90 %.2fs done %d rej %d offloaded %d cpu blocks index %d engines %d unknown %d",
			tp.Name, v.name, rate, run.GPUHitRate, run.CPUHitRate, run.TTFT.P50, run.TTFT.P90, run.Completed, run.Rejected,
			run.Offloaded, run.IndexCPUBlocks, run.EngineCPUBlocks, run.TierUnknown)
		out = append(out, run)
	}
	return out, nil
}

// renderCPUTier is the cpu-tier scenario's part of the fleet section.
func renderCPUTier(b *strings.Builder, p FleetParams, runs []FleetTierRun) {
	tp := p.CPUTier
	if tp == nil || len(runs) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	r0 := runs[0]
	w("### CPU offload tier (%s)\n\n", tp.Name)
	w("%d engines of section 2's 32B cost model, prefix-high's prompts (%d/%d/%d tokens) in %d groups at %.1f req/s (%.1f× the no-hit capacity), %d requests. KV pressure: the groups' prefixes fill %.2f× the fleet's GPU cache (%d blocks per engine%s); each engine has a CPU tier of %d blocks (%.0f%% of its GPU's). ",
		tp.Engines, tp.Workload.SystemTokens, tp.Workload.QuestionTokens, tp.Workload.OutputTokens, tp.Workload.Groups, r0.Rate, tp.Load, tp.Requests,
		r0.Rho, r0.KVBlocks, floorNote(r0.Rho, tp.Rho, p.Model.MaxNumSeqs), int(tp.CPUShare*float64(r0.KVBlocks)), tp.CPUShare*100)
	w("A block the GPU evicts moves to the CPU tier (its LRU evicting in turn), announced as vLLM's OffloadingConnector announces it before vllm#43468: a CPU `BlockStored` without tokens (`block_size` 0, the hash as raw bytes) before the GPU's `BlockRemoved`, and a CPU `BlockRemoved` when the tier evicts. A prompt's prefix continues from the GPU into the CPU tier; those blocks are loaded at %g× the prefill rate (the step lasts that much longer) instead of computed. GPU hits are vLLM's `prefix_cache_hits`, CPU hits its `external_prefix_cache_hits` (counted apart, as vLLM does). `llm` and `llm-gpu-only` run as the product does under `llm_admission` (admission's `Fleet.Place` chooses the engine); the `llm-route` variants let `Fleet.Route` choose, admission counting only room (`fleetsim.Params.Unplaced`).\n\n",
		float64(fleetsim.DefaultCPULoadSpeedup))
	w("| variant | | GPU hits | CPU hits | TTFT p50 | p90 | p99 | completed | 503 | blocks offloaded | CPU blocks: index / engines |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		cpu := fmt.Sprintf("%d / %d", r.IndexCPUBlocks, r.EngineCPUBlocks)
		if r.Policy != fleetsim.PolicyLLM {
			cpu = fmt.Sprintf("– / %d", r.EngineCPUBlocks) // no index without lb_policy llm
		}
		if r.TierUnknown > 0 {
			cpu += fmt.Sprintf(" (%d unknown)", r.TierUnknown)
		}
		w("| `%s` | %s | %.1f%% | %.1f%% | %s | %s | %s | %d | %d | %d | %s |\n",
			r.Variant, r.Desc, r.GPUHitRate*100, r.CPUHitRate*100, secs(r.TTFT.P50), secs(r.TTFT.P90), secs(r.TTFT.P99), r.Completed, r.Rejected, r.Offloaded, cpu)
	}
	w("\n")
	for _, pair := range [][2]string{{"llm", "llm-gpu-only"}, {"llm-route", "llm-route-gpu-only"}} {
		w("%s\n", tierVerdict(runs, pair[0], pair[1]))
	}
	w("\nWhy: the tier credits send a prompt back to the engine that offloaded its prefix, under admission (`Fleet.Place` weighs the tiers as `routing.Pick` does) as under `Fleet.Route`, which the CPU hits above show. Where that engine still holds the prefix in either tier the request loads it instead of computing it, which shows in TTFT p90 as long as fewer than a tenth of the requests miss in both tiers; where more do, p90 is a full miss's prefill whatever the routing.\n\n")
}

// floorNote says, when the scenario's GPU caches are at the simulation's
// floor (1.25 × a full batch's blocks, see KVBlocks) rather than sized by
// the asked-for rho, what fills the rest of them.
func floorNote(actual, asked float64, maxNumSeqs int) string {
	if actual >= asked-0.005 {
		return ""
	}
	return fmt.Sprintf(", the floor of %g × the blocks of a full batch of %d requests: an idle engine holds its prefixes, a busy one's running requests evict them", workingSetHeadroom, maxNumSeqs)
}

// tierVerdict compares a variant crediting the CPU tier with its GPU-only
// twin on TTFT p90 (and p50, and the tier's hits), in one sentence.
func tierVerdict(runs []FleetTierRun, credited, gpuOnly string) string {
	var c, g *FleetTierRun
	for i := range runs {
		switch runs[i].Variant {
		case credited:
			c = &runs[i]
		case gpuOnly:
			g = &runs[i]
		}
	}
	if c == nil || g == nil {
		return ""
	}
	// Within 5% the runs' p90s are the same figure: a seed's noise.
	verdict := "matches"
	switch {
	case c.TTFT.P90 < 0.95*g.TTFT.P90:
		verdict = "beats"
	case c.TTFT.P90 > 1.05*g.TTFT.P90:
		verdict = "loses to"
	}
	return fmt.Sprintf("- `%s` %s `%s` on TTFT p90: %.3f s vs %.3f s (p50 %.3f s vs %.3f s; CPU hits %.1f%% vs %.1f%%).",
		credited, verdict, gpuOnly, c.TTFT.P90, g.TTFT.P90, c.TTFT.P50, g.TTFT.P50, c.CPUHitRate*100, g.CPUHitRate*100)
}
