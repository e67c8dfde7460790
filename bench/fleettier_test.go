package main

import (
	"context"
	"strings"
	"testing"
)

// TestCPUTierScenario runs a tiny cpu-tier scenario: every variant
// completes its requests; the engines with a tier offload blocks and the
// gateway's index ends holding exactly their CPU blocks; tier credits
// (routed by Fleet.Route) load prefixes from the tier; and the report
// renders a row per variant.
func TestCPUTierScenario(t *testing.T) {
	p := fleetParams(true)
	p.CPUTier.Engines, p.CPUTier.Requests, p.CPUTier.Workload.Groups = 4, 300, 120
	runs, err := runCPUTier(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != len(tierVariants) {
		t.Fatalf("%d runs, want %d", len(runs), len(tierVariants))
	}
	for _, r := range runs {
		if r.Completed+r.Rejected != p.CPUTier.Requests || r.TTFT.N == 0 {
			t.Errorf("%s: %d completed + %d rejected of %d", r.Variant, r.Completed, r.Rejected, p.CPUTier.Requests)
		}
		tier := r.Variant != "llm-no-tier"
		if tier != (r.Offloaded > 0) || tier != (r.CPUBlocks > 0) {
			t.Errorf("%s: %d CPU blocks per engine, %d offloaded", r.Variant, r.CPUBlocks, r.Offloaded)
		}
		if r.Variant != "round_robin" && (r.IndexCPUBlocks != r.EngineCPUBlocks || r.TierUnknown != 0) {
			t.Errorf("%s: index holds %d CPU blocks, engines %d, %d unknown", r.Variant, r.IndexCPUBlocks, r.EngineCPUBlocks, r.TierUnknown)
		}
		if r.Variant == "llm-route" && r.CPUHitRate == 0 {
			t.Errorf("llm-route: no prefix loaded from a CPU tier")
		}
	}
	var b strings.Builder
	renderCPUTier(&b, p, runs)
	for _, v := range tierVariants {
		if !strings.Contains(b.String(), "| `"+v.name+"` |") {
			t.Errorf("report lacks %s's row:\n%s", v.name, b.String())
		}
	}
}
