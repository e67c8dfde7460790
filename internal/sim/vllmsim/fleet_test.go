package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/zmtp"
	"go.uber.org/goleak"
)

func TestStartFleet(t *testing.T) {
	ctx := context.Background()
	engines, err := StartFleet(ctx, 3, Config{Model: "m", TimeScale: 100, KVEvents: &KVEventsConfig{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range engines {
			_ = e.Close()
		}
	})
	seen := map[string]bool{}
	c := newClient(t)
	for r, e := range engines {
		for _, a := range []string{e.Addr(), e.KVEndpoint(), e.ReplayEndpoint()} {
			if a == "" || seen[a] {
				t.Errorf("rank %d: endpoint %q empty or shared", r, a)
			}
			seen[a] = true
		}
		if e.Config().DPRank != r {
			t.Errorf("rank %d has DPRank %d", r, e.Config().DPRank)
		}
		resp, err := c.Get(e.URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if !strings.Contains(buf.String(), fmt.Sprintf(`engine="%d"`, r)) {
			t.Errorf("rank %d metrics lack engine label", r)
		}
	}
	if _, err := StartFleet(ctx, 0, Config{}); err == nil {
		t.Error("fleet of 0 started")
	}
}

func TestIPCEndpoint(t *testing.T) {
	ep := "ipc://" + t.TempDir() + "/kv.sock"
	e := startEngine(t, Config{TimeScale: 100, KVEvents: &KVEventsConfig{Endpoint: ep}})
	if e.KVEndpoint() != ep {
		t.Fatalf("KVEndpoint %q, want %q", e.KVEndpoint(), ep)
	}
	sub := dialSub(t, ep, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	complete(t, newClient(t), e.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("over a unix socket ", 8), "max_tokens": 1})
	if b := decodeBatch(t, sub.next(t, 5*time.Second)[2]); len(b.events) != 1 {
		t.Fatalf("events %v", b.events)
	}
	// The subscriber leaves: WaitKVSubscribers(0) sees it go.
	sub.c.Close()
	if err := e.WaitKVSubscribers(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Restart(); err != nil {
		t.Fatalf("restart on ipc: %v", err)
	}
}

func TestOffsetEndpoints(t *testing.T) {
	cases := []struct{ in, want string }{
		{"tcp://*:5557", "tcp://*:5559"},
		{"tcp://127.0.0.1:0", "tcp://127.0.0.1:0"},
		{"tcp://[::1]:6000", "tcp://[::1]:6002"},
		{"ipc:///tmp/kv", "ipc:///tmp/kv_dp2"},
		{"", ""},
	}
	for _, tc := range cases {
		if got, err := offsetEndpoint(tc.in, 2); err != nil || got != tc.want {
			t.Errorf("offsetEndpoint(%q, 2) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if got, _ := offsetHostPort("127.0.0.1:8000", 3); got != "127.0.0.1:8003" {
		t.Errorf("offsetHostPort = %q", got)
	}
	if _, err := offsetHostPort("127.0.0.1:65535", 1); err == nil {
		t.Error("port overflow accepted")
	}
}

func TestParseEndpoint(t *testing.T) {
	cases := []struct {
		in   string
		want endpoint
		err  bool
	}{
		{"tcp://*:5557", endpoint{"tcp", "10.1.1.1:5557", true}, false},
		{"tcp://127.0.0.1:5557", endpoint{"tcp", "127.0.0.1:5557", false}, false},
		{"tcp://127.0.0.1:0", endpoint{"tcp", "127.0.0.1:0", true}, false},
		{"tcp://[::]:5557", endpoint{"tcp", "[::]:5557", true}, false},
		{"ipc:///tmp/x.sock", endpoint{"unix", "/tmp/x.sock", true}, false},
		{"inproc://x", endpoint{}, true},
		{"tcp://nohost", endpoint{}, true},
		{"5557", endpoint{}, true},
	}
	for _, tc := range cases {
		got, err := parseEndpoint(tc.in, "10.1.1.1")
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseEndpoint(%q) = %+v, %v", tc.in, got, err)
		}
	}
}

// TestCloseLeavesNoGoroutines closes engines with streams in flight,
// subscribers and replay clients connected, and a hanging /metrics.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for range 3 {
		ctx := context.Background()
		e, err := Start(ctx, Config{DecodeStepTime: 10 * time.Millisecond, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}})
		if err != nil {
			t.Fatal(err)
		}
		sub := dialZMTP(t, e.KVEndpoint(), zmtp.Sub)
		rep := dialZMTP(t, e.ReplayEndpoint(), zmtp.Dealer)
		tr := &http.Transport{}
		c := &http.Client{Transport: tr}
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, _ := json.Marshal(map[string]any{"prompt": fmt.Sprint("stream ", i), "max_tokens": 10000, "stream": i%2 == 0})
				resp, err := c.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
				if err == nil {
					var buf bytes.Buffer
					_, _ = buf.ReadFrom(resp.Body)
					resp.Body.Close()
				}
			}()
		}
		e.SetFaults(Faults{Metrics: "hang"})
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := c.Get(e.URL() + "/metrics"); err == nil {
				resp.Body.Close()
			}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for e.Stats().Running < 4 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		tr.CloseIdleConnections()
		sub.Close()
		rep.Close()
		if err := e.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
}

// dialZMTP connects and completes a ZMTP handshake as sockType; the caller
// closes the connection.
func dialZMTP(t *testing.T, ep string, sockType string) net.Conn {
	t.Helper()
	e, err := parseEndpoint(ep, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout(e.network, e.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(context.Background(), c, sockType); err != nil {
		t.Fatal(err)
	}
	if sockType == zmtp.Sub {
		_, _ = c.Write(zmtp.AppendMessage(nil, []byte{1}))
	}
	return c
}

// TestPrefixAwareRoutingBeatsRandom runs the same shared-prefix workload
// through a 4-engine fleet twice: routed by prefix, and at random. The
// caches hold about 3 of the 8 system prompts each, so random routing
// thrashes them while prefix routing keeps every prompt cached.
func TestPrefixAwareRoutingBeatsRandom(t *testing.T) {
	if testing.Short() {
		t.Skip("workload comparison")
	}
	prefixHit, prefixTTFT := runRoutingWorkload(t, true)
	randomHit, randomTTFT := runRoutingWorkload(t, false)
	t.Logf("prefix routing: hit rate %.2f, mean TTFT %.3fs; random: hit rate %.2f, mean TTFT %.3fs", prefixHit, prefixTTFT, randomHit, randomTTFT)
	if !(prefixHit > randomHit+0.2) {
		t.Errorf("prefix-aware hit rate %.2f not clearly above random %.2f", prefixHit, randomHit)
	}
	if !(prefixTTFT < randomTTFT) {
		t.Errorf("prefix-aware mean TTFT %.3fs not below random %.3fs", prefixTTFT, randomTTFT)
	}
}

func runRoutingWorkload(t *testing.T, byPrefix bool) (hitRate, meanTTFT float64) {
	t.Helper()
	engines, err := StartFleet(context.Background(), 4, Config{NumGPUBlocks: 110, MaxNumSeqs: 8, PrefillTokensPerSec: 5000, TimeScale: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, e := range engines {
			_ = e.Close()
		}
	}()
	c := newClient(t)
	rng := rand.New(rand.NewPCG(1, 2))
	const groups, requests = 8, 160
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range requests {
		g := rng.IntN(groups)
		target := engines[rng.IntN(len(engines))]
		if byPrefix {
			target = engines[g%len(engines)]
		}
		system := fmt.Sprintf("system prompt %d: ", g) + strings.Repeat(fmt.Sprintf("rule%d is important. ", g), 120)
		body := map[string]any{"messages": []map[string]any{{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprint("question ", i)}}, "max_tokens": 4}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if st, out := postJSON(t, c, target.URL()+"/v1/chat/completions", body); st != 200 {
				t.Errorf("status %d: %s", st, out)
			}
		}()
	}
	wg.Wait()
	var q, h uint64
	var ttftSum float64
	var n uint64
	for _, e := range engines {
		st := e.Stats()
		q += st.PrefixCacheQueries
		h += st.CachedTokens
		e.mu.Lock()
		ttftSum += e.ctr.ttft.sum
		n += e.ctr.ttft.count
		e.mu.Unlock()
	}
	return float64(h) / float64(q), ttftSum / float64(n)
}

func TestSubscriberQueueLimits(t *testing.T) {
	s := &subConn{notify: make(chan struct{}, 1)}
	msg := make([]byte, 1<<20)
	if !s.enqueue(msg, 2) || !s.enqueue(msg, 2) {
		t.Fatal("queue refused below HWM")
	}
	if s.enqueue(msg, 2) {
		t.Error("queue accepted a message at HWM")
	}
	s = &subConn{notify: make(chan struct{}, 1)}
	n := 0
	for s.enqueue(msg, 1<<30) {
		n++
		if n > 1000 {
			t.Fatal("no byte limit")
		}
	}
	if n != maxQueueBytes/len(msg) {
		t.Errorf("%d messages of 1 MiB queued, want %d", n, maxQueueBytes/len(msg))
	}
}
