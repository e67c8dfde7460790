package caddymodule

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
)

// TestPolicyApproximateTier: when an engine's KV events go stale (its
// subscription is cut, or was never reachable) its decisions use the
// approximate tier, learned from where the gateway sent which prompt; when
// /tokenize fails or is slower than tokenize_timeout every decision does.
// Both are counted, and no request fails because of either.
func TestPolicyApproximateTier(t *testing.T) {
	engines := startEngines(t, 4, vllmsim.Config{TimeScale: 50})
	proxies := make([]*polTCPProxy, 3)
	kv := map[int]string{3: fmt.Sprintf("tcp://127.0.0.1:%d", mustFreePort(t, "127.0.0.1"))} // nobody there
	for i := range proxies {
		proxies[i] = newPolTCPProxy(t, engines[i].KVEndpoint()[len("tcp://"):])
		kv[i] = proxies[i].endpoint()
	}
	policyGateway{
		engines: engines,
		kv:      kv,
		app:     "\t\ttokenize_timeout 1s\n",
		policy:  "\t\t\tdebug_headers\n",
	}.load(t)
	polWaitKV(t, engines[:3]...)
	if r := getEngineReport(t, engines[3].Addr()); r.KV == nil || r.KV.Connected || !r.KV.Subscribed {
		t.Fatalf("engine 3's dead KV endpoint: %+v", r.KV)
	}
	failures0 := metricValue(t, "llmgw_responses_total", `outcome="upstream_error"`)
	// Long enough that the approximate credit (0.7 × 2,000 tokens) beats a
	// request the holder's lagging gauges may still show waiting (512).
	prefix := "Shared instructions." + polWords("tier", 2000)
	send := func(user string) polResult {
		t.Helper()
		return polMustSend(t, "", polChat(prefix, user, 2, false), nil)
	}
	approx := func() float64 {
		return metricValue(t, "llmgw_prefix_decisions_total", `tier="approximate"`)
	}

	// Precise while engine 0's events flow.
	polDirect(t, engines[0], polChat(prefix, "warm", 1, false))
	polWaitBlocks(t, engines[0].Addr(), 2000/16)
	if r := send("first"); r.upstream != engines[0].Addr() || r.tier != "precise" {
		t.Fatalf("with live events: %s on %q, want %s on precise", r.upstream, r.tier, engines[0].Addr())
	}

	// 1. Cut engine 0's event stream: its blocks are forgotten, but the
	// gateway remembers sending it the prefix.
	proxies[0].close()
	polWaitGauges(t, engines[0].Addr(), "engine 0's KV subscription to drop", func(r engineReport) bool {
		return r.KV != nil && !r.KV.Connected && r.KV.Blocks == 0
	})
	before, cached := approx(), engines[0].Stats().CachedTokens
	for i := range 5 {
		if r := send(fmt.Sprintf("stale %d", i)); r.upstream != engines[0].Addr() || r.tier != "approximate" {
			t.Fatalf("stale events, request %d: %s on %q, want %s on approximate; explain: %s; tokenize failures %v", i, r.upstream, r.tier, engines[0].Addr(),
				polExplain(t, polChat(prefix, fmt.Sprintf("stale %d", i), 2, false)), metricValue(t, "llmgw_tokenize_failures_total"))
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
			r := send(fmt.Sprintf("tokenizer down %v %d", fault, i))
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
	other := "Other instructions." + polWords("dead", 300)
	first := polMustSend(t, "", polChat(other, "one", 2, false), nil)
	second := polMustSend(t, "", polChat(other, "two", 2, false), nil)
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
