package caddymodule

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestPolicyLoRAPrecise: vLLM hashes a LoRA request's blocks with the
// adapter's name, so the same prompt cached for the base model is no hit
// for the adapter and the other way round. One engine holds a long prompt
// cached under the adapter, another the same prompt cached for the base
// model (both warmed directly: the gateway learns them from KV events
// only). Through the gateway, the adapter's requests go to the first and
// the base model's to the second, both on the precise tier, and the
// engines report the hits.
func TestPolicyLoRAPrecise(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 5, LoRAModules: []string{"sql-lora"}})
	gateway{
		patient:     true,
		engines:     kvEngines(engines...),
		engineExtra: "\t\t\tmax_inflight 8\n",
		policy:      "\t\t\tdebug_headers\n",
	}.load(t)
	waitKV(t, engines...)
	loraHolder, baseHolder := engines[0], engines[1]
	prefix := "You translate questions into SQL." + words("schema", 600)
	asModel := func(body, model string) string {
		return strings.Replace(body, `"model":"sim-model"`, `"model":"`+model+`"`, 1)
	}
	direct(t, loraHolder, asModel(chat{system: prefix, user: "warm up", maxTokens: 1}.body(), "sql-lora"))
	direct(t, baseHolder, chat{system: prefix, user: "warm up", maxTokens: 1}.body())
	waitBlocks(t, loraHolder.Addr(), 600/16)
	waitBlocks(t, baseHolder.Addr(), 600/16)

	for i, c := range []struct {
		model string
		want  *vllmsim.Engine
	}{
		{"sql-lora", loraHolder}, {"sim-model", baseHolder}, {"sql-lora", loraHolder}, {"sim-model", baseHolder},
	} {
		waitIdle(t, c.want.Addr()) // the warm-up's or the last request's end scraped
		before := c.want.Stats()
		body := asModel(chat{system: prefix, user: "list the tables", maxTokens: 2}.body(), c.model)
		r := send(context.Background(), "", body, nil)
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d (%s): status %d, err %v, body %.200s", i, c.model, r.status, r.err, r.body)
		}
		if r.upstream != c.want.Addr() || r.tier != "precise" {
			t.Fatalf("request %d (%s) went to %s on tier %q, want %s on precise; explain %s",
				i, c.model, r.upstream, r.tier, c.want.Addr(), explainJSON(t, body))
		}
		if got := c.want.Stats().CachedTokens - before.CachedTokens; got < 600 {
			t.Errorf("request %d (%s): %d cached tokens at its holder, want >= 600", i, c.model, got)
		}
	}
}
