package fleetsim

import (
	"context"
	"strings"
	"testing"
)

// hitRate is the share of the gateway's prompt tokens that were cache
// hits: requests that bypassed it are left out, as no policy chose their
// engine.
func hitRate(r Result) float64 {
	return float64(r.CachedTokens-r.BypassCachedTokens) / float64(r.PromptTokens-r.BypassPromptTokens)
}

func mustRun(t *testing.T, p Params) Result {
	t.Helper()
	r, err := Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if r.Completed+r.Rejected+r.Failed != p.Requests || r.Completed == 0 {
		t.Fatalf("%d completed + %d rejected + %d failed of %d", r.Completed, r.Rejected, r.Failed, p.Requests)
	}
	return r
}

// pressureParams is smallParams with 48 groups: their system prompts
// (768 blocks) fit the fleet's 4 × 512 blocks but not one engine, so where
// a group's requests go decides whether they hit.
func pressureParams(policy string) Params {
	p := smallParams(policy)
	p.Groups, p.KVBlocks, p.Requests = 48, 512, 1200
	return p
}

// TestApproximateTier: without KV events every decision rests on the
// approximate tree (or on load alone), and the tree still finds far more
// cache than round robin on a shared-prefix workload.
func TestApproximateTier(t *testing.T) {
	p := pressureParams(PolicyLLM)
	p.Approximate = true
	r := mustRun(t, p)
	for k, n := range r.Outcomes {
		if !strings.HasPrefix(k, "approximate/") && !strings.HasPrefix(k, "load_only/") {
			t.Errorf("%d decisions %s without KV events", n, k)
		}
	}
	if r.EventBatches != 0 || r.IndexBlocks != 0 {
		t.Errorf("%d batches fed, %d blocks indexed without KV events", r.EventBatches, r.IndexBlocks)
	}
	precise := mustRun(t, pressureParams(PolicyLLM))
	rr := mustRun(t, pressureParams(PolicyRoundRobin))
	t.Logf("hit rate: precise %.1f%%, approximate %.1f%%, round_robin %.1f%%; approximate outcomes %v",
		100*hitRate(precise), 100*hitRate(r), 100*hitRate(rr), r.Outcomes)
	if hitRate(r) < hitRate(rr)+0.2 {
		t.Errorf("approximate hit rate %.1f%%, round robin's %.1f%%: want 20 points more", 100*hitRate(r), 100*hitRate(rr))
	}
}

// TestPreciseUnderKVPressure: when the engines' caches cannot hold every
// group, they evict, and only their events say what: the approximate tree
// keeps sending groups to engines that evicted them.
func TestPreciseUnderKVPressure(t *testing.T) {
	p := pressureParams(PolicyLLM)
	p.Groups, p.KVBlocks = 32, 256 // 512 blocks of prompts, 1024 in the fleet, less what runs
	precise := mustRun(t, p)
	p.Approximate = true
	approx := mustRun(t, p)
	p.Policy, p.Approximate = PolicyRoundRobin, false
	rr := mustRun(t, p)
	t.Logf("hit rate under KV pressure: precise %.1f%%, approximate %.1f%%, round_robin %.1f%%",
		100*hitRate(precise), 100*hitRate(approx), 100*hitRate(rr))
	if hitRate(precise) < hitRate(approx)+0.1 {
		t.Errorf("precise %.1f%%, approximate %.1f%%: want 10 points more", 100*hitRate(precise), 100*hitRate(approx))
	}
}

// TestPreciseSeesBypass: other clients warmed every group on an engine of
// their own choosing and keep sending 30% of the traffic straight to
// random engines. Only the engines' events tell the gateway; its
// approximate tree knows only what it routed itself. 400 groups of about
// 3 requests each fit the fleet's caches with room to spare, so what
// separates the tiers is knowing where a group already is.
func TestPreciseSeesBypass(t *testing.T) {
	p := smallParams(PolicyLLM)
	p.Groups, p.KVBlocks, p.Requests = 400, 4096, 1200
	base := mustRun(t, p)
	p.Approximate = true
	baseApprox := mustRun(t, p)
	p.Warm, p.BypassShare = true, 0.3
	approx := mustRun(t, p)
	p.Approximate = false
	precise := mustRun(t, p)
	if again := mustRun(t, p); again.CachedTokens != precise.CachedTokens || again.Bypassed != precise.Bypassed {
		t.Fatalf("two runs of the same seed differ: %d/%d cached tokens, %d/%d bypassed",
			precise.CachedTokens, again.CachedTokens, precise.Bypassed, again.Bypassed)
	}
	p.Policy = PolicyRoundRobin
	rr := mustRun(t, p)
	t.Logf("hit rate of the gateway's requests with warm-up and 30%% bypass: precise %.1f%%, approximate %.1f%%, round_robin %.1f%% (without: precise %.1f%%, approximate %.1f%%)",
		100*hitRate(precise), 100*hitRate(approx), 100*hitRate(rr), 100*hitRate(base), 100*hitRate(baseApprox))
	if precise.Warmed != p.Groups || precise.Bypassed == 0 || precise.Bypassed == precise.Completed {
		t.Fatalf("%d warmed of %d groups, %d of %d completed bypassed", precise.Warmed, p.Groups, precise.Bypassed, precise.Completed)
	}
	if precise.MirrorProblems != 0 {
		t.Errorf("mirror problems %d", precise.MirrorProblems)
	}
	if hitRate(precise) < hitRate(approx)+0.1 {
		t.Errorf("precise %.1f%%, approximate %.1f%%: want 10 points more", 100*hitRate(precise), 100*hitRate(approx))
	}
}

// TestPreciseSeesRestarts: on 4 engines one restarts every second (each
// every 4 s), losing its cache and what runs there. The feed learns it
// when the sequence of the engine's batches starts again; the approximate
// tree goes on sending each group where it sent it before.
func TestPreciseSeesRestarts(t *testing.T) {
	p := pressureParams(PolicyLLM)
	p.Groups, p.KVBlocks, p.RestartEvery = 32, 1024, 1
	precise := mustRun(t, p)
	if again := mustRun(t, p); again.CachedTokens != precise.CachedTokens || again.Failed != precise.Failed {
		t.Fatalf("two runs of the same seed differ: %d/%d cached tokens, %d/%d failed",
			precise.CachedTokens, again.CachedTokens, precise.Failed, again.Failed)
	}
	p.Approximate = true
	approx := mustRun(t, p)
	p.Policy, p.Approximate = PolicyRoundRobin, false
	rr := mustRun(t, p)
	t.Logf("hit rate with restarts: precise %.1f%%, approximate %.1f%%, round_robin %.1f%%; failed %d, %d, %d; %d restarts, %d mirror resets",
		100*hitRate(precise), 100*hitRate(approx), 100*hitRate(rr), precise.Failed, approx.Failed, rr.Failed,
		precise.Restarts, precise.MirrorRestarts)
	if precise.Failed == 0 || precise.Restarts < p.Engines ||
		precise.MirrorRestarts == 0 || precise.MirrorRestarts > uint64(precise.Restarts) {
		t.Fatalf("%d failed, %d restarts, %d mirror resets", precise.Failed, precise.Restarts, precise.MirrorRestarts)
	}
	if precise.MirrorProblems != 0 {
		t.Errorf("mirror problems %d", precise.MirrorProblems)
	}
	if hitRate(precise) < hitRate(approx)+0.05 {
		t.Errorf("precise %.1f%%, approximate %.1f%%: want 5 points more", 100*hitRate(precise), 100*hitRate(approx))
	}
}
