package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// relOurGoroutines lists the goroutines running code of this module (the
// fleet's pollers, KV subscriptions, kicker, engine simulators), other
// than test goroutines.
func relOurGoroutines() []string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "testing.tRunner") || strings.Contains(g, "relOurGoroutines") {
			continue
		}
		if strings.Contains(g, "llmgw/caddy-llmgw/") {
			out = append(out, g)
		}
	}
	return out
}

// relWaitNoOurGoroutines waits until relOurGoroutines is empty, and fails
// with their stacks when it is not within d.
func relWaitNoOurGoroutines(t *testing.T, what string, d time.Duration) {
	t.Helper()
	var left []string
	why := lazy(func() string {
		return fmt.Sprintf("%d goroutines of this module left:\n%s", len(left), strings.Join(left, "\n\n"))
	})
	for w := newWait(t, d, what+": no goroutine of this module").pace(50 * time.Millisecond); ; w.tick(why) {
		if left = relOurGoroutines(); len(left) == 0 {
			return
		}
	}
}

// relNoLLMApp loads a config without the llm app and its modules: the
// fleet's last reference goes, and it is destroyed.
func relNoLLMApp(t *testing.T) {
	t.Helper()
	gateway{noApp: true, respond: "no llm"}.load(t)
}

// TestReliabilityLifecycleGoroutines: config generations come and go
// (engines added and removed, KV subscriptions started and stopped, a
// reload changing settings, requests served), and afterwards the goroutine
// count is back at its baseline. Once no config uses the llm app, the
// fleet is destroyed and no goroutine of this module is left.
func TestReliabilityLifecycleGoroutines(t *testing.T) {
	relNoLLMApp(t)
	t.Cleanup(func() { resetGateway(t) })
	relWaitNoOurGoroutines(t, "before the cycles", 20*time.Second)
	client.CloseIdleConnections()
	baseGroups, base := goroutineGroups(), settledGoroutines()

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for cycle := range 4 {
		engines := make([]*vllmsim.Engine, 2)
		for i := range engines {
			e, err := vllmsim.Start(ctx, vllmsim.Config{TimeScale: 50, KVEvents: &vllmsim.KVEventsConfig{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0"}})
			if err != nil {
				t.Fatal(err)
			}
			engines[i] = e
		}
		g := gateway{engines: kvEngines(engines...), policy: "\t\t\tdebug_headers\n"}
		g.load(t)
		testwait.For(t, 10*time.Second, "subscriptions connected", func() bool {
			for _, e := range engines {
				if r := getEngineReport(t, e.Addr()); r.KV == nil || !r.KV.Connected {
					return false
				}
			}
			return true
		})
		for i := range 3 {
			if s := send(ctx, "", chat{user: fmt.Sprintf("cycle %d request %d %s", cycle, i, longText(40)), maxTokens: 8, stream: true}.body(), nil); !s.complete() {
				t.Fatalf("cycle %d: %+v", cycle, s)
			}
		}
		var ex map[string]any
		if code := adminJSON(t, http.MethodPost, "/llm/explain", chatBody(false, "explain me"), &ex); code != http.StatusOK {
			t.Fatalf("explain: %d", code)
		}
		// A reload that keeps one engine and drops the other.
		g.engines, g.upstreams = g.engines[:1], []string{engines[0].Addr()}
		g.appExtra = "\t\tidle_ttl 1ms\n"
		g.load(t)
		testwait.For(t, 10*time.Second, "dropped engine forgotten", func() bool {
			return getEngineReport(t, engines[1].Addr()).Dial == ""
		})
		relNoLLMApp(t)
		for _, e := range engines {
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
		}
		relWaitNoOurGoroutines(t, fmt.Sprintf("cycle %d, the llm app gone", cycle), 20*time.Second)
	}
	n := waitGoroutines(t, base+10, baseGroups, 30*time.Second)
	t.Logf("goroutines: %d at the baseline, %d after 4 cycles", base, n)
}
