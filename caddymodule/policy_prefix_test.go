package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// polPrefixWords is the shared system prompt's length in words (~tokens).
const polPrefixWords = 2000

// TestPolicyPrefixAffinityAndSpill: four engines, one of which holds a
// 2,000-token prefix (learned from its KV events only: it was warmed
// directly, not through the gateway). 100 requests sharing that prefix with
// different suffixes all go to it on the precise tier and hit its prefix
// cache; while it is saturated (its running requests, filled by direct
// callers, reach max_inflight) they spill to the others and the spill is
// counted as overridden_by_load. Admission's queueing at a full holder is
// off (prefill_rate -1): the engine behind max_inflight 4 has room in
// truth, serves every queued request at once and so keeps its drain rate
// high, and the requests would rightly wait there; that rule has its own
// tests (fleet's TestPrefixHitWait).
func TestPolicyPrefixAffinityAndSpill(t *testing.T) {
	engines := startEngines(t, 4, vllmsim.Config{TimeScale: 5})
	gateway{
		patient:     true,
		engines:     kvEngines(engines...),
		engineExtra: "\t\t\tmax_inflight 4\n",
		policy:      "\t\t\tdebug_headers\n",
		admission:   "\t\tprefill_rate -1\n",
	}.load(t)
	waitKV(t, engines...)
	holder := engines[0]
	prefix := "You are a careful assistant." + words("ctx", polPrefixWords)
	// The counter is process-wide; earlier tests cause upstream errors on purpose.
	upstreamErrors := metricValue(t, "llmgw_responses_total", `outcome="upstream_error"`)

	// Warm the holder directly: the gateway learns it only from events.
	direct(t, holder, chat{system: prefix, user: "warm up", maxTokens: 1}.body())
	minBlocks := polPrefixWords / 16
	waitBlocks(t, holder.Addr(), minBlocks)
	for _, e := range engines[1:] {
		if r := getEngineReport(t, e.Addr()); r.KV == nil || r.KV.Blocks != 0 {
			t.Fatalf("engine %s holds blocks before any request: %+v", e.Addr(), r.KV)
		}
	}

	before := make([]vllmsim.Stats, len(engines))
	for i, e := range engines {
		before[i] = e.Stats()
	}
	preciseHits := metricValue(t, "llmgw_prefix_decisions_total", `tier="precise"`, `outcome="hit"`)

	// 1. Under its limits the holder takes every request (two at a time,
	// below max_inflight 4).
	rs := parallel(100, 2, func(i int) reply {
		return send(context.Background(), "", chat{system: prefix, user: fmt.Sprintf("question %d: what is %d squared?", i, i), maxTokens: 4}.body(), nil)
	})
	for i, r := range rs {
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d: status %d, err %v, body %.200s", i, r.status, r.err, r.body)
		}
		if r.upstream != holder.Addr() || r.tier != "precise" {
			kv, _ := json.Marshal(getEngineReport(t, holder.Addr()).KV)
			t.Fatalf("request %d went to %s on tier %q, want %s on precise (all: %v); tokenize failures %v; holder's KV %s; explain %s",
				i, r.upstream, r.tier, holder.Addr(), countUpstreams(rs), metricValue(t, "llmgw_tokenize_failures_total"), kv,
				explainJSON(t, chat{system: prefix, user: fmt.Sprintf("question %d: what is %d squared?", i, i), maxTokens: 4}.body()))
		}
	}
	after := holder.Stats()
	served := after.RequestsServed - before[0].RequestsServed
	cached := after.CachedTokens - before[0].CachedTokens
	prompt := after.PromptTokens - before[0].PromptTokens
	if served != 100 || cached < 100*uint64(minBlocks*16) {
		t.Errorf("holder served %d requests with %d cached tokens, want 100 and >= %d", served, cached, 100*minBlocks*16)
	}
	t.Logf("affinity phase: holder prefix-cache hit rate %.3f (%d of %d prompt tokens)", float64(cached)/float64(prompt), cached, prompt)
	for i, e := range engines[1:] {
		if n := e.Stats().RequestsServed - before[i+1].RequestsServed; n != 0 {
			t.Errorf("engine %s served %d requests during the affinity phase", e.Addr(), n)
		}
	}
	if d := metricValue(t, "llmgw_prefix_decisions_total", `tier="precise"`, `outcome="hit"`) - preciseHits; d < 100 {
		t.Errorf("precise hits grew by %v, want >= 100", d)
	}

	// 2. Saturate the holder with direct long requests (other clients of the
	// engine: the gateway sees them only in the engine's gauges).
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = send(ctx, holder.URL()+"/v1/chat/completions", chat{system: prefix, user: fmt.Sprintf("long story %d", i), maxTokens: 6000, stream: true}.body(), nil)
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	waitGauges(t, holder.Addr(), "holder running 4 in the gateway's gauges", func(r fleet.EngineReport) bool { return r.Running >= 4 })

	overridden := metricValue(t, "llmgw_prefix_decisions_total", `outcome="overridden_by_load"`)
	spill := make([]reply, 0, 12)
	for i := range 12 {
		r := mustSend(t, "", chat{system: prefix, user: fmt.Sprintf("spill %d", i), maxTokens: 4}.body(), nil)
		spill = append(spill, r)
		if r.upstream == holder.Addr() {
			t.Errorf("spill request %d went to the saturated holder", i)
		}
	}
	if d := metricValue(t, "llmgw_prefix_decisions_total", `outcome="overridden_by_load"`) - overridden; d < 1 {
		t.Errorf("overridden_by_load grew by %v during the spill, want >= 1 (picks: %v)", d, countUpstreams(spill))
	}
	if holder.Stats().Running < 4 {
		t.Fatalf("the direct requests ended before the spill phase did: the test proves nothing")
	}
	cancel()
	wg.Wait()

	// 3. Load gone: requests with the prefix go to an engine holding it.
	waitGauges(t, holder.Addr(), "holder idle in the gateway's gauges", func(r fleet.EngineReport) bool { return r.Running == 0 })
	r := mustSend(t, "", chat{system: prefix, user: "after the storm", maxTokens: 4}.body(), nil)
	if r.tier != "precise" {
		t.Errorf("after the spill: tier %q, want precise", r.tier)
	}
	if d := metricValue(t, "llmgw_responses_total", `outcome="upstream_error"`) - upstreamErrors; d != 0 {
		t.Errorf("%v upstream errors", d)
	}
}
