package fleetsim

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/llmgw/caddy-llmgw/routing"
)

// costWorkloads are issue 39's shapes for comparing the routing cost
// model against Caddy's policies: long unique prompts with little sharing
// (prefix-low), no sharing at all (random), and long shared prefixes
// (prefix-high), at the rates (arrivals per second over 4 engines) given.
var costWorkloads = []struct {
	name                       string
	groups, sys, quest, output int
	rates                      []float64
}{
	{"prefix-low", 40, 256, 2048, 256, []float64{6, 7.5}},
	{"random", 1, 0, 1024, 256, []float64{8, 10}},
	{"prefix-high", 40, 2048, 256, 256, []float64{8, 10.4}},
}

// costSeeds are the runs averaged per figure.
var costSeeds = []uint64{7, 8, 9}

// costParams is one run of a cost workload: 4 engines of section 3's model.
func costParams(groups, sys, quest, output int, rate float64, policy string) Params {
	return Params{
		Engines: 4, KVBlocks: 4096,
		Model:  Model{MaxNumSeqs: 16, BlockSize: 16, PrefillTokensPerSec: 10000, DecodeStepSeconds: 0.02, MaxBatchedTokens: 8192},
		Groups: groups, SystemTokens: sys, QuestionTokens: quest, OutputTokens: output,
		Requests: 1200, Rate: rate, Policy: policy, MaxInflight: 16,
		KVLimit: 0.9, PollInterval: 0.25, MaxPark: 60, QueueSize: 1024, Seed: 7,
	}
}

// costVariants are lb_policy llm's configurations compared: the defaults
// and each rule switched off, to see which still earn their keep.
var costVariants = []struct {
	name string
	cfg  routing.Config
}{
	{"llm", routing.Config{}},
	{"llm-nobound", routing.Config{Epsilon: -1, ImbalanceThreshold: -1}},
	{"llm-nowork", routing.Config{WorkWeight: -1}},
	{"llm-notie", routing.Config{TieTokens: -1}},
}

// TestCostModelFigures prints TTFT p50/p90, hit rate and (for llm) the
// median relative error of the predicted time to first token for every
// cost workload, llm variant and Caddy policy. It is a measuring tool,
// not a check: run it with LLMGW_COSTSIM=1 and -v (LLMGW_COSTSIM=all also
// runs the variants).
func TestCostModelFigures(t *testing.T) {
	mode := os.Getenv("LLMGW_COSTSIM")
	if mode == "" {
		t.Skip("set LLMGW_COSTSIM=1 to print the cost model's figures")
	}
	variants := costVariants[:1]
	if mode == "all" {
		variants = costVariants
	}
	for _, w := range costWorkloads {
		for _, rate := range w.rates {
			runOne := func(name, policy string, cfg routing.Config) {
				// Three seeds: one run's p90 moves by tens of percent.
				var p50, p90, hit float64
				var cal []string
				for _, seed := range costSeeds {
					p := costParams(w.groups, w.sys, w.quest, w.output, rate, policy)
					p.Cost, p.Seed = cfg, seed
					r, err := Run(context.Background(), p)
					if err != nil {
						t.Fatal(err)
					}
					p50 += quantile(r.TTFT, 0.5) / float64(len(costSeeds))
					p90 += quantile(r.TTFT, 0.9) / float64(len(costSeeds))
					hit += float64(r.CachedTokens) / float64(r.PromptTokens) / float64(len(costSeeds))
					if c := calibration(r); c != "" {
						cal = append(cal, c)
					}
				}
				t.Logf("%-11s rate %4.1f %-12s TTFT p50 %.3f p90 %.3f hit %.3f %v", w.name, rate, name, p50, p90, hit, cal)
			}
			for _, v := range variants {
				runOne(v.name, PolicyLLM, v.cfg)
			}
			runOne(PolicyRoundRobin, PolicyRoundRobin, routing.Config{})
			runOne(PolicyLeastConn, PolicyLeastConn, routing.Config{})
		}
	}
}

// quantile is the q-quantile of xs (nearest rank); 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}
