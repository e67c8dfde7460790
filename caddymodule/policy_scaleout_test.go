package caddymodule

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
)

// TestPolicyHashVerification: with hash_seed equal to the engines'
// PYTHONHASHSEED the sampled BlockStored hashes verify; a reload with
// another seed turns them into mismatches, in /llm/engines and in
// llmgw_kv_hash_mismatches_total.
func TestPolicyHashVerification(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{TimeScale: 200, HashSeed: "42"})
	g := gateway{patient: true, engines: kvEngines(engines...), appExtra: "\t\thash_seed 42\n"}
	g.load(t)
	waitKV(t, engines...)
	traffic := func(tag string) {
		for i := range 20 {
			for _, e := range engines {
				direct(t, e, chat{user: fmt.Sprintf("%s %d:%s", tag, i, words(tag, 40)), maxTokens: 20}.body())
			}
		}
	}
	traffic("right")
	for _, e := range engines {
		testwait.For(t, 10*time.Second, "verified hashes on "+e.Addr(), func() bool {
			v := getEngineReport(t, e.Addr()).KV.Verify
			return v.Enabled && v.Verified > 0
		})
		if v := getEngineReport(t, e.Addr()).KV.Verify; v.Mismatched != 0 {
			t.Errorf("%s: %d mismatches with the right seed: %s", e.Addr(), v.Mismatched, v.LastMismatch)
		}
	}
	if v := metricValue(t, "llmgw_kv_hash_mismatches_total", `engine="`+engines[0].Addr()+`"`); v != 0 {
		t.Errorf("llmgw_kv_hash_mismatches_total = %v with the right seed", v)
	}

	g.appExtra = "\t\thash_seed 43\n"
	g.load(t)
	traffic("wrong")
	for _, e := range engines {
		testwait.For(t, 10*time.Second, "hash mismatches on "+e.Addr(), func() bool {
			return getEngineReport(t, e.Addr()).KV.Verify.Mismatched > 0
		})
		if v := metricValue(t, "llmgw_kv_hash_mismatches_total", `engine="`+e.Addr()+`"`); v == 0 {
			t.Errorf("llmgw_kv_hash_mismatches_total for %s = 0 with a wrong seed", e.Addr())
		}
	}
}

// TestPolicyScaleOut: two gateways in front of the same engines both route
// precisely, each from its own subscription to every engine (vLLM's PUB
// binds; any number of gateways connect). The second gateway is a second
// fleet in this process (one Caddy per test process), configured like the
// first and fed only by the engines' events.
func TestPolicyScaleOut(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 50})
	gateway{patient: true, engines: kvEngines(engines...), policy: "\t\t\tdebug_headers\n"}.load(t)
	waitKV(t, engines...)

	cfg := fleet.Config{
		PollInterval: 50 * time.Millisecond, PollTimeout: time.Second, StaleAfter: 3, IdleTTL: time.Minute,
		TokenizeTimeout: time.Second, TokenizeConcurrency: 8, TokenizeCacheSize: 64,
	}
	for _, e := range engines {
		cfg.Engines = append(cfg.Engines, &fleet.EngineConfig{Dial: e.Addr(), KVEvents: e.KVEndpoint(), KVReplay: e.ReplayEndpoint()})
	}
	second := startedFleet(cfg)
	defer second.Close()
	dials := make([]string, len(engines))
	for i, e := range engines {
		dials[i] = e.Addr()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := e.WaitKVSubscribers(ctx, 2); err != nil {
			t.Fatalf("%s: %v", e.Addr(), err)
		}
		cancel()
		testwait.For(t, 10*time.Second, "second gateway connected to "+e.Addr(), func() bool {
			m := second.Index().Mirror(e.Addr())
			return m != nil && m.Connected()
		})
	}

	// Each engine holds its own prefix, learned by both gateways from events.
	prefixes := make([]string, len(engines))
	for i, e := range engines {
		prefixes[i] = fmt.Sprintf("Tenant %d instructions.", i) + words(fmt.Sprintf("t%d", i), 1200)
		direct(t, e, chat{system: prefixes[i], user: "warm", maxTokens: 1}.body())
		waitBlocks(t, e.Addr(), 1200/16)
		testwait.For(t, 10*time.Second, "second gateway's mirror of "+e.Addr(), func() bool {
			m := second.Index().Mirror(e.Addr())
			return m != nil && m.Stats().Blocks == getEngineReport(t, e.Addr()).KV.Blocks
		})
	}
	s := second.PolicySettings("default")
	for i, e := range engines {
		for j := range 3 {
			// Until both gateways' scrapes see the previous request (or
			// the warm-up) end, e may look busy and rightly lose the
			// prefix to an idle engine (see waitIdle).
			waitIdle(t, e.Addr())
			testwait.For(t, 10*time.Second, "second gateway's gauges of "+e.Addr()+" idle", func() bool {
				for _, r := range second.EngineReports() {
					if r.Dial == e.Addr() {
						return idle(r)
					}
				}
				return false
			})
			body := chat{system: prefixes[i], user: fmt.Sprintf("question %d", j), maxTokens: 2}.body()
			r := mustSend(t, "", body, nil)
			if r.upstream != e.Addr() || r.tier != "precise" {
				t.Errorf("gateway 1, prefix %d: %s on %q, want %s on precise; explain: %s", i, r.upstream, r.tier, e.Addr(), explainJSON(t, body))
			}
			req, err := openai.ParseRequest([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			d := second.Route(context.Background(), fleet.Query{Request: req, Dials: dials, Settings: s})
			if d.Index < 0 || dials[d.Index] != e.Addr() || d.Tier != routing.Precise || d.Outcome != routing.Hit {
				t.Errorf("gateway 2, prefix %d: %+v, want %s precise hit", i, d.Decision, e.Addr())
			}
		}
	}
}
