package caddymodule

import (
	"context"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestKVSubscriptionLifecycle: the llm app subscribes to every engine's KV
// events, mirrors them (/llm/engines and llmgw_kv_* metrics), survives a
// config reload without resubscribing, resets the mirror when the engine
// restarts, and stops the subscription of an engine removed from the config
// once it is idle.
func TestKVSubscriptionLifecycle(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{})
	a, b := engines[0], engines[1]
	gateway{engines: kvEngines(engines...)}.load(t)

	// Connected on the gateway's side is not yet subscribed on the
	// engine's: ZMQ drops what a PUB sends before the subscription
	// arrives, so the requests below wait for both (waitKV).
	waitKV(t, a, b)
	direct(t, a, chatBody(false, longText(200)))
	testwait.For(t, 10*time.Second, "engine a's blocks mirrored", func() bool {
		r := getEngineReport(t, a.Addr())
		return r.KV.Blocks > 0 && r.KV.LastSeq != nil
	})
	ra := getEngineReport(t, a.Addr())
	if ra.KV.Mode != "connect" || ra.KV.Endpoint != a.KVEndpoint() || ra.KV.Stored == 0 {
		t.Errorf("engine a KV report: %+v", *ra.KV)
	}
	if v := metricValue(t, "llmgw_kv_index_blocks", `engine="`+a.Addr()+`"`); v != float64(ra.KV.Blocks) {
		t.Errorf("llmgw_kv_index_blocks = %v, want %d", v, ra.KV.Blocks)
	}
	if v := metricValue(t, "llmgw_kv_events_total", `engine="`+a.Addr()+`"`, `type="stored"`); v == 0 {
		t.Error("llmgw_kv_events_total{type=stored} is 0")
	}
	sessions := ra.KV.Sessions

	// A reload with a changed, unrelated setting keeps the subscription
	// and the mirror.
	gateway{engines: kvEngines(engines...), appExtra: "\t\tstale_after 4\n"}.load(t)
	after := getEngineReport(t, a.Addr())
	if after.KV == nil || after.KV.Sessions != sessions || after.KV.Blocks != ra.KV.Blocks {
		t.Fatalf("reload disturbed the subscription: before sessions=%d blocks=%d, after %+v", sessions, ra.KV.Blocks, after.KV)
	}

	// An engine restart (sequence back to 0, cache gone) resets the mirror
	// and resubscribes.
	if err := a.Restart(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "mirror reset after restart", func() bool {
		r := getEngineReport(t, a.Addr())
		return r.KV != nil && r.KV.Connected && r.KV.Blocks == 0 && r.KV.Sessions > sessions
	})
	waitKV(t, a)
	direct(t, a, chatBody(false, longText(100)))
	testwait.For(t, 10*time.Second, "blocks mirrored again after restart", func() bool {
		return getEngineReport(t, a.Addr()).KV.Blocks > 0
	})

	// Removing engine b from the config stops its subscription once it is
	// idle (a removed engine that the new config still routes to, or that
	// has requests in flight, lives on as a discovered engine until then).
	gateway{engines: kvEngines(a), appExtra: "\t\tidle_ttl 500ms\n"}.load(t)
	testwait.For(t, 10*time.Second, "engine b's subscription stopped", func() bool {
		r := getEngineReport(t, b.Addr())
		return r.KV == nil
	})
	if v := metricValue(t, "llmgw_kv_index_blocks", `engine="`+b.Addr()+`"`); v != 0 {
		t.Errorf("removed engine still has llmgw_kv_index_blocks = %v", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitKVSubscribers(ctx, 0); err != nil {
		t.Errorf("engine b still has subscribers: %v", err)
	}
}
