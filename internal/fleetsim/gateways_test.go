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
