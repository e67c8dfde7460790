package caddymodule

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestPolicyApproximateTier: when an engine's KV events go stale (its
// subscription is cut, or was never reachable) its decisions use the
// approximate tier, learned from where the gateway sent which prompt; when
// /tokenize fails or is slower than tokenize_timeout every decision does.
// Both are counted, and no request fails because of either.
func TestPolicyApproximateTier(t *testing.T) {
	engines := startEngines(t, 4, vllmsim.Config{TimeScale: 50})
	proxies := make([]*tcpProxy, 3)
	// Engines 0-2 publish their KV events through proxies the test can
	// cut; engine 3's endpoint has nobody there.
	listed := noKVEngines(engines...)
	listed[3].kv = fmt.Sprintf("tcp://127.0.0.1:%d", mustFreePort(t, "127.0.0.1"))
	for i := range proxies {
		proxies[i] = newTCPProxy(t, engines[i].KVEndpoint()[len("tcp://"):])
		listed[i].kv = proxies[i].endpoint()
	}
	gateway{
		patient:  true,
		engines:  listed,
		appExtra: "\t\ttokenize_timeout 1s\n",
		policy:   "\t\t\tdebug_headers\n",
	}.load(t)
	waitKV(t, engines[:3]...)
	if r := getEngineReport(t, engines[3].Addr()); r.KV == nil || r.KV.Connected || !r.KV.Subscribed {
		t.Fatalf("engine 3's dead KV endpoint: %+v", r.KV)
	}
	failures0 := metricValue(t, "llmgw_responses_total", `outcome="upstream_error"`)
	// Long enough that the approximate credit (0.7 × 2,000 tokens) beats a
	// request the holder's lagging gauges may still show waiting (512).
	prefix := "Shared instructions." + words("tier", 2000)
	ask := func(user string) reply {
		t.Helper()
		return mustSend(t, "", chat{system: prefix, user: user, maxTokens: 2}.body(), nil)
	}
	approx := func() float64 {
		return metricValue(t, "llmgw_prefix_decisions_total", `tier="approximate"`)
	}

	// Precise while engine 0's events flow.
	direct(t, engines[0], chat{system: prefix, user: "warm", maxTokens: 1}.body())
	waitBlocks(t, engines[0].Addr(), 2000/16)
	if r := ask("first"); r.upstream != engines[0].Addr() || r.tier != "precise" {
		t.Fatalf("with live events: %s on %q, want %s on precise", r.upstream, r.tier, engines[0].Addr())
	}

	// 1. Cut engine 0's event stream: its blocks are forgotten, but the
	// gateway remembers sending it the prefix.
	proxies[0].close()
	waitGauges(t, engines[0].Addr(), "engine 0's KV subscription to drop", func(r fleet.EngineReport) bool {
		return r.KV != nil && !r.KV.Connected && r.KV.Blocks == 0
	})
	before, cached := approx(), engines[0].Stats().CachedTokens
	for i := range 5 {
		if r := ask(fmt.Sprintf("stale %d", i)); r.upstream != engines[0].Addr() || r.tier != "approximate" {
			t.Fatalf("stale events, request %d: %s on %q, want %s on approximate; explain: %s; tokenize failures %v", i, r.upstream, r.tier, engines[0].Addr(),
				explainJSON(t, chat{system: prefix, user: fmt.Sprintf("stale %d", i), maxTokens: 2}.body()), metricValue(t, "llmgw_tokenize_failures_total"))
		}
	}
	if d := approx() - before; d < 5 {
		t.Errorf("approximate decisions grew by %v, want >= 5", d)
	}
	if engines[0].Stats().CachedTokens-cached < 5*uint64(2000/16*16) {
		t.Errorf("approximate routing missed engine 0's cache")
	}

	// 2. /tokenize fails, then is slower than tokenize_timeout: every
	// decision is approximate; each failure is counted.
	for _, fault := range []vllmsim.Faults{{TokenizeFail: true}, {TokenizeDelay: 3 * time.Second}} {
		for _, e := range engines {
			e.SetFaults(fault)
		}
		fails, before := metricValue(t, "llmgw_tokenize_failures_total"), approx()
		for i := range 4 {
			r := ask(fmt.Sprintf("tokenizer down %v %d", fault, i))
			if r.upstream != engines[0].Addr() || r.tier != "approximate" {
				t.Errorf("%+v: request %d: %s on %q, want %s on approximate", fault, i, r.upstream, r.tier, engines[0].Addr())
			}
		}
		if d := metricValue(t, "llmgw_tokenize_failures_total") - fails; d < 4 {
			t.Errorf("%+v: tokenize failures grew by %v, want >= 4", fault, d)
		}
		if d := approx() - before; d < 4 {
			t.Errorf("%+v: approximate decisions grew by %v, want >= 4", fault, d)
		}
	}
	for _, e := range engines {
		e.SetFaults(vllmsim.Faults{})
	}

	// 3. Engine 3 never had events: with the others drained it learns a new
	// prefix through the gateway, and its next decisions are approximate.
	for _, e := range engines[:3] {
		if code := adminJSON(t, http.MethodPost, "/llm/engines/"+e.Addr()+"/drain", "", nil); code != http.StatusOK {
			t.Fatalf("drain: %d", code)
		}
	}
	other := "Other instructions." + words("dead", 300)
	first := mustSend(t, "", chat{system: other, user: "one", maxTokens: 2}.body(), nil)
	second := mustSend(t, "", chat{system: other, user: "two", maxTokens: 2}.body(), nil)
	if first.upstream != engines[3].Addr() || second.upstream != engines[3].Addr() || second.tier != "approximate" {
		t.Errorf("engine 3 without events: %s/%q then %s/%q, want it on approximate the second time", first.upstream, first.tier, second.upstream, second.tier)
	}
	for _, e := range engines[:3] {
		adminJSON(t, http.MethodPost, "/llm/engines/"+e.Addr()+"/undrain", "", nil)
	}
	if r := getEngineReport(t, engines[3].Addr()); r.KV == nil || r.KV.DialErrors == 0 {
		t.Errorf("engine 3's KV report shows no dial errors: %+v", r.KV)
	}
	if d := metricValue(t, "llmgw_responses_total", `outcome="upstream_error"`) - failures0; d != 0 {
		t.Errorf("%v requests failed", d)
	}
}
