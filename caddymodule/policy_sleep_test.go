package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// engineControl posts to one of a simulated engine's control endpoints
// (vLLM's /sleep and /wake_up) and fails the test unless it answers 200.
func engineControl(t *testing.T, e *vllmsim.Engine, path string) {
	t.Helper()
	if r := send(context.Background(), e.URL()+path, "", nil); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("POST %s%s: status %d, err %v, body %.200s", e.Addr(), path, r.status, r.err, r.body)
	}
}

// TestPolicySleepingEngine: an engine holding a prefix is put to sleep
// through vLLM's POST /sleep. Once a scrape shows it asleep the gateway
// shows it so, its index entries are gone, and requests of that prefix
// go to the other engines; after POST /wake_up it takes requests again.
func TestPolicySleepingEngine(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 5})
	gateway{
		patient: true,
		engines: kvEngines(engines...),
		policy:  "\t\t\tdebug_headers\n",
	}.load(t)
	waitKV(t, engines...)
	holder := engines[0]
	prefix := "You are a sleepy assistant." + words("nap", 400)
	body := func(i int) string {
		return chat{system: prefix, user: fmt.Sprintf("question %d", i), maxTokens: 2}.body()
	}
	direct(t, holder, chat{system: prefix, user: "warm up", maxTokens: 1}.body())
	waitBlocks(t, holder.Addr(), 400/16)
	if r := mustSend(t, "", body(0), nil); r.upstream != holder.Addr() {
		t.Fatalf("before sleep the prefix went to %s, want its holder %s", r.upstream, holder.Addr())
	}

	engineControl(t, holder, "/sleep?level=1")
	testwait.For(t, 15*time.Second, "the gateway sees the holder asleep", func() bool {
		r := getEngineReport(t, holder.Addr())
		return r.Asleep && r.KV != nil && r.KV.Blocks == 0
	})
	rep := getEngineReport(t, holder.Addr())
	if rep.SleepLevel != 1 || rep.KV.Resyncs["sleep"] != 1 {
		t.Fatalf("asleep report: level %d, resyncs %v", rep.SleepLevel, rep.KV.Resyncs)
	}
	if v := metricValue(t, "llmgw_endpoint_asleep", `replica="`+holder.Addr()+`"`); v != 1 {
		t.Fatalf("llmgw_endpoint_asleep = %v, want 1", v)
	}
	rs := parallel(12, 3, func(i int) reply { return send(context.Background(), "", body(i+1), nil) })
	for i, r := range rs {
		if r.err != nil || r.status != http.StatusOK || r.upstream == holder.Addr() {
			t.Fatalf("request %d while the holder sleeps: status %d, upstream %s (holder %s), err %v, body %.200s",
				i, r.status, r.upstream, holder.Addr(), r.err, r.body)
		}
	}

	engineControl(t, holder, "/wake_up")
	testwait.For(t, 15*time.Second, "the gateway sees the holder awake", func() bool {
		return !getEngineReport(t, holder.Addr()).Asleep
	})
	// Cold, it is a candidate like any engine without the prompts' prefixes:
	// fresh prompts reach it. Sent six at a time, so that the load term
	// spreads them even where its speeds, measured before the sleep,
	// predict it a little slower than its peers (a busy machine made them
	// so once; one at a time, each request then goes to the fastest).
	fresh := parallel(60, 6, func(i int) reply {
		return send(context.Background(), "", chat{user: fmt.Sprintf("a fresh prompt %d: %s", i, words(fmt.Sprint("w", i), 40)), maxTokens: 2}.body(), nil)
	})
	got := countUpstreams(fresh)
	if got[holder.Addr()] == 0 {
		var ex map[string]any
		adminJSON(t, http.MethodPost, "/llm/explain", chat{user: "a fresh prompt to explain", maxTokens: 2}.body(), &ex)
		b, _ := json.MarshalIndent(ex["candidates"], "", " ")
		t.Fatalf("60 fresh requests after wake_up, none went to %s (%v); /llm/explain's candidates for another: %s", holder.Addr(), got, b)
	}
	for i, r := range fresh {
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("fresh request %d after wake_up: status %d, err %v", i, r.status, r.err)
		}
	}
}
