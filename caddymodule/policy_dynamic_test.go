package caddymodule

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestPolicyDynamicUpstreamsAndReload: engines discovered through `dynamic
// a` (one name, several loopback addresses, one port, as a headless service
// resolves) are registered on first use, subscribed through the app-wide
// kv_events_port, and routed precisely; a config reload keeps their KV
// mirrors, so blocks held before it still draw the requests after it.
func TestPolicyDynamicUpstreamsAndReload(t *testing.T) {
	ips := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	httpP := mustFreePort(t, ips...)
	kvP, replayP := httpP, httpP
	for kvP == httpP {
		kvP = mustFreePort(t, ips...)
	}
	for replayP == httpP || replayP == kvP {
		replayP = mustFreePort(t, ips...)
	}
	engines := make([]*vllmsim.Engine, len(ips))
	for i, ip := range ips {
		e, err := vllmsim.Start(context.Background(), vllmsim.Config{
			Addr:      fmt.Sprintf("%s:%d", ip, httpP),
			TimeScale: 50,
			KVEvents: &vllmsim.KVEventsConfig{
				Endpoint:       fmt.Sprintf("tcp://*:%d", kvP),
				ReplayEndpoint: fmt.Sprintf("tcp://*:%d", replayP),
			},
		})
		if err != nil {
			t.Fatalf("engine on %s: %v (ports taken meanwhile?)", ip, err)
		}
		engines[i] = e
		t.Cleanup(func() { _ = e.Close() })
	}
	dns := dnsServer(t, ips...)
	g := gateway{
		patient:  true,
		appExtra: fmt.Sprintf("\t\tkv_events_port %d\n\t\tkv_replay_port %d\n", kvP, replayP),
		policy:   "\t\t\tdebug_headers\n",
		dynamic: fmt.Sprintf("\t\tdynamic a sims.llmgw.test %d {\n\t\t\tresolvers %s\n\t\t\tversions ipv4\n\t\t}\n",
			httpP, dns),
	}
	g.load(t)

	// The first request discovers the engines.
	first := mustSend(t, "", chat{user: "hello, who is there?", maxTokens: 2}.body(), nil)
	if first.upstream == "" {
		t.Fatal("no upstream header")
	}
	waitKV(t, engines...)
	for i, e := range engines {
		r := getEngineReport(t, e.Addr())
		if r.Static || r.KV.Endpoint != fmt.Sprintf("tcp://%s:%d", ips[i], kvP) {
			t.Errorf("%s: configured %v, KV endpoint %q", e.Addr(), r.Static, r.KV.Endpoint)
		}
	}

	holder := engines[1]
	prefix := "Dynamic fleet instructions." + words("dyn", 1500)
	direct(t, holder, chat{system: prefix, user: "warm", maxTokens: 1}.body())
	blocks := waitBlocks(t, holder.Addr(), 1500/16).KV
	route := func(phase string) {
		t.Helper()
		for i := range 10 {
			waitIdle(t, holder.Addr()) // the previous request's end scraped
			r := mustSend(t, "", chat{system: prefix, user: fmt.Sprintf("%s %d", phase, i), maxTokens: 2}.body(), nil)
			if r.upstream != holder.Addr() || r.tier != "precise" {
				t.Fatalf("%s request %d: %s on %q, want %s on precise", phase, i, r.upstream, r.tier, holder.Addr())
			}
		}
	}
	route("before the reload")

	// Reload with different policy weights: the engines, their
	// subscriptions and their mirrors carry over.
	g.policy += "\t\t\ttie_tokens 4\n\t\t\tqueue_weight 600\n"
	g.load(t)
	// A subscription the reload restarted (a bug) would show by the time a
	// block the holder announces after the reload is mirrored: the reload
	// has ended the old session, and the event came through the new one.
	direct(t, holder, chat{system: "After the reload." + words("post", 64), user: "warm"}.body())
	testwait.For(t, 15*time.Second, "a block announced after the reload mirrored", func() bool {
		r := getEngineReport(t, holder.Addr()).KV
		return r != nil && r.Stored > blocks.Stored
	})
	after := getEngineReport(t, holder.Addr()).KV
	if after == nil || after.Blocks < blocks.Blocks || after.Sessions != blocks.Sessions || after.LastResync != blocks.LastResync {
		t.Fatalf("the reload disturbed the KV mirror: before %+v, after %+v", blocks, after)
	}
	route("after the reload")
}
