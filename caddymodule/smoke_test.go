package caddymodule

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
)

// TestGatewaySmoke: a streaming and a non-streaming chat completion through
// llm_admission and lb_policy llm, the admin routes, and the metrics.
func TestGatewaySmoke(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{})
	newTester(t, gatewayCaddyfile(fleetConfig{engines: engines, policy: "\t\t\tdebug_headers\n"}))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := post(ctx, chatBody(false, "hello there, how are you"), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, res)
	if res.StatusCode != http.StatusOK || !strings.Contains(body, `"choices"`) {
		t.Fatalf("non-streaming: %d %s", res.StatusCode, body)
	}
	if res.Header.Get("X-LLM-Upstream") == "" || res.Header.Get("X-LLM-Tier") == "" {
		t.Errorf("debug headers missing: %v", res.Header)
	}

	res, err = post(ctx, chatBody(true, "hello there, how are you"), nil)
	if err != nil {
		t.Fatal(err)
	}
	body = readAll(t, res)
	if res.StatusCode != http.StatusOK || !strings.Contains(body, "data: ") || !strings.Contains(body, "data: [DONE]") {
		t.Fatalf("streaming: %d %s", res.StatusCode, body)
	}

	var engs []engineReport
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
	eventually(t, 5*time.Second, "KV subscriptions connected", func() bool {
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
