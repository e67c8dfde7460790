package caddymodule

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestGatewaySmoke: a streaming and a non-streaming chat completion through
// llm_admission and lb_policy llm, the admin routes, and the metrics.
func TestGatewaySmoke(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{})
	gateway{engines: kvEngines(engines...), policy: "\t\t\tdebug_headers\n"}.load(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := send(ctx, "", chatBody(false, "hello there, how are you"), nil)
	if r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, `"choices"`) {
		t.Fatalf("non-streaming: %d %v %s", r.status, r.err, r.body)
	}
	if r.upstream == "" || r.tier == "" {
		t.Errorf("debug headers missing: %v", r.header)
	}

	r = send(ctx, "", chatBody(true, "hello there, how are you"), nil)
	if r.err != nil || r.status != http.StatusOK || !strings.Contains(r.body, "data: ") || !r.done {
		t.Fatalf("streaming: %d %v %s", r.status, r.err, r.body)
	}

	var engs []fleet.EngineReport
	// Engines of earlier tests may linger (demoted to dynamic while
	// recently used): count this test's own.
	code := adminJSON(t, http.MethodGet, "/llm/engines", "", &engs)
	own := 0
	for _, r := range engs {
		for _, e := range engines {
			if r.Dial == e.Addr() && r.Static {
				own++
			}
		}
	}
	if code != http.StatusOK || own != 2 {
		t.Fatalf("/llm/engines: %d, %d of this test's engines configured in %d", code, own, len(engs))
	}
	testwait.For(t, 5*time.Second, "KV subscriptions connected", func() bool {
		for _, e := range engines {
			r := getEngineReport(t, e.Addr())
			if r.KV == nil || !r.KV.Connected {
				return false
			}
		}
		return true
	})
	var q map[string]any
	if code := adminJSON(t, http.MethodGet, "/llm/queue", "", &q); code != http.StatusOK {
		t.Fatalf("/llm/queue: %d", code)
	}
	var ex map[string]any
	if code := adminJSON(t, http.MethodPost, "/llm/explain", chatBody(false, "hello there, how are you"), &ex); code != http.StatusOK || ex["pick"] == nil {
		t.Fatalf("/llm/explain: %d %v", code, ex)
	}
	if v := metricValue(t, "llmgw_admission_admitted_total"); v < 2 {
		t.Errorf("llmgw_admission_admitted_total = %v, want >= 2", v)
	}
	if v := metricValue(t, "llmgw_prefix_decisions_total"); v < 2 {
		t.Errorf("llmgw_prefix_decisions_total = %v, want >= 2", v)
	}
}
