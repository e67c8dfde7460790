package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// securityExample is the Caddyfile of SECURITY.md's advice on what to
// expose, unindented: the first caddyfile block of the document.
func securityExample(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "```caddyfile\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("SECURITY.md has no caddyfile block")
	}
	var b strings.Builder
	for _, line := range strings.Split(block, "\n") {
		b.WriteString(strings.TrimPrefix(line, "  ") + "\n")
	}
	return b.String()
}

// TestSecurityExampleExposesOnlyAPI runs SECURITY.md's example against two
// simulated engines: inference and the gateway's /v1/models are answered,
// and the engines' own endpoints (/tokenize, /reset_prefix_cache,
// /metrics, the adapter endpoints) are answered 404 by the gateway.
func TestSecurityExampleExposesOnlyAPI(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{})
	cfg := securityExample(t)
	for i, dial := range []string{"10.0.0.7:8000", "10.0.0.8:8000"} {
		if !strings.Contains(cfg, "engine "+dial+" {") {
			t.Fatalf("SECURITY.md's example no longer lists engine %s:\n%s", dial, cfg)
		}
		cfg = strings.ReplaceAll(cfg, dial, engines[i].Addr())
	}
	if !strings.Contains(cfg, "llm.example.com {") {
		t.Fatalf("SECURITY.md's example has another site address:\n%s", cfg)
	}
	cfg = strings.Replace(cfg, "llm.example.com {", "http://"+gatewayAddr+" {", 1)
	global := fmt.Sprintf("{\n\tadmin %s\n\tskip_install_trust\n\thttp_port %d\n\thttps_port %d\n\tgrace_period 1ns\n", adminAddr, httpPort, httpsPort)
	cfg = strings.Replace(cfg, "{\n", global, 1)
	t.Cleanup(func() { resetGateway(t) })
	newTester(t, cfg)
	waitModelsLearned(t, engines...)

	if r := mustSend(t, "", modelBody("sim-model", 0), nil); r.status != http.StatusOK {
		t.Fatalf("chat completion: status %d: %s", r.status, r.body)
	}
	if res, body := getModels(t, http.MethodGet, "/v1/models"); res.StatusCode != http.StatusOK ||
		!strings.Contains(body, `"id":"sim-model"`) {
		t.Errorf("/v1/models: %d %s", res.StatusCode, body)
	}
	// Each of these would be answered by an engine (200, or its own error
	// body); the gateway's `respond 404` has an empty body.
	for _, path := range []string{"/tokenize", "/detokenize", "/reset_prefix_cache", "/metrics", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/health"} {
		r := send(context.Background(), "http://"+gatewayAddr+path, `{"prompt":"x","lora_name":"x","lora_path":"/x"}`, nil)
		if r.status != http.StatusNotFound || r.body != "" {
			t.Errorf("POST %s: status %d, body %q; want the gateway's empty 404", path, r.status, r.body)
		}
	}
}
