package fleetsim

import (
	"context"
	"os"
	"slices"
	"testing"
)

// lightRuns are the light loads (0.5 arrivals per second over 4 engines:
// about one request at a time) of cost workloads where engines starved
// before an engine's own speeds faded into its peers' and it borrowed
// their mean prompt when it had none: random traffic sent one engine 1
// of 300 requests, with restarts two engines 1 and 3, and prefix-high
// (seed 8) one engine 12.
var lightRuns = []struct {
	name     string
	workload int     // index into costWorkloads
	restart  float64 // Params.RestartEvery
	seed     uint64
}{
	{"random", 1, 0, 7},
	{"random, restarts", 1, 20, 7},
	{"prefix-high", 2, 0, 8},
}

// TestLightLoadReachesEveryEngine: at light load every engine of a fleet
// of alike engines gets requests. Each request goes to the engine
// predicted fastest, and only traffic refreshes an engine's speeds, so an
// engine whose figures read a little worse than its peers' (or lack the
// mean prompt that corrects its rate) must still be tried, not left idle.
func TestLightLoadReachesEveryEngine(t *testing.T) {
	for _, lr := range lightRuns {
		t.Run(lr.name, func(t *testing.T) {
			w := costWorkloads[lr.workload]
			p := costParams(w.groups, w.sys, w.quest, w.output, 0.5, PolicyLLM)
			p.Requests, p.RestartEvery, p.Seed = 300, lr.restart, lr.seed
			per := map[string]int{}
			p.Decided = func(d Decided) error { per[d.Chosen]++; return nil }
			if _, err := Run(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			counts := make([]int, 0, p.Engines)
			for _, n := range per {
				counts = append(counts, n)
			}
			slices.Sort(counts)
			// Prefix affinity may favour some engines; none should get
			// less than a quarter of its even share.
			if len(counts) < p.Engines || counts[0] < p.Requests/(4*p.Engines) {
				t.Fatalf("requests per engine %v (of %d engines), want each at least %d", counts, p.Engines, p.Requests/(4*p.Engines))
			}
		})
	}
}

// TestLightLoadFigures prints TTFT p50/p90, hit rate and the requests per
// engine of lb_policy llm at light loads for every cost workload, with
// and without engine restarts. A measuring tool: run it with
// LLMGW_LIGHTSIM=1 and -v.
func TestLightLoadFigures(t *testing.T) {
	if os.Getenv("LLMGW_LIGHTSIM") == "" {
		t.Skip("set LLMGW_LIGHTSIM=1 to print the light-load figures")
	}
	for _, w := range costWorkloads {
		for _, rate := range []float64{0.5, 2, 4} {
			for _, restart := range []float64{0, 20} {
				var p50, p90, hit float64
				var spread [][]int
				for _, seed := range costSeeds {
					p := costParams(w.groups, w.sys, w.quest, w.output, rate, PolicyLLM)
					p.Seed, p.Requests, p.RestartEvery = seed, 300, restart
					per := map[string]int{}
					p.Decided = func(d Decided) error { per[d.Chosen]++; return nil }
					r, err := Run(context.Background(), p)
					if err != nil {
						t.Fatal(err)
					}
					n := float64(len(costSeeds))
					p50 += quantile(r.TTFT, 0.5) / n
					p90 += quantile(r.TTFT, 0.9) / n
					hit += float64(r.CachedTokens) / float64(r.PromptTokens) / n
					counts := make([]int, p.Engines)
					i := 0
					for _, c := range per {
						counts[i] = c
						i++
					}
					slices.Sort(counts)
					spread = append(spread, counts)
				}
				t.Logf("%-11s rate %4.1f restart %2.0f TTFT p50 %.3f p90 %.3f hit %.3f picks %v", w.name, rate, restart, p50, p90, hit, spread)
			}
		}
	}
}
