package caddymodule

import (
	"testing"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/fleet"
)

// TestAdmissionLimitsHonorBreaker: admission honors the circuit breaker
// only for a pool lb_policy llm routes (it registered its settings): Caddy's
// own policies never consult the breaker, and holding requests back for
// it there would only idle engines they route to.
func TestAdmissionLimitsHonorBreaker(t *testing.T) {
	f := fleet.New(zap.NewNop(), fleet.Options{ManualScrape: true})
	t.Cleanup(f.Close)
	h := &Admission{Pool: "llm-pool", fleet: f}
	if h.limits().HonorBreaker {
		t.Fatal("a pool without lb_policy llm honors the breaker")
	}
	f.SetPolicy("llm-pool", fleet.DefaultSettings())
	if !h.limits().HonorBreaker {
		t.Fatal("a pool routed by lb_policy llm ignores the breaker")
	}
}
