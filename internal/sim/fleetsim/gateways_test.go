package fleetsim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/llmgw/caddy-llmgw/fleet"
)

// TestGatewaysAccounted: with 4 gateways in front of the engines, every
// request completes, is rejected or fails, on every policy and with bursts
// and restarts; each gateway decides its share of the llm requests on its
// own fleet; every gateway's mirrors accept every batch; and a seed's run
// repeats.
func TestGatewaysAccounted(t *testing.T) {
	const gateways = 4
	scenarios := map[string]Params{}
	for _, policy := range []string{PolicyLLM, PolicyLeastConn, PolicyRoundRobin} {
		scenarios[policy] = smallParams(policy)
	}
	burst := smallParams(PolicyLLM)
	burst.BurstSize, burst.BurstWindow, burst.Groups = 16, 0.05, 40
	scenarios["burst"] = burst
	restart := pressureParams(PolicyLLM)
	restart.Groups, restart.KVBlocks, restart.RestartEvery = 32, 1024, 1
	scenarios["restart"] = restart
	for name, p := range scenarios {
		p.Gateways = gateways
		var decided [gateways]int
		fleets := map[*fleet.Fleet]int{}
		p.Decided = func(d Decided) error {
			if g, ok := fleets[d.Fleet]; ok && g != d.Gateway {
				return fmt.Errorf("gateway %d decided on gateway %d's fleet", d.Gateway, g)
			}
			fleets[d.Fleet] = d.Gateway
			decided[d.Gateway]++
			return nil
		}
		r := mustRun(t, p)
		if p.Policy == PolicyLLM {
			checkGatewayShares(t, name, r, decided[:])
		}
		again := mustRun(t, p)
		if again.Completed != r.Completed || again.Failed != r.Failed || again.CachedTokens != r.CachedTokens ||
			!slices.Equal(again.TTFT, r.TTFT) {
			t.Fatalf("%s: two runs of the same seed differ: %d/%d completed, %d/%d failed, %d/%d cached tokens", name,
				r.Completed, again.Completed, r.Failed, again.Failed, r.CachedTokens, again.CachedTokens)
		}
		if name == "burst" && len(r.BurstEngines) != (p.Requests+p.BurstSize-1)/p.BurstSize {
			t.Errorf("burst: %d bursts counted", len(r.BurstEngines))
		}
		if name == "restart" && (r.Failed == 0 || r.MirrorRestarts == 0 || r.MirrorRestarts > uint64(r.Restarts)) {
			t.Errorf("restart: %d failed, %d restarts, %d mirror resets (gateway 0's)", r.Failed, r.Restarts, r.MirrorRestarts)
		}
	}
}

// checkGatewayShares checks an llm run's decisions: every gateway made
// about its share (arrivals go round robin, so within a tenth of it), all
// of them are counted, and every gateway fed every batch without problem.
func checkGatewayShares(t *testing.T, name string, r Result, decided []int) {
	t.Helper()
	total := 0
	for g, n := range decided {
		total += n
		if share := float64(n) / float64(len(r.DecisionNs)) * float64(len(decided)); share < 0.9 || share > 1.1 {
			t.Errorf("%s: gateway %d made %d of %d decisions", name, g, n, len(r.DecisionNs))
		}
	}
	if total != len(r.DecisionNs) || total < r.Completed {
		t.Errorf("%s: %d decisions seen, %d made, %d completed", name, total, len(r.DecisionNs), r.Completed)
	}
	if r.MirrorProblems != 0 || r.EventBatches == 0 || r.EventBatches%len(decided) != 0 {
		t.Errorf("%s: mirror problems %d, %d batches fed (want a multiple of %d gateways)", name, r.MirrorProblems, r.EventBatches, len(decided))
	}
}

// TestGatewaysHitRate is issue 13's gateways-N figure: on pressureParams'
// shared-prefix workload (48 groups whose prompts fit the fleet but not
// one engine) at a moderate 45 req/s, G gateways share the engines. Each
// gateway's index mirrors every engine, so precise routing keeps its hit
// rate: with 4 gateways at least 95% of one gateway's. The approximate
// tree of each gateway knows only its share of the traffic, so it loses
// hits as G grows.
//
// At pressureParams' own 60 req/s, logged too, precise routing with 4
// gateways falls below the 95% (0.88 at seed 3): about three times as many
// of its decisions fall back to load alone because the cached engine looks
// too loaded (161 load_only/overridden_by_load against 49), presumably as
// each gateway counts only its own requests in flight between scrapes, so
// gateways reading the same stale gauges send to the same engines. That is
// reported, not asserted.
func TestGatewaysHitRate(t *testing.T) {
	hit := func(rate float64, gateways int, approximate bool) float64 {
		p := pressureParams(PolicyLLM)
		p.Rate, p.Gateways, p.Approximate = rate, gateways, approximate
		return hitRate(mustRun(t, p))
	}
	precise, approx := map[int]float64{}, map[int]float64{}
	for _, g := range []int{1, 2, 4, 16} {
		precise[g], approx[g] = hit(45, g, false), hit(45, g, true)
		t.Logf("45 req/s, gateways %2d: hit rate precise %.1f%% (%.3f of one gateway's), approximate %.1f%% (%.3f)",
			g, 100*precise[g], precise[g]/precise[1], 100*approx[g], approx[g]/approx[1])
	}
	heavy1, heavy4 := hit(60, 1, false), hit(60, 4, false)
	t.Logf("60 req/s: hit rate precise %.1f%% with 1 gateway, %.1f%% with 4 (%.3f)", 100*heavy1, 100*heavy4, heavy4/heavy1)
	if precise[4] < 0.95*precise[1] {
		t.Errorf("precise hit rate %.1f%% with 4 gateways, %.1f%% with one: want at least 95%% of it", 100*precise[4], 100*precise[1])
	}
	if approx[4] >= approx[1] || precise[4]-approx[4] <= precise[1]-approx[1] {
		t.Errorf("approximate %.1f%% with 4 gateways, %.1f%% with one: want it to lose more than precise (%.1f%%, %.1f%%)",
			100*approx[4], 100*approx[1], 100*precise[4], 100*precise[1])
	}
}
