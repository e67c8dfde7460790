package caddymodule

import (
	"context"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/kvindex/zmqsub"
	"github.com/llmgw/caddy-llmgw/routing"
)

// TestReliabilityEngineRestartRoutingRecovers: an engine restart (cache
// emptied, sequence numbers from 0, PUB socket re-opened) resets the
// gateway's mirror of it and resubscribes; the mirror never claims the
// blocks the restart dropped; once the engine announces blocks again,
// requests route to it on the precise tier again.
func TestReliabilityEngineRestartRoutingRecovers(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{})
	a, b := engines[0], engines[1]
	gateway{engines: kvEngines(engines...), policy: "\t\t\tdebug_headers\n"}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	waitKV(t, a, b) // on the engines' side too: a PUB drops what it sends before a subscription arrives
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// routedTo warms a with text (straight to the engine), waits until the
	// gateway mirrors it, and sends the same prompt through the gateway.
	routedTo := func(text string) (upstream, tier string) {
		t.Helper()
		before := getEngineReport(t, a.Addr()).KV.Stored
		direct(t, a, chatBody(false, text))
		testwait.For(t, 10*time.Second, "engine a's blocks mirrored", func() bool {
			r := getEngineReport(t, a.Addr())
			return r.KV.Stored > before && r.KV.Blocks > 0
		})
		s := send(ctx, "", chatBody(true, text), nil)
		if !s.complete() {
			t.Fatalf("request: %+v", s)
		}
		return s.header.Get("X-Llm-Upstream"), s.header.Get("X-Llm-Tier")
	}
	first := longText(300)
	if up, tier := routedTo(first); up != a.Addr() || tier != routing.Precise.String() {
		t.Fatalf("before the restart: routed to %s on tier %s, want %s precise", up, tier, a.Addr())
	}
	before := getEngineReport(t, a.Addr()).KV
	hitsBefore := metricValue(t, "llmgw_prefix_decisions_total", `tier="precise"`, `outcome="hit"`)

	if err := a.Restart(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "mirror reset and resubscribed", func() bool {
		r := getEngineReport(t, a.Addr()).KV
		return r != nil && r.Connected && r.Sessions > before.Sessions && r.Blocks == 0
	})
	// The first reconnection may reach the old publisher as it closes
	// (TestKVSubscriptionLifecycle): wait for the new one's subscriber.
	waitKV(t, a)
	// The dropped blocks are not claimed: the old prompt matches nothing.
	if c := explainFor(t, chatBody(false, first), a.Addr()); c.MatchedBlocks != 0 {
		t.Fatalf("after the restart the mirror still claims %d blocks of the old prompt: %+v", c.MatchedBlocks, c)
	}

	second := "another conversation " + longText(300)
	if up, tier := routedTo(second); up != a.Addr() || tier != routing.Precise.String() {
		t.Fatalf("after the restart: routed to %s on tier %s, want %s precise", up, tier, a.Addr())
	}
	if v := metricValue(t, "llmgw_prefix_decisions_total", `tier="precise"`, `outcome="hit"`); v <= hitsBefore {
		t.Errorf("no precise hit counted after the restart (%v before, %v after)", hitsBefore, v)
	}
	r := getEngineReport(t, a.Addr()).KV
	t.Logf("after restart: sessions %d→%d, resyncs %v, blocks %d", before.Sessions, r.Sessions, r.Resyncs, r.Blocks)
}

// TestReliabilityKVPublisherFaults: an engine's KV-event publisher that is
// silent, sends garbage, announces oversized frames, or numbers its
// messages backwards or with holes. In every case the gateway keeps
// serving the engine (routing falls back where it must), the subscription
// stays supervised (re-dialled, never stuck), and the mirror resets rather
// than claim blocks it cannot vouch for. The publisher is a fake ZMTP peer
// the llm app's kv_events points at.
func TestReliabilityKVPublisherFaults(t *testing.T) {
	type env struct {
		e   *vllmsim.Engine
		pub *relFakePub
	}
	content := longText(120)
	getKV := func(t *testing.T, v env) *fleet.KVReport {
		t.Helper()
		r := getEngineReport(t, v.e.Addr()).KV
		if r == nil {
			t.Fatal("no KV report: the subscription is gone")
		}
		return r
	}
	// sendBatch writes one message [topic "", seq, BlockStored tokens] on
	// the session conn.
	sendBatch := func(t *testing.T, c net.Conn, seq uint64, tokens []uint64, firstHash uint64) {
		t.Helper()
		if _, err := c.Write(relZMessage("", seq, relBlockStored(t, tokens, 16, firstHash))); err != nil {
			t.Fatal(err)
		}
	}
	waitKV := func(t *testing.T, v env, what string, cond func(r *fleet.KVReport) bool) *fleet.KVReport {
		t.Helper()
		var last *fleet.KVReport
		testwait.For(t, 15*time.Second, what, func() bool {
			last = getKV(t, v)
			return cond(last)
		})
		return last
	}
	small := make([]uint64, 16)
	for i := range small {
		small[i] = uint64(90000 + i)
	}

	for _, tc := range []struct {
		name  string
		greet bool
		after func(c net.Conn)
		check func(t *testing.T, v env)
	}{
		{
			name: "silent_tcp", // accepts, never greets: the probe times out
			check: func(t *testing.T, v env) {
				r := waitKV(t, v, "two failed probes", func(r *fleet.KVReport) bool { return r.DialErrors >= 2 })
				if r.Connected || r.Sessions != 0 || r.Blocks != 0 || !strings.Contains(r.LastError, "probe") {
					t.Errorf("silent peer: %+v", *r)
				}
			},
		},
		{
			name: "silent_zmtp", greet: true, // handshakes, then says nothing
			check: func(t *testing.T, v env) {
				v.pub.session(t, 15*time.Second)
				waitKV(t, v, "connected", func(r *fleet.KVReport) bool { return r.Connected })
				// The silence is the input under test, so this waits for
				// time to pass: past the handshake deadline (the dial
				// timeout), which a connected session must have cleared.
				time.Sleep(zmqsub.DefaultDialTimeout + time.Second)
				r := getKV(t, v)
				if !r.Connected || r.Sessions != 1 || r.Blocks != 0 || r.LastSeq != nil {
					t.Errorf("silence is not a failure (vLLM is quiet when idle): %+v", *r)
				}
			},
		},
		{
			name: "garbage_bytes", greet: true,
			after: func(c net.Conn) {
				b := make([]byte, 64<<10)
				for i := range b {
					b[i] = byte(rand.IntN(256))
				}
				_, _ = c.Write(b)
			},
			check: func(t *testing.T, v env) {
				r := waitKV(t, v, "three sessions (re-dialled after garbage)", func(r *fleet.KVReport) bool { return r.Sessions >= 3 })
				if r.Blocks != 0 || r.LastError == "" {
					t.Errorf("garbage: %+v", *r)
				}
				t.Logf("garbage: %d sessions, last error %q", r.Sessions, r.LastError)
			},
		},
		{
			name: "oversized_frame", greet: true,
			// A data frame announcing 1 GiB: allocatable, so without the
			// frame guard zmq4 would make([]byte, 1<<30) for every session.
			after: func(c net.Conn) { _, _ = c.Write([]byte{relZFlagLong, 0, 0, 0, 0, 0x40, 0, 0, 0}) },
			check: func(t *testing.T, v env) {
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				r := waitKV(t, v, "three sessions refused", func(r *fleet.KVReport) bool {
					return r.Sessions >= 3 && !r.Connected
				})
				var after runtime.MemStats
				runtime.ReadMemStats(&after)
				if !strings.Contains(r.LastError, "frame announces") || r.Blocks != 0 {
					t.Errorf("oversized frame: %+v", *r)
				}
				if d := after.TotalAlloc - before.TotalAlloc; d > 512<<20 {
					t.Errorf("allocated %d MiB while refusing 1 GiB frames", d>>20)
				}
				t.Logf("oversized: %d sessions, last error %q", r.Sessions, r.LastError)
			},
		},
		{
			name: "garbage_payload", greet: true, // valid frames, undecodable batch
			check: func(t *testing.T, v env) {
				c := v.pub.session(t, 15*time.Second)
				tokens := engineTokens(t, v.e, content)
				sendBatch(t, c, 0, tokens, 1000)
				n := len(tokens) / 16
				waitKV(t, v, "blocks mirrored", func(r *fleet.KVReport) bool { return r.Blocks == n })
				if _, err := c.Write(relZMessage("", 1, []byte("\xc1 this is not msgpack"))); err != nil {
					t.Fatal(err)
				}
				r := waitKV(t, v, "decode error resets the mirror", func(r *fleet.KVReport) bool {
					return r.DecodeErrors >= 1 && r.Resyncs["decode"] >= 1
				})
				if r.Blocks != 0 {
					t.Fatalf("after an undecodable batch the mirror claims %d blocks", r.Blocks)
				}
				if m := explainFor(t, chatBody(false, content), v.e.Addr()); m.MatchedBlocks != 0 {
					t.Fatalf("explain still matches %d blocks", m.MatchedBlocks)
				}
				sendBatch(t, c, 2, small, 5000) // the stream goes on
				waitKV(t, v, "next batch applied", func(r *fleet.KVReport) bool { return r.Blocks == 1 })
			},
		},
		{
			name: "sequence_backwards", greet: true, // a restarted engine numbers from 0
			check: func(t *testing.T, v env) {
				c := v.pub.session(t, 15*time.Second)
				tokens := engineTokens(t, v.e, content)
				sendBatch(t, c, 10, tokens, 1000)
				n := len(tokens) / 16
				waitKV(t, v, "blocks mirrored", func(r *fleet.KVReport) bool { return r.Blocks == n })
				m := explainFor(t, chatBody(false, content), v.e.Addr())
				if m.Tier != routing.Precise.String() || m.MatchedBlocks != n {
					t.Fatalf("explain before: %+v, want precise with %d blocks", m, n)
				}
				sendBatch(t, c, 3, small, 5000)
				r := waitKV(t, v, "restart reset", func(r *fleet.KVReport) bool {
					return r.Resyncs["restart"] >= 1 && r.LastSeq != nil && *r.LastSeq == 3
				})
				if r.Blocks != 1 {
					t.Fatalf("after seq 10 → 3 the mirror holds %d blocks, want only the new one", r.Blocks)
				}
				if m := explainFor(t, chatBody(false, content), v.e.Addr()); m.MatchedBlocks != 0 {
					t.Fatalf("explain after: still matches %d blocks", m.MatchedBlocks)
				}
			},
		},
		{
			name: "sequence_gap", greet: true, // no replay endpoint: a hole resets
			check: func(t *testing.T, v env) {
				c := v.pub.session(t, 15*time.Second)
				tokens := engineTokens(t, v.e, content)
				sendBatch(t, c, 3, tokens, 1000)
				n := len(tokens) / 16
				waitKV(t, v, "blocks mirrored", func(r *fleet.KVReport) bool { return r.Blocks == n })
				sendBatch(t, c, 10, small, 5000)
				r := waitKV(t, v, "gap reset", func(r *fleet.KVReport) bool {
					return r.Resyncs["gap"] >= 1 && r.LastSeq != nil && *r.LastSeq == 10
				})
				if r.Blocks != 1 {
					t.Fatalf("after seq 3 → 10 the mirror holds %d blocks, want only the new one", r.Blocks)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEngines(t, 1, vllmsim.Config{})[0]
			pub := newRelFakePub(t, tc.greet, tc.after)
			gateway{
				engines: []gatewayEngine{{dial: e.Addr(), kv: pub.endpoint()}},
				policy:  "\t\t\tdebug_headers\n",
			}.load(t)
			t.Cleanup(func() { resetGateway(t) })
			v := env{e: e, pub: pub}
			tc.check(t, v)

			// The gateway serves the engine throughout.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Counted at the engine: a request that parked (when a scrape
			// caught the previous one waiting in the engine's queue) has
			// its headers out before it reaches an upstream, so it carries
			// no X-Llm-Upstream.
			served := e.Stats().RequestsServed
			for i := range 3 {
				s := send(ctx, "", chatBody(true, content), nil)
				if !s.complete() {
					t.Fatalf("request %d during the fault: %+v", i, s)
				}
				if i == 0 {
					t.Logf("served on tier %s", s.header.Get("X-Llm-Tier"))
				}
			}
			testwait.For(t, 5*time.Second, "the engine to count the 3 requests served", func() bool {
				return e.Stats().RequestsServed >= served+3
			})
			if res, err := client.Get("http://" + adminAddr + "/llm/engines"); err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("admin API after the fault: %v", err)
			} else {
				res.Body.Close()
			}
		})
	}
}
