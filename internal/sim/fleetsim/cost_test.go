package fleetsim

import (
	"context"
	"os"
	"slices"
	"testing"
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
	{"prefix-low", 40, 256, 2048, 256, []float64{6, 9}},
	{"random", 1, 0, 1024, 256, []float64{8, 12}},
	{"prefix-high", 40, 2048, 256, 256, []float64{8, 12}},
}

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

// TestCostModelFigures prints TTFT p50/p90, hit rate and (for llm) the
// median relative error of the predicted time to first token for every
// cost workload and policy. It is a measuring tool, not a check: run it
// with LLMGW_COSTSIM=1 and -v.
func TestCostModelFigures(t *testing.T) {
	if os.Getenv("LLMGW_COSTSIM") == "" {
		t.Skip("set LLMGW_COSTSIM=1 to print the cost model's figures")
	}
	for _, w := range costWorkloads {
		for _, rate := range w.rates {
			for _, policy := range []string{PolicyLLM, PolicyRoundRobin, PolicyLeastConn} {
				r, err := Run(context.Background(), costParams(w.groups, w.sys, w.quest, w.output, rate, policy))
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%-11s rate %4.1f %-11s TTFT p50 %.3f p90 %.3f hit %.3f rejected %d %s", w.name, rate, policy,
					quantile(r.TTFT, 0.5), quantile(r.TTFT, 0.9), float64(r.CachedTokens)/float64(r.PromptTokens), r.Rejected, calibration(r))
			}
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
