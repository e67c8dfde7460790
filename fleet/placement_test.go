package fleet

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// testClock is a manually advanced clock for drain rates and gates.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// clockedFleet is manualFleet on a test clock.
func clockedFleet(t *testing.T, engines ...*EngineConfig) (*Fleet, *testClock) {
	t.Helper()
	clk := &testClock{t: time.Unix(1_000_000, 0)}
	f := New(zap.NewNop(), Options{ManualScrape: true, Now: clk.Now})
	t.Cleanup(f.Close)
	f.Start(f.NewGeneration(testConfig(engines...), zap.NewNop()))
	return f, clk
}

// drain records n completions on dial now: its drain rate becomes
// n / 10 s (the estimator's time constant) on a clock that stands still.
func drain(f *Fleet, dial string, n int) {
	e := f.Registry().Ensure(dial)
	for range n {
		e.Reserve().Done()
	}
}

// placedOn places a request for text among dials, routing nothing: the
// approximate tree holds the prompt's prefix where the test said.
func placedOn(t *testing.T, f *Fleet, dials []string, text string) *Placement {
	t.Helper()
	s := DefaultSettings()
	s.Tokenize = false
	p := f.Place(context.Background(), Query{Request: chatRequest(t, nil, text), Dials: dials, Settings: s})
	if p == nil {
		t.Fatal("no placement")
	}
	return p
}

// TestPrefixHitWait is issue 12's prefix-hit-wait test: the prefix holder
// is full and frees a slot in 200 ms (drain rate 5/s), another engine is
// free. A request whose cached prefix would cost a cold engine more than
// 200 ms of prefill waits at the holder; one whose prefix is cheap to
// prefill takes the free engine.
func TestPrefixHitWait(t *testing.T) {
	hot, cold := deadDials[0], deadDials[1]
	f, _ := clockedFleet(t, &EngineConfig{Dial: hot, MaxInflight: 4}, &EngineConfig{Dial: cold, MaxInflight: 4})
	dials := deadDials[:2]
	lim := Limits{KV: 0.9}
	drain(f, hot, 50)
	scrape(f, hot, upstreams.Gauges{Running: 4})
	scrape(f, cold, upstreams.Gauges{Running: 0})
	for _, tc := range []struct {
		name   string
		prefix string
		want   string
		reason string
	}{
		// ~3,000 tokens, 0.7 credited (approximate tier): ~0.2 s × 1 saved > 0.2 s.
		{"long prefix waits", strings.Repeat("the shared system prompt ", 480), hot, ReasonHitWait},
		// ~100 tokens: ~7 ms of prefill saved < 0.2 s of wait.
		{"short prefix goes cold", strings.Repeat("short ", 70), cold, ReasonCold},
	} {
		f.Routed(chatRequest(t, nil, tc.prefix), Decision{}, hot)
		p := placedOn(t, f, dials, tc.prefix+" and a question of its own")
		if p.Holder != hot {
			t.Fatalf("%s: holder %q, want %s", tc.name, p.Holder, hot)
		}
		res, failOpen, ok := f.ReservePlaced(p, dials, lim, admission.PassAny)
		if !ok || failOpen || res.Engine().Dial() != tc.want || p.Reason != tc.reason {
			t.Fatalf("%s: ok=%v failOpen=%v engine %v reason %q (wait %v, bound %v), want %s/%s",
				tc.name, ok, failOpen, res.Engine().Dial(), p.Reason, p.Wait, p.WaitBound, tc.want, tc.reason)
		}
		// The first case's reservation ended: one completion more.
		if p.Wait < 190*time.Millisecond || p.Wait > 200*time.Millisecond {
			t.Errorf("%s: expected wait %v, want 200ms", tc.name, p.Wait)
		}
		if d, ok := p.Decision(dials); !ok || dials[d.Index] != tc.want {
			t.Errorf("%s: the policy is told %v (ok %v), want %s", tc.name, d.Index, ok, tc.want)
		}
		res.Done() // no Sent: the hot engine's load is as before
	}
}

// TestPlacedHolderFirst: a holder with room takes its request even when
// another engine has more room; with PassPreferred a full holder not
// worth waiting for means no reservation at all, however free the rest.
func TestPlacedHolderFirst(t *testing.T) {
	hot, cold := deadDials[0], deadDials[1]
	f, _ := clockedFleet(t, &EngineConfig{Dial: hot, MaxInflight: 4}, &EngineConfig{Dial: cold, MaxInflight: 4})
	dials := deadDials[:2]
	lim := Limits{KV: 0.9}
	scrape(f, hot, upstreams.Gauges{Running: 3})
	scrape(f, cold, upstreams.Gauges{Running: 0})
	text := strings.Repeat("the shared system prompt ", 100)
	f.Routed(chatRequest(t, nil, text), Decision{}, hot)
	p := placedOn(t, f, dials, text+" question")
	res, _, ok := f.ReservePlaced(p, dials, lim, admission.PassPreferred)
	if !ok || res.Engine().Dial() != hot || p.Reason != ReasonHit {
		t.Fatalf("holder with room: ok=%v reason %q", ok, p.Reason)
	}
	// The holder is now full (3 running + 1 dispatched) and has no drain
	// rate: no wait is worth it.
	if res2, _, ok := f.ReservePlaced(p, dials, lim, admission.PassPreferred); ok {
		t.Fatalf("PassPreferred reserved on %s with the holder full", res2.Engine().Dial())
	}
	res.Done()
}
