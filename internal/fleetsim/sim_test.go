package fleetsim

import (
	"context"
	"slices"
	"testing"
)

func smallParams(policy string) Params {
	return Params{
		Engines: 4, KVBlocks: 256,
		Model:  Model{MaxNumSeqs: 8, BlockSize: 16, PrefillTokensPerSec: 10000, DecodeStepSeconds: 0.02, MaxBatchedTokens: 4096},
		Groups: 12, SystemTokens: 256, QuestionTokens: 32, OutputTokens: 16,
		Requests: 600, Rate: 60, Policy: policy, MaxInflight: 8,
		KVLimit: 0.9, PollInterval: 0.25, MaxPark: 30, QueueSize: 256, Seed: 3,
	}
}

// TestRunAccountsForEveryRequest: each request completes or is refused,
// the mirrors accept every event the engines publish, routing on the
// index finds more cache than round robin, and a run is deterministic.
func TestRunAccountsForEveryRequest(t *testing.T) {
	hit := map[string]float64{}
	for _, policy := range []string{PolicyLLM, PolicyLeastConn, PolicyRoundRobin} {
		p := smallParams(policy)
		r, err := Run(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed+r.Rejected != p.Requests || r.Completed == 0 || len(r.TTFT) != r.Completed {
			t.Fatalf("%s: %d completed + %d rejected of %d, %d TTFTs", policy, r.Completed, r.Rejected, p.Requests, len(r.TTFT))
		}
		if policy == PolicyLLM && (r.MirrorProblems != 0 || r.EventBatches == 0 || len(r.DecisionNs) < r.Completed) {
			t.Fatalf("llm: mirror problems %d, batches %d, decisions %d", r.MirrorProblems, r.EventBatches, len(r.DecisionNs))
		}
		again, err := Run(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if again.Completed != r.Completed || again.CachedTokens != r.CachedTokens || !slices.Equal(again.TTFT, r.TTFT) {
			t.Fatalf("%s: two runs of the same seed differ: %d/%d completed, %d/%d cached tokens", policy,
				r.Completed, again.Completed, r.CachedTokens, again.CachedTokens)
		}
		hit[policy] = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	if hit[PolicyLLM] <= hit[PolicyRoundRobin] {
		t.Fatalf("routing on the index found no more cache than round robin: %v", hit)
	}
}

func TestRunRejectsBadParams(t *testing.T) {
	p := smallParams(PolicyLLM)
	p.MaxInflight = 0
	if _, err := Run(context.Background(), p); err == nil {
		t.Fatal("max_inflight 0 accepted")
	}
}
