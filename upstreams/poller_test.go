package upstreams

import (
	"context"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestPollerFailureModesStaleAndRecovery(t *testing.T) {
	tests := []struct {
		mode    string
		wantErr string
	}{
		{mode500, "HTTP 500"},
		{modeHang, "deadline exceeded"},
		{modeHTML, "looks like HTML"},
		{modeGarbage, "parse metrics"},
		{modeHuge, "too large"},
		{modeMissing, "missing series"},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			f := newFakeEngine(t)
			f.set(5, 2, 0.5)
			var updates atomic.Int64
			o := fastOpts()
			if tc.mode == modeHang {
				o.PollTimeout = 300 * time.Millisecond
			}
			o.OnUpdate = func(dial string) {
				if dial == f.dial() {
					updates.Add(1)
				}
			}
			r := NewRegistry(o)
			defer r.Close()
			r.Apply([]EngineConfig{{Dial: f.dial(), MaxInflight: 10}}, o)
			e, ok := r.Get(f.dial())
			if !ok {
				t.Fatal("engine not registered")
			}
			testwait.For(t, 15*time.Second, "first scrape", func() bool { return e.Load().Known })
			if l := e.Load(); l.Running != 5 || l.Waiting != 2 || l.KVUsage != 0.5 || l.BlockSize != 16 || l.NumGPUBlocks != 1000 || l.Degraded {
				t.Fatalf("load after first scrape: %+v", l)
			}

			for episode := 1; episode <= 2; episode++ {
				f.setMode(tc.mode)
				// Below StaleAfter the last good values stay known.
				testwait.For(t, 15*time.Second, "a failed poll", func() bool { return e.Load().Failures >= 1 })
				testwait.For(t, 15*time.Second, "stale", func() bool { return e.Load().Stale })
				l := e.Load()
				if l.Known || !strings.Contains(l.LastError, tc.wantErr) {
					t.Fatalf("stale load: %+v, want error containing %q", l, tc.wantErr)
				}
				if l.Degraded {
					t.Fatal("a later failure must not mark the self-check degraded")
				}
				// More failures do not count the transition again.
				testwait.For(t, 15*time.Second, "more failures", func() bool { return e.Load().Failures >= o.StaleAfter+2 })
				if got := r.StaleTransitions(); got != uint64(episode) {
					t.Fatalf("StaleTransitions = %d, want %d", got, episode)
				}
				f.setMode(modeOK)
				testwait.For(t, 15*time.Second, "recovery", func() bool { return e.Load().Known })
				if l := e.Load(); l.Failures != 0 || l.LastError != "" || l.Stale {
					t.Fatalf("after recovery: %+v", l)
				}
			}
			if updates.Load() < int64(2*(o.StaleAfter+2)) {
				t.Fatalf("OnUpdate called %d times", updates.Load())
			}
		})
	}
}

func TestStaleBeforeFirstSuccessIsCounted(t *testing.T) {
	f := newFakeEngine(t)
	f.setMode(mode500)
	o := fastOpts()
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: f.dial()}}, o)
	e, _ := r.Get(f.dial())
	testwait.For(t, 15*time.Second, "stale", func() bool { return e.Load().Stale })
	if r.StaleTransitions() != 1 {
		t.Fatalf("StaleTransitions = %d", r.StaleTransitions())
	}
	if l := e.Load(); l.Known || !l.ScrapedAt.IsZero() || l.Age != 0 {
		t.Fatalf("never-scraped load: %+v", l)
	}
}

func TestSelfCheckDegradedLoggedOnce(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	f := newFakeEngine(t)
	f.setMode(modeMissing)
	good := newFakeEngine(t)
	o := fastOpts()
	o.Logger = zap.New(core)
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: f.dial()}, {Dial: good.dial()}}, o)
	e, _ := r.Get(f.dial())
	testwait.For(t, 15*time.Second, "several failed polls", func() bool { return e.Load().Failures >= 5 })
	if l := e.Load(); !l.Degraded || !strings.Contains(l.LastError, metricWaiting) {
		t.Fatalf("load: %+v", l)
	}
	testwait.For(t, 15*time.Second, "good engine known", func() bool { ge, _ := r.Get(good.dial()); return ge.Load().Known })
	if r.Degraded() != 1 {
		t.Fatalf("Degraded() = %d, want 1", r.Degraded())
	}
	errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(errs) != 1 || errs[0].ContextMap()["engine"] != f.dial() {
		t.Fatalf("ERROR logs: %+v", errs)
	}
	f.setMode(modeOK)
	testwait.For(t, 15*time.Second, "self-check passes", func() bool { return !e.Load().Degraded })
	if r.Degraded() != 0 || !e.Load().Known {
		t.Fatalf("Degraded() = %d, load %+v", r.Degraded(), e.Load())
	}
	if n := logs.FilterMessage("engine metrics self-check now passes").Len(); n != 1 {
		t.Fatalf("recovery logged %d times", n)
	}
}

func TestScrapeSendsHeadersAndRedactsNothingSecret(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	f := newFakeEngine(t)
	f.setMode(mode500)
	o := fastOpts()
	o.Logger = zap.New(core)
	r := NewRegistry(o)
	defer r.Close()
	h := http.Header{"Authorization": {"Bearer s3cret-key"}}
	r.Apply([]EngineConfig{{Dial: f.dial(), Header: h, MetricsURL: f.srv.URL + "/metrics?token=s3cret-q"}}, o)
	e, _ := r.Get(f.dial())
	testwait.For(t, 15*time.Second, "stale", func() bool { return e.Load().Stale })
	if f.auth() != "Bearer s3cret-key" {
		t.Fatalf("Authorization = %q", f.auth())
	}
	h.Set("Authorization", "mutated") // the registry holds its own copy
	if got := e.Config().Header.Get("Authorization"); got != "Bearer s3cret-key" {
		t.Fatalf("config header aliased caller's map: %q", got)
	}
	for _, entry := range logs.All() {
		for k, v := range entry.ContextMap() {
			if s, ok := v.(string); ok && strings.Contains(s, "s3cret") {
				t.Fatalf("secret logged in %q: %q", k, s)
			}
		}
	}
}

// pollOnceT runs one scrape on an engine of a registry that is not running,
// so tests control scrape timing exactly; its epoch begins as it starts.
func pollOnceT(e *Engine) {
	var buf, scratch []byte
	e.scrapeSince(context.Background(), e.markEpoch(), &buf, &scratch)
}

func TestLocalAccounting(t *testing.T) {
	f := newFakeEngine(t)
	f.set(4, 1, 0.3)
	g := newFakeEngine(t)
	g.set(0, 0, 0.1)
	var mu sync.Mutex
	updates := map[string]int{}
	o := Options{OnUpdate: func(d string) { mu.Lock(); updates[d]++; mu.Unlock() }}
	r := NewRegistry(o)
	defer r.Close()
	a := r.Ensure(f.dial())
	b := r.Ensure(g.dial())
	a.mu.Lock()
	a.cfg.MaxInflight = 10
	a.mu.Unlock()

	check := func(step string, e *Engine, inflight, dispatched int64) {
		t.Helper()
		if l := e.Load(); l.Inflight != inflight || l.Dispatched != dispatched {
			t.Fatalf("%s: %s inflight=%d dispatched=%d, want %d/%d", step, e.Dial(), l.Inflight, l.Dispatched, inflight, dispatched)
		}
	}

	// Unknown gauges: free is a local hint only.
	r1, r2, r3 := a.Reserve(), a.Reserve(), a.Reserve()
	check("3 reserved", a, 3, 3)
	if free, known := a.Free(0.9); known || free != 7 {
		t.Fatalf("unknown Free = %d,%v want 7,false", free, known)
	}
	r1.Sent()
	r2.Sent()
	r3.Sent() // at the engine: the next scrape shows them
	pollOnceT(a)
	check("after scrape", a, 3, 0)
	if free, known := a.Free(0.9); !known || free != 10-(4+1) {
		t.Fatalf("Free = %d,%v", free, known)
	}
	r4 := a.Reserve()
	check("reserve after scrape", a, 4, 1)
	if free, _ := a.Free(0.9); free != 10-(4+1+1) {
		t.Fatalf("Free = %d", free)
	}
	r1.Done() // was visible in the gauges already: only inflight drops
	check("done old", a, 3, 1)
	r4.Done() // finished before any scrape saw it
	check("done new", a, 2, 0)
	r4.Done()
	check("done twice", a, 2, 0)

	// A failed scrape does not reset Dispatched.
	r5 := a.Reserve()
	f.setMode(mode500)
	pollOnceT(a)
	check("failed scrape", a, 3, 1)
	f.setMode(modeOK)

	// Move: the policy picked b.
	r5.Move(b)
	check("moved from", a, 2, 0)
	check("moved to", b, 1, 1)
	if r5.Engine() != b {
		t.Fatal("Engine() after Move")
	}
	r5.Move(b)
	r5.Move(nil)
	check("no-op moves", b, 1, 1)
	r5.Done()
	check("done moved", b, 0, 0)
	r5.Move(a)
	check("move after done", a, 2, 0)
	r2.Done()
	r3.Done()
	check("all done", a, 0, 0)

	mu.Lock()
	if updates[a.Dial()] < 6 || updates[b.Dial()] < 1 {
		t.Fatalf("OnUpdate counts: %v", updates)
	}
	mu.Unlock()

	// Drain rate: 4 completions on a in quick succession, read over at
	// least drainMinWindow (see TestDrainEstimator).
	if dr := a.Load().DrainRate; !(dr > 0 && dr <= 4/(drainTau.Seconds()*-math.Expm1(-drainMinWindow.Seconds()/drainTau.Seconds()))+1e-9) {
		t.Fatalf("DrainRate = %v", dr)
	}
}

func TestDispatchedDuringScrapeSurvivesIt(t *testing.T) {
	f := newFakeEngine(t)
	f.set(1, 0, 0.1)
	f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 1)
	r := NewRegistry(Options{})
	defer r.Close()
	e := r.Ensure(f.dial())
	before := e.Reserve()
	before.Sent()
	done := make(chan struct{})
	go func() { defer close(done); pollOnceT(e) }()
	<-f.arrived
	during := e.Reserve() // the engine's page may already be rendered without it
	during.Sent()
	brief := e.Reserve()
	brief.Done() // finished while the scrape was in flight: never counted again
	close(f.gate)
	<-done
	if l := e.Load(); !l.Known || l.Inflight != 2 || l.Dispatched != 1 {
		t.Fatalf("load: %+v", l)
	}
	before.Done()
	during.Done()
	if l := e.Load(); l.Inflight != 0 || l.Dispatched != 0 {
		t.Fatalf("after done: %+v", l)
	}
}

func TestFree(t *testing.T) {
	f := newFakeEngine(t)
	r := NewRegistry(Options{})
	defer r.Close()
	e := r.Ensure(f.dial())
	if free, known := e.Free(0.9); known || free != Unlimited {
		t.Fatalf("unknown, no limit: %d %v", free, known)
	}
	tests := []struct {
		name          string
		run, wait, kv float64
		max, reserved int
		kvLimit       float64
		wantFree      int
	}{
		{"room", 3, 2, 0.5, 10, 0, 0.9, 5},
		{"dispatched counts", 3, 2, 0.5, 10, 4, 0.9, 1},
		{"over the cap floors at 0", 9, 5, 0.5, 10, 1, 0.9, 0},
		{"KV at the limit", 0, 0, 0.9, 10, 0, 0.9, 0},
		{"KV limit disabled", 0, 0, 0.99, 10, 0, 0, 10},
		{"no request limit", 50, 50, 0.5, 0, 3, 0.9, Unlimited},
		{"no request limit, KV full", 50, 50, 0.95, 0, 0, 0.9, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f.set(tc.run, tc.wait, tc.kv)
			e.mu.Lock()
			e.cfg.MaxInflight = tc.max
			e.mu.Unlock()
			pollOnceT(e)
			var rs []*Reservation
			for range tc.reserved {
				rs = append(rs, e.Reserve())
			}
			free, known := e.Free(tc.kvLimit)
			for _, x := range rs {
				x.Done()
			}
			if !known || free != tc.wantFree {
				t.Fatalf("Free = %d,%v want %d,true", free, known, tc.wantFree)
			}
		})
	}
}

func TestPollIntervalHotUpdate(t *testing.T) {
	f := newFakeEngine(t)
	o := Options{PollInterval: time.Hour}
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: f.dial()}}, o)
	testwait.For(t, 15*time.Second, "first scrape", func() bool { return f.hits.Load() == 1 })
	o.PollInterval = 10 * time.Millisecond
	r.Apply([]EngineConfig{{Dial: f.dial()}}, o) // must wake the hour-long wait
	testwait.For(t, 15*time.Second, "faster polling", func() bool { return f.hits.Load() >= 5 })
}

// TestManualScrape: with ManualScrape no poller runs, even for configured
// engines, and StartScrape/record applies gauges and the dispatched and
// finished accounting exactly as a poll does.
func TestManualScrape(t *testing.T) {
	var updates atomic.Int64
	onUpdate := func(string) { updates.Add(1) }
	r := NewRegistry(Options{ManualScrape: true})
	defer r.Close()
	// An address nothing listens on: a poller would mark it failed.
	r.Apply([]EngineConfig{{Dial: "127.0.0.1:1", MaxInflight: 4}}, Options{PollInterval: time.Millisecond, StaleAfter: 1, OnUpdate: onUpdate})
	e, _ := r.Get("127.0.0.1:1")
	time.Sleep(20 * time.Millisecond) // twenty poll intervals: long enough for a poller to have failed
	if l := e.Load(); l.Known || l.Failures != 0 || l.Degraded {
		t.Fatalf("before any manual scrape: %+v, want unknown with no failures (no poller ran)", l)
	}

	before := e.Reserve()
	before.Sent()
	record := e.StartScrape()
	during := e.Reserve() // made after the scrape started: not in its gauges
	during.Sent()
	record(Gauges{Running: 1, Waiting: 1, KVUsage: 0.5, BlockSize: 16, NumGPUBlocks: 100})
	l := e.Load()
	if !l.Known || l.Running != 1 || l.Waiting != 1 || l.KVUsage != 0.5 || l.BlockSize != 16 || l.NumGPUBlocks != 100 {
		t.Fatalf("after record: %+v", l)
	}
	if l.Dispatched != 1 || l.Inflight != 2 {
		t.Fatalf("dispatched=%d inflight=%d, want 1 (the request after the scrape's start) and 2", l.Dispatched, l.Inflight)
	}
	before.Done() // the scrape counted it: its slot is free at once
	if l := e.Load(); l.Finished != 1 || l.Dispatched != 1 {
		t.Fatalf("after Done: finished=%d dispatched=%d, want 1 and 1", l.Finished, l.Dispatched)
	}
	if free, known := e.Free(0.9); free != 4-1-1 || !known {
		// running 1 + waiting 1 − finished 1 + dispatched 1 = 2 used of 4.
		t.Fatalf("free=%d known=%v, want 2/true", free, known)
	}
	e.StartScrape()(Gauges{Running: 1})
	if l := e.Load(); l.Finished != 0 || l.Dispatched != 0 {
		t.Fatalf("after the next scrape: finished=%d dispatched=%d, want 0 and 0", l.Finished, l.Dispatched)
	}
	if updates.Load() < 3 {
		t.Fatalf("OnUpdate called %d times, want one per record and per Done", updates.Load())
	}
	during.Done()
}
