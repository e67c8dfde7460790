package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The parameters of every section, in one place: the report prints them.

// qualityWorkloads are the routing-quality workloads, scaled from the
// field's shapes (see WorkloadSpec.Reference): group counts are cut so a
// run sends a few hundred requests, and the KV cache is sized by the rule
// in EngineModel.KVBlocks.
func qualityWorkloads(quick bool) []QualityPlan {
	// The ladder goes past round_robin's saturation (about 1× cap₀) and
	// past lb_policy llm's (about cap₁ ÷ cap₀ ≈ 1.6× on prefix-high).
	ladder := []float64{0.5, 1.0, 1.3, 1.7}
	plans := []QualityPlan{
		{Workload: prefixHigh(), Rates: ladder},
		{Workload: WorkloadSpec{Name: "prefix-low", Kind: "prefix", Groups: 40, PerGroup: 8, SystemTokens: 256, QuestionTokens: 2048, OutputTokens: 256,
			Reference: "256×16, 256/2048/256 (low cache)", Seed: 2}, Rates: []float64{1.0}},
		{Workload: WorkloadSpec{Name: "prefix-long", Kind: "prefix", Groups: 24, PerGroup: 5, SystemTokens: 6000, QuestionTokens: 1200, OutputTokens: 1000,
			Reference: "150×5, 6000/1200/1000", Seed: 3}, Rates: []float64{1.0}},
		{Workload: WorkloadSpec{Name: "multiturn", Kind: "multiturn", Groups: 48, Turns: 6, SystemTokens: 1024, QuestionTokens: 256, OutputTokens: 128,
			ThinkSeconds: 2, Reference: "chat sessions, history grows each turn", Seed: 4}, Rates: []float64{1.3}},
		{Workload: WorkloadSpec{Name: "random", Kind: "random", Groups: 320, PerGroup: 1, QuestionTokens: 1024, OutputTokens: 256,
			Reference: "no sharing (control)", Seed: 5}, Rates: []float64{1.0}},
	}
	plans = keepNamed(plans, "BENCH_WORKLOADS", func(p QualityPlan) string { return p.Workload.Name }) // development aid
	if r := os.Getenv("BENCH_RATES"); r != "" {
		var rates []float64
		for _, f := range strings.Split(r, ",") {
			if v, err := strconv.ParseFloat(f, 64); err == nil {
				rates = append(rates, v)
			}
		}
		for i := range plans {
			plans[i].Rates = rates
		}
	}
	if quick {
		plans = []QualityPlan{
			{Workload: WorkloadSpec{Name: "prefix-high", Kind: "prefix", Groups: 8, PerGroup: 4, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 32,
				Reference: "256×16, 2048/256/256 (high cache), tiny", Seed: 1}, Rates: []float64{1.0}},
		}
	}
	return plans
}

func qualityParams(quick bool) QualityParams {
	p := QualityParams{
		Engines:   8,
		Model:     qualityModel(),
		Rho:       0.5,
		TimeScale: 2,
		MaxPark:   60,
		// Wall time: the gateway polls real engines.
		PollInterval: 250 * time.Millisecond,
		// Quiet runs measure 0.95 to 1.08; contended ones 1.13 to 1.8.
		LagThreshold: 1.12,
		MaxRetries:   10,
		RetryWindow:  18 * 60,
		Plans:        qualityWorkloads(quick),
		Policies:     qualityPolicies(),
	}
	if v, err := strconv.ParseFloat(os.Getenv("BENCH_TIMESCALE"), 64); err == nil && v > 0 {
		p.TimeScale = v
	}
	// BENCH_QUALITY_TOKENIZER=qwen3 runs the engines on a real tokenizer
	// and adds llm-local; the workloads' token counts are then the word
	// tokenizer's (a word is one to a few real tokens).
	if p.Tokenizer = os.Getenv("BENCH_QUALITY_TOKENIZER"); p.Tokenizer == "" {
		p.Policies = slices.DeleteFunc(p.Policies, func(s PolicySpec) bool { return s.LocalTokenizer })
	}
	p.Policies = keepNamed(p.Policies, "BENCH_POLICIES", func(s PolicySpec) string { return s.Name })
	if quick {
		p.Engines = 4
		p.TimeScale = 4
	}
	return p
}

func fleetParams(quick bool) FleetParams {
	p := FleetParams{
		Sizes:    []int{8, 64, 256},
		Requests: 100000,
		Workload: WorkloadSpec{Name: "prefix-high", Kind: "prefix", SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 256,
			Reference: "256×16, 2048/256/256 (high cache)"},
		GroupsPerEngine: 6,
		Model:           simModel(),
		Rho:             0.5,
		PollInterval:    0.25,
		KVLimit:         0.9,
		MaxPark:         60,
		QueueSize:       1024,
		// At 1× the no-hit capacity round_robin is saturated; at 1.4× and
		// 1.5× so is everything without cache hits, and only admission that
		// keeps requests with their prefix holders serves the load (issue
		// 12); the -queue2x variant is the old workaround.
		Variants: []FleetVariant{
			{Name: "llm", Policy: "llm", Load: 1},
			{Name: "least_conn", Policy: "least_conn", Load: 1},
			{Name: "round_robin", Policy: "round_robin", Load: 1},
			{Name: "least_conn-queue2x", Policy: "least_conn", Load: 1, InflightX: 2},
			{Name: "llm@1.4", Policy: "llm", Load: 1.4},
			{Name: "llm-queue2x@1.4", Policy: "llm", Load: 1.4, InflightX: 2},
			{Name: "least_conn@1.4", Policy: "least_conn", Load: 1.4},
			{Name: "round_robin@1.4", Policy: "round_robin", Load: 1.4},
			{Name: "llm@1.5", Policy: "llm", Load: 1.5},
			{Name: "least_conn@1.5", Policy: "least_conn", Load: 1.5},
			{Name: "round_robin@1.5", Policy: "round_robin", Load: 1.5},
		},
		Seed: 11,
		Bursts: &FleetBurstPlan{Engines: 8, Size: 16, Window: 0.05, Load: 0.8, Requests: 4800,
			Workload: WorkloadSpec{Name: "burst", Kind: "prefix", SystemTokens: 4096, QuestionTokens: 128, OutputTokens: 64,
				Reference: "bursts of 16 within 50 ms, a new prefix each"},
			Variants: []FleetBurstVariant{
				{Name: "llm", Policy: "llm"},
				{Name: "llm-nospec", Policy: "llm", SpeculativeOff: true},
				{Name: "least_conn", Policy: "least_conn"},
				{Name: "round_robin", Policy: "round_robin"},
			}},
	}
	p.Scenarios = fleetScenarios()
	p.CPUTier = cpuTierPlan()
	p.ScenarioModel = model32B()
	p.ScenarioModel.TokenScale = 0 // the simulation streams nothing
	if v, err := strconv.Atoi(os.Getenv("BENCH_FLEET_REQUESTS")); err == nil && v > 0 {
		p.Requests = v
	}
	// Development aids: BENCH_FLEET_SIZES and BENCH_FLEET_VARIANTS narrow
	// a run (comma-separated sizes, variant names).
	if v := os.Getenv("BENCH_FLEET_SIZES"); v != "" {
		var sizes []int
		for _, f := range strings.Split(v, ",") {
			if n, err := strconv.Atoi(f); err == nil && n > 0 {
				sizes = append(sizes, n)
			}
		}
		p.Sizes = sizes
	}
	p.Variants = keepNamed(p.Variants, "BENCH_FLEET_VARIANTS", func(v FleetVariant) string { return v.Name })
	if quick {
		p.Sizes = []int{8, 64}
		p.Requests = 5000
		p.Bursts.Requests = 800
		for i := range p.Scenarios {
			p.Scenarios[i].Requests = 600
		}
		p.CPUTier.Requests = 600
	}
	return p
}

// gateways is the scenario of g Caddy instances sharing the fleet,
// active-active, each subscribed to every engine, clients spread across
// them; g = 1 is the reference.
func gateways(g int) FleetScenario {
	return FleetScenario{Name: fmt.Sprintf("gateways-%d", g), Gateways: g,
		Desc:    fmt.Sprintf("prefix-high's prompts (2048/256/256) in 64 groups, at 1.2× the no-hit capacity, through %d gateway(s): each gateway's approximate tree sees only its share of the traffic, while every gateway's KV index sees every engine's events.", g),
		Engines: 8, Rho: 0.5, Load: 1.2, Requests: 4000,
		Workload: WorkloadSpec{Name: "gateways", Kind: "prefix", Groups: 64, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 256}}
}

// cpuTierPlan is the fleet section's cpu-tier scenario (issue 40): 125
// groups of prefix-high's prompts, 24 requests each, on GPU caches at the
// simulation's floor (1.25 × a full batch's blocks), so that the prefixes
// fit an idle engine (0.62 of its cache) but a busy engine's running
// requests evict them; a CPU tier half each GPU's size; at 0.8 × the
// no-hit capacity. With 250 groups filling 1.2 × the GPU caches instead,
// more than a tenth of the requests miss in both tiers and TTFT p90 is a
// full miss's prefill whatever the routing (BENCHMARKS.md gives both).
func cpuTierPlan() *FleetTierPlan {
	return &FleetTierPlan{Name: "cpu-tier", Engines: 8, Rho: 0.8, CPUShare: 0.5, Load: 0.8, Requests: 3000,
		Workload: WorkloadSpec{Name: "cpu-tier", Kind: "prefix", Groups: 125, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 256}}
}

// fleetScenarios are the fleet section's scenarios where only the engines
// know what they hold (issue 13), on 8 engines at 1× the no-hit capacity
// (about where round_robin saturates).
func fleetScenarios() []FleetScenario {
	return []FleetScenario{
		{Name: "kv-pressure", Desc: "llm-d's shape (150×5, 6000/1200/1000) in 160 groups, so that the resident set fills ≈ 0.75 of the fleet's KV cache (sized for 1.25 × a full batch of these requests) and engines evict what the approximate tree still believes they hold.",
			Engines: 8, Rho: 0.75, Load: 1, Requests: 4000,
			Workload: WorkloadSpec{Name: "kv-pressure", Kind: "prefix", Groups: 160, SystemTokens: 6000, QuestionTokens: 1200, OutputTokens: 1000}},
		{Name: "bypass", Desc: "prefix-high's prompts (2048/256/256) in 800 groups; before user traffic every group is warmed on an engine of the warmer's choosing, and 30% of the traffic goes straight to random engines — placements the gateway never made.",
			Engines: 8, Rho: 0.5, Load: 1, Requests: 4000, BypassShare: 0.3, Warm: true,
			Workload: WorkloadSpec{Name: "bypass", Kind: "prefix", Groups: 800, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 256}},
		gateways(1), gateways(2), gateways(4), gateways(16),
		{Name: "restarts", Desc: "prefix-high's prompts in 64 groups; an engine restarts every 5 s in turn (each every 40 s), losing its cache and what runs on it (those requests fail and are not retried).",
			Engines: 8, Rho: 0.5, Load: 1, Requests: 4000, RestartEvery: 5,
			Workload: WorkloadSpec{Name: "restarts", Kind: "prefix", Groups: 64, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 256}},
	}
}

func overheadParams(quick bool) OverheadParams {
	p := OverheadParams{
		Engines: 4, Concurrency: 16, Phase: 5, Rounds: 3, Warmup: 2, TimeScale: 1000, SerialPhase: 2,
		Bodies: []OverheadBody{
			{Name: "small", PromptTokens: 32, MaxTokens: 4, Bases: 64},
			{Name: "8k", PromptTokens: 8192, MaxTokens: 4, Bases: 8},
			// Real prompts' text: JSON escapes it every few bytes.
			{Name: "8k-doc", PromptTokens: 8192, MaxTokens: 4, Bases: 8, Text: "doc"},
		},
		// A real vocabulary, so that llm-local measures the local
		// tokenizer on a real model's files; BENCH_TOKENIZER=word runs on
		// the simulator's word tokenizer without llm-local.
		Tokenizer: "qwen3",
	}
	if v := os.Getenv("BENCH_TOKENIZER"); v == "word" {
		p.Tokenizer = ""
	} else if v != "" {
		p.Tokenizer = v
	}
	p.Before = os.Getenv("BENCH_BEFORE_CADDY")
	p.Bodies = keepNamed(p.Bodies, "BENCH_OVERHEAD_BODIES", func(b OverheadBody) string { return b.Name }) // development aid
	if v, err := strconv.Atoi(os.Getenv("BENCH_OVERHEAD_ROUNDS")); err == nil && v > 0 {
		// More rounds for a before/after on a machine whose speed drifts.
		p.Rounds = v
	}
	if quick {
		p.Phase, p.Rounds, p.Warmup, p.SerialPhase = 1, 1, 0.5, 0.5
	}
	return p
}

// qualityModel is the simulated engine of the routing-quality runs:
// vllmsim's defaults with every streamed token standing for 4.
func qualityModel() EngineModel {
	m := simModel()
	m.TokenScale = 4
	return m
}

// soakDuration is the soak's length in a plain or a -quick run: 10
// minutes, as the reliability issue asks, or 1 minute.
func soakDuration(quick bool) time.Duration {
	if quick {
		return time.Minute
	}
	return 10 * time.Minute
}

// soakParams is the soak: caddymodule's TestReliabilitySoak for
// soakDuration. BENCH_SOAK (a Go duration) overrides the length, for
// development.
func soakParams(quick bool) (SoakParams, error) {
	p := SoakParams{Duration: soakDuration(quick), Test: "TestReliabilitySoak", Package: "./caddymodule"}
	if v := os.Getenv("BENCH_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return p, fmt.Errorf("BENCH_SOAK=%q: want a positive Go duration such as 90s", v)
		}
		p.Duration = d
	}
	return p, nil
}

// keepNamed keeps the items whose name is in the comma-separated list in
// the environment variable env, or all of them when it is unset: the
// development aids that narrow a run.
func keepNamed[T any](items []T, env string, name func(T) string) []T {
	list := os.Getenv(env)
	if list == "" {
		return items
	}
	var keep []T
	for _, it := range items {
		if strings.Contains(","+list+",", ","+name(it)+",") {
			keep = append(keep, it)
		}
	}
	return keep
}

// model32B is the scenarios' engine: a 32B dense model on one H100-class
// GPU (derivation in scenarioModelNote), every streamed token standing
// for 4 as in the quality runs.
func model32B() EngineModel {
	return EngineModel{MaxNumSeqs: 16, BlockSize: 16, PrefillTokensPerSec: 7000, DecodeStepSeconds: 0.020, MaxBatchedTokens: 8192, TokenScale: 4}
}

// scenarioModelNote states the scenarios' cost model and where its
// numbers come from, for the report.
const scenarioModelNote = "**Cost model** (issue 13: prefill must dominate where it does on real engines). The engines model a 32B dense model on one H100 SXM: **prefill 7,000 uncached tokens/s, decode step 20 ms, 8,192-token steps (chunked prefill)**. A step lasts the decode step plus its prefill chunk's tokens ÷ the prefill rate, so a step that carries a long prompt's chunk stalls every running sequence's next token for that long — a 7,200-token uncached prompt costs 1.03 s of prefill, an 8,192-token chunk 1.19 s. Where the numbers come from: Qwen3-32B's `config.json` (64 layers, hidden 5120, 64 query heads and 8 KV heads of 128, MLP 25600; 32.8 B parameters) gives ≈ 64 GFLOP per token for the weights (2 × parameters) plus ≈ 7.5 GFLOP for attention at a 7,200-token prompt's mean context (4 × 64 layers × 8,192 × 3,600); NVIDIA's H100 SXM datasheet gives 989 TFLOP/s dense BF16 and 3.35 TB/s of HBM; at 50% of peak in prefill that is ≈ 6,900 tokens/s, and reading the 65.6 GB of weights once per decode step takes 19.6 ms (the KV reads of a full batch, not modelled, would add a few ms). vLLM's default `max_num_batched_tokens` for its OpenAI server on GPUs of 70 GiB or more is 8,192 (`vllm/engine/arg_utils.py`). Two departures, for the 2-core host: `max_num_seqs` is 16 (8 in kv-pressure, to keep its run at a few hundred requests), not vLLM's default, and the KV cache is sized by the workload's ρ rule, not by the GPU's memory."

// scenarioParams is the scenarios section (issue 13): real Caddy in
// front of 8 engines of the 32B cost model, each scenario against the
// approximate tier and Caddy's own policies, fresh caches per run.
func scenarioParams(quick bool) QualityParams {
	p := qualityParams(quick)
	p.Model = model32B()
	pols := map[string]PolicySpec{}
	for _, pol := range qualityPolicies() {
		pols[pol.Name] = pol
	}
	nospec := pols["llm"]
	nospec.Name, nospec.AppBody, nospec.Desc = "llm-nospec", "speculative_ttl 0", "lb_policy llm, KV events, speculative_ttl 0 (no speculative entries)"
	textKeys := pols["llm"]
	textKeys.Name, textKeys.TextKeys, textKeys.Desc = "llm-textkeys", true, "lb_policy llm, KV events, no image token id configured (prompts with images keyed as text)"
	dp := pols["llm"]
	dp.Name, dp.DataParallel, dp.Desc = dpPolicy, true, "lb_policy llm, KV events, in front of one data-parallel server whose ranks are the fleet's engines (`data_parallel_size`, the rank in `X-data-parallel-rank`)"
	p.Policies = []PolicySpec{pols["llm"], pols["llm-approx"], nospec, textKeys, dp, pols["least_conn"], pols["round_robin"]}
	p.Policies = keepNamed(p.Policies, "BENCH_POLICIES", func(s PolicySpec) string { return s.Name })
	p.Plans = scenarioPlans()
	p.Plans = keepNamed(p.Plans, "BENCH_SCENARIOS", func(q QualityPlan) string { return q.Workload.Name }) // development aid
	if quick {
		p.Engines, p.TimeScale = 4, 4
		p.Plans = []QualityPlan{{Workload: WorkloadSpec{Name: "gateways-2", Kind: "prefix", Groups: 8, PerGroup: 4, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 32, Seed: 21},
			Rates: []float64{1}, Scenario: &ScenarioOptions{Desc: "tiny", Gateways: 2, BypassShare: 0.3, Warm: true, RestartEvery: 2, Policies: []string{"llm", "llm-approx"}}},
			{Workload: WorkloadSpec{Name: "burst", Kind: "burst", Groups: 3, PerGroup: 4, SystemTokens: 512, QuestionTokens: 32, OutputTokens: 16, Seed: 25},
				Rates: []float64{0.8}, Scenario: &ScenarioOptions{Desc: "tiny", BurstSize: 4, BurstWindow: 0.05, Policies: []string{"llm"}}},
			lateJoinPlan(WorkloadSpec{Name: "late-join", Kind: "prefix", Groups: 2, PerGroup: 8, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 4, Seed: 26},
				LateJoinOptions{WarmPerGroup: 2, Compared: 12}, ""),
			tinyMultiModelPlan(), tinyImagesPlan(), tinyDPRanksPlan()}
	}
	return p
}

// The policies every scenario compares.
var fourPolicies = []string{"llm", "llm-approx", "least_conn", "round_robin"}

// prefix2048 is prefix-high's prompts in 48 groups of 6: the shape of
// every scenario but kv-pressure and burst.
func prefix2048(name string, seed uint64) WorkloadSpec {
	return WorkloadSpec{Name: name, Kind: "prefix", Groups: 48, PerGroup: 6, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 256, Reference: "256×16, 2048/256/256", Seed: seed}
}

// gatewaysPlan is the fleet shared by g Caddy instances, at and past
// round_robin's saturation.
func gatewaysPlan(g int, policies []string) QualityPlan {
	return QualityPlan{Workload: prefix2048(fmt.Sprintf("gateways-%d", g), 30+uint64(g)), Rates: []float64{1, 1.3},
		Scenario: &ScenarioOptions{Gateways: g, Policies: policies,
			Desc: fmt.Sprintf("the fleet shared by %d Caddy instances, active-active, sessions spread across them in turn: each gateway's approximate tree sees only its share of the traffic, while every gateway's KV index sees every engine's events.", g)}}
}

func scenarioPlans() []QualityPlan {
	kv := model32B()
	kv.MaxNumSeqs = 8
	return []QualityPlan{
		{Workload: WorkloadSpec{Name: "kv-pressure", Kind: "prefix", Groups: 82, PerGroup: 5, SystemTokens: 6000, QuestionTokens: 1200, OutputTokens: 1000, Reference: "150×5, 6000/1200/1000", Seed: 22},
			Rates: []float64{0.7, 1, 1.3},
			Scenario: &ScenarioOptions{Rho: 0.75, Model: &kv, TimeScale: 4, Policies: fourPolicies,
				Why:  "with 5 requests per group at most 4 in 5 can hit, and then only the 6000-token system prompt of 7200, so no router gets above 4/5 × 6000/7200 = 66.7%; precise routing comes within a few points of it at 0.7× and 1×, and the approximate tree, which forgets a prefix only by its own TTL and size bound, is wrong only for the groups an engine evicted, so it trails by less than the 15 points the issue asks. Each request also decodes 1000 tokens with 8 sequences per engine, so past 1× every policy waits for decode slots, which no routing shortens.",
				Desc: "llm-d's shape in 82 groups, so that the resident set fills ≈ 0.75 of the fleet's KV cache and engines evict what the approximate tree still believes they hold; 4× faster than real time (the runs are long)."}},
		gatewaysPlan(1, []string{"llm", "llm-approx"}),
		gatewaysPlan(2, fourPolicies),
		gatewaysPlan(4, fourPolicies),
		{Workload: prefix2048("bypass", 23), Rates: []float64{1},
			Scenario: &ScenarioOptions{BypassShare: 0.3, Warm: true, Policies: fourPolicies,
				Desc: "before user traffic a cache warmer puts every group's prefix on an engine of its own choosing, not through the gateway; then 30% of the sessions go straight to random engines. Hit rate and TTFT are of the gateway's requests."}},
		{Workload: prefix2048("restarts", 24), Rates: []float64{1},
			Scenario: &ScenarioOptions{RestartEvery: 3, Policies: fourPolicies,
				Why:  "a restart wipes one engine's cache, and the next request of each of its groups misses under either tier: the approximate tree still sends it to the restarted engine, which then holds the prefix again, while the precise index sends it to wherever the prefix lives or, when nowhere, places it cold. With most groups held by one engine the two come out even; precise gains only where another engine still holds the prefix. Failed requests are those running on an engine when it restarted.",
				Desc: "an engine restarts every 3 simulated seconds, in turn (cache wiped, events reset, running requests fail and are not retried)."}},
		{Workload: WorkloadSpec{Name: "burst", Kind: "burst", Groups: 20, PerGroup: 16, SystemTokens: 4096, QuestionTokens: 128, OutputTokens: 64, Reference: "bursts of 16 within 50 ms", Seed: 25},
			Rates: []float64{0.8},
			Scenario: &ScenarioOptions{BurstSize: 16, BurstWindow: 0.05, Policies: []string{"llm", "llm-nospec", "least_conn", "round_robin"},
				Why:  "keeping a burst on one or two engines saves 14 or 15 prefills of 4096 tokens, but those engines then prefill the burst's own questions one step after another, while `round_robin` spreads the 16 over 8 engines that prefill in parallel: at this load the saved work does not yet show in TTFT.",
				Desc: "each group is a burst of 16 requests within 50 ms (bursts a Poisson process), a 4096-token prefix nobody holds yet plus 128 tokens of its own; the first request is routed before any engine has announced its blocks, so only speculative entries (`speculative_ttl`, 2 s of wall time) keep the rest with it."}},
		lateJoinPlan(WorkloadSpec{Name: "late-join", Kind: "prefix", Groups: 8, PerGroup: 30, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 4,
			Reference: "prefix-high's prompts, 4 output tokens", Seed: 26}, LateJoinOptions{WarmPerGroup: 5, Compared: 200}, lateJoinWhy),
		lateJoinPlan(WorkloadSpec{Name: "late-join-noreplay", Kind: "prefix", Groups: 8, PerGroup: 30, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 4,
			Reference: "late-join without the engines' replay endpoints", Seed: 26}, LateJoinOptions{WarmPerGroup: 5, Compared: 200, NoReplay: true}, lateJoinWhy),
		multiModelPlan(),
		imagesPlan(),
		dpRanksPlan(),
	}
}

// imagesPlan is the images scenario (issue 38): 16 distinct images, each
// asked about 12 times; a 256-token system prompt shared by every
// request, then the image, 1,296 placeholder tokens as Qwen2.5-VL makes
// of a 1008×1008 image ((1008 ÷ 28)²), and a question of 128 tokens of
// its own; every fourth image is sent with a uuid.
func imagesPlan() QualityPlan {
	w := WorkloadSpec{Name: "images", Kind: "images", Groups: 16, PerGroup: 12, SystemTokens: 256, ImageTokens: 1296, QuestionTokens: 128, OutputTokens: 128,
		UUIDEvery: 4, Reference: "16 images × 12 questions, 256/1296 image/128/128", Seed: 28}
	return QualityPlan{Workload: w, Rates: []float64{1, 1.5},
		Scenario: &ScenarioOptions{Policies: []string{"llm", "llm-textkeys", "least_conn", "round_robin"}, Why: imagesWhy,
			Desc: "chat prompts that each carry a base64 PNG (`data:` URL, about 4 KiB) before their question: 16 distinct images, each asked about by 12 requests, a quarter of the images sent with a `uuid`, the rest keyed by their bytes. " +
				"The engines are vision models shaped like Qwen2-VL (`vllmsim`'s `ImageTokens`): each image expands to 1,296 `<|image_pad|>` tokens whose blocks carry the image's hash as vLLM's do. " +
				"`llm`'s gateway is configured with the model's image token id (`tokenizer * remote 151655`), so its block keys carry the images too; `llm-textkeys` is the same gateway without it, which matches a prompt only up to the block holding its image."}}
}

// tinyImagesPlan is the images scenario of the -quick run: 2 images (one
// with a uuid) asked about 3 times each; llm against round_robin.
func tinyImagesPlan() QualityPlan {
	w := WorkloadSpec{Name: "images", Kind: "images", Groups: 2, PerGroup: 3, SystemTokens: 64, ImageTokens: 256, QuestionTokens: 32, OutputTokens: 16, UUIDEvery: 2, Seed: 28}
	return QualityPlan{Workload: w, Rates: []float64{1}, Scenario: &ScenarioOptions{Desc: "tiny", Policies: []string{"llm", "round_robin"}}}
}

// imagesWhy bounds the images scenario's figures from its shape.
const imagesWhy = "every prompt is 1,696 tokens, 106 full blocks: 256 words of system prompt and the chat template's tokens, then the image's 1,296 placeholders from block 16 to block 97, then the 128-word question. " +
	"The system prompt is the same in every request, so any engine that served one holds it; what routing can add is the image. Each image's first request misses past the system prompt, and a repeat can hit 81 of its 90 blocks past the image's start (the question that follows is its own), so no policy's share of those blocks can pass 11/12 × 81/90 = 82.5%. " +
	"The 16 images fit in every engine's cache (ρ 0.09), so a policy blind to the image pays one cold prefill of 1,296 image tokens per engine it sends the image to — up to 8 per image against 1. " +
	"Keyed as text, a prompt matches every engine that holds the system prompt up to the block holding its image, so `llm-textkeys` ties them and places on load, spreading an image's requests as `round_robin` does."

// loraAdapters are n adapter names on top of base.
func loraAdapters(base string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-lora-%d", base, i+1)
	}
	return out
}

// multiModelPlan is the multimodel scenario (issue 37): 3 engines serve
// model-a and 6 LoRA adapters on it (2 per batch, loading one costs what
// 350 prompt tokens of prefill do), 2 engines serve model-b; prefix-high's
// prompts in 60 groups of 6: 12 groups ask for model-a, 4 for each
// adapter, 24 for model-b, so that each pool gets its engines' share of
// the load (60% and 40%) at 1× cap₀.
func multiModelPlan() QualityPlan {
	mf := &ModelFleet{MaxLoRAs: 2, LoRALoadSeconds: 0.05, Pools: []ModelPool{
		{Model: "model-a", Engines: 3, Adapters: loraAdapters("model-a", 6)},
		{Model: "model-b", Engines: 2},
	}}
	models := []ModelGroups{{Model: "model-a", Groups: 12}}
	for _, a := range mf.Pools[0].Adapters {
		models = append(models, ModelGroups{Model: a, Groups: 4})
	}
	models = append(models, ModelGroups{Model: "model-b", Groups: 24})
	w := prefix2048("multimodel", 27)
	w.Groups, w.Models = 60, models
	return QualityPlan{Workload: w, Rates: []float64{1},
		Scenario: &ScenarioOptions{Models: mf, Policies: []string{"llm", "least_conn", "round_robin"}, Why: multiModelWhy,
			Desc: "two base models on disjoint engines — " + mf.describe() + ", `max_loras` 2, loading an adapter into a slot 50 ms (350 prompt tokens of prefill) — " +
				"and requests for `model-a` (20%), its 6 adapters (40%, 4 groups each) and `model-b` (40%), each group's sessions asking for one model. " +
				"Every policy runs behind the same Caddyfile: `llm_admission`, upstreams from `dynamic llm` (all five engines), only `lb_policy` differs. " +
				"The gateway learns each engine's models from its `/v1/models`."}}
}

// tinyMultiModelPlan is the multimodel scenario of the -quick run: 2
// engines serve model-a and 2 adapters, 1 serves model-b; a group per
// model of 3 requests each; llm against least_conn.
func tinyMultiModelPlan() QualityPlan {
	mf := &ModelFleet{MaxLoRAs: 1, LoRALoadSeconds: 0.05, Pools: []ModelPool{
		{Model: "model-a", Engines: 2, Adapters: loraAdapters("model-a", 2)},
		{Model: "model-b", Engines: 1},
	}}
	w := WorkloadSpec{Name: "multimodel", Kind: "prefix", Groups: 4, PerGroup: 3, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 32, Seed: 27,
		Models: []ModelGroups{{Model: "model-a", Groups: 1}, {Model: "model-a-lora-1", Groups: 1}, {Model: "model-a-lora-2", Groups: 1}, {Model: "model-b", Groups: 1}}}
	return QualityPlan{Workload: w, Rates: []float64{1},
		Scenario: &ScenarioOptions{Desc: "tiny", Models: mf, Policies: []string{"llm", "least_conn"}}}
}

// multiModelWhy explains the multimodel scenario's figures from its shape.
const multiModelWhy = "admission parks a request only on the engines serving its model, whatever the policy, so the three are gated alike; " +
	"`lb_policy llm` then picks among those engines, while `least_conn` and `round_robin` pick among all five, as reverse_proxy's own policies do not read the model: " +
	"a request they send to an engine that does not serve its model is answered 404 by the engine, Caddy passes it on, and the client counts it failed — " +
	"for `round_robin` 0.6 × 2/5 + 0.4 × 3/5 = 48% of the requests. Their hit rate and TTFT are of the requests that completed, on a fleet spared the ones that failed in milliseconds, which flatters them. " +
	"Each group's first request misses and the rest can hit its 2,048-token system prompt of 2,317 tokens, so no policy's hit rate passes 5/6 × 2048/2317 = 73.7%. " +
	"An adapter's requests arrive at 4/60 of 7.7 req/s, 0.51/s, and each lasts at least 256 decode steps of 20 ms: ≥ 2.6 in flight on average. " +
	"If an adapter's requests all go to one engine, one arriving finds none of its own there about e^-2.6 ≈ 7% of the time (its first always), so ≈ 90% joining their adapter is what adapter affinity can reach at this load; " +
	"spread over the 3 engines, as routing on prefixes alone does when an adapter's 4 groups land on different engines, they find their adapter about 1 − e^-0.9 ≈ 60% of the time. " +
	"The share counts only adapter requests that reached an engine serving their adapter."

// lateJoinPlan is the late-join scenario (issue 35) on workload w: each
// group's first warmPerGroup requests warm the engines through the
// gateway present from the start, at 1× cap₀; the next compared requests
// go one at a time. The answers are a few tokens long, streamed one by
// one, so that 200 requests one at a time take seconds, not minutes, and
// TTFT is the prefill.
func lateJoinPlan(w WorkloadSpec, o LateJoinOptions, why string) QualityPlan {
	m := model32B()
	m.TokenScale = 1
	o.WarmRate, o.AppBody = 1, "hash_algo sha256_cbor\nhash_seed 0"
	warmPerGroup, compared := o.WarmPerGroup, o.Compared
	replay := ""
	if o.NoReplay {
		replay = " The gateways are not given the engines' replay endpoints, so a new one cannot backfill: it learns from live events alone."
	}
	return QualityPlan{Workload: w, Scenario: &ScenarioOptions{Model: &m, Policies: []string{"llm"}, Why: why,
		LateJoin: &o,
		Desc: fmt.Sprintf("the engines are warmed through one gateway (%d requests of each of %d groups), then another gateway starts, or the only one restarts: "+
			"is the new gateway blind to the prefixes the engines already hold, and to the blocks extending them? Both gateways are asked where each of the next %d requests would go, on the same engine state (admin `POST /llm/explain`), while one of them routes it.",
			warmPerGroup, w.Groups, compared) + replay}}
}

// lateJoinWhy bounds the late-join scenario's figures from its shape.
// Each group is 8 × 30 sessions in the plan: 5 warm it up, 25 are
// compared.
const lateJoinWhy = "each prompt is 2,317 tokens (2,048 words of system prompt, 256 of question and the chat template's 13), 144 full blocks, of which the group's system prompt fills 128, so no gateway's precise hit rate can pass 128/144 = 88.9%. " +
	"Each of the 8 groups' first compared request names a prefix no event has named since the new gateway subscribed, so a gateway that learns from live events can match 192 of the 200 at most, a ratio of 0.96; only replaying the engines' event history when it subscribes could go past that. " +
	"The routed requests' engine hit rate and TTFT move much less than the precise hit rate: on an idle fleet a blind gateway's load-only pick (a tie-break on a hash of the prompt's first block, the same in every gateway with the same engines) sends a group to the engine the early gateway chose whenever that choice was a tie-break too, and the engine hits; where it lands elsewhere, that engine prefills the group cold and announces it from its first block, which any gateway chains — so a gateway routing alone pays at most one cold prefill per group. " +
	"How many groups land where the early gateway placed them depends on the ports of each case's fresh fleet, so a gateway that cannot chain orphan events scores differently from run to run in the routing cases (all groups on their holders: 0%)."

// traceParams is the trace section (-trace FILE): the fleet simulation at
// full token counts on 16 and 64 engines of section 2's 32B cost model,
// each over a compression ladder past round_robin's saturation (about 2×
// on 16 engines, from the no-hit capacity: 16 ÷ (12,035 ÷ 7,000 + 343 ×
// 0.02 ÷ 16) ≈ 7.4 req/s against the trace's 3.4), and real Caddy in front
// of 8 simulated engines on the trace's first 400 requests, prompts scaled
// down 16× (a 512-token block is 32 words, two engine blocks), engine
// clocks at 2× wall time as in section 1. BENCH_TRACE_ENGINES (comma-separated sizes) narrows the
// simulation's ladders, for development.
func traceParams(quick bool, file string) TraceParams {
	m := model32B()
	m.TokenScale = 0 // the simulation streams nothing; the Caddy replay sets it again
	p := TraceParams{
		File: file, Model: m,
		Ladders: []TraceLadder{
			{Engines: 16, Speedups: []float64{1, 1.5, 2, 2.5, 3}},
			{Engines: 64, Speedups: []float64{4, 6, 8, 10, 12}},
		},
		Policies:     []string{"llm", "least_conn", "round_robin"},
		PollInterval: 0.25, KVLimit: 0.9, MaxPark: 60, QueueSize: 4096, Seed: 21,
		Caddy: &TraceCaddyPlan{Engines: 8, Requests: 400, Scale: 16, TimeScale: 2, Speedups: []float64{0.75, 1, 1.5}},
	}
	if v := os.Getenv("BENCH_TRACE_ENGINES"); v != "" {
		p.Ladders = slices.DeleteFunc(p.Ladders, func(l TraceLadder) bool { return !slices.Contains(strings.Split(v, ","), strconv.Itoa(l.Engines)) })
	}
	if quick {
		p.Requests = 200
		p.Ladders = []TraceLadder{{Engines: 4, Speedups: []float64{1, 8}}}
		p.Caddy = &TraceCaddyPlan{Engines: 2, Requests: 24, Scale: 16, TimeScale: 8, Speedups: []float64{2}}
	}
	return p
}
