package upstreams

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// workerLog records Worker starts and stops per dial.
type workerLog struct {
	mu     sync.Mutex
	starts map[string]int
	stops  map[string]int
	cfgs   map[string]EngineConfig // config seen at the latest start
}

func newWorkerLog() *workerLog {
	return &workerLog{starts: map[string]int{}, stops: map[string]int{}, cfgs: map[string]EngineConfig{}}
}

func (w *workerLog) worker(ctx context.Context, e *Engine) {
	w.mu.Lock()
	w.starts[e.Dial()]++
	w.cfgs[e.Dial()] = e.Config()
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	w.stops[e.Dial()]++
	w.mu.Unlock()
}

func (w *workerLog) counts(dial string) (starts, stops int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.starts[dial], w.stops[dial]
}

func (w *workerLog) cfg(dial string) EngineConfig {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cfgs[dial]
}

func runHandleOf(r *Registry, e *Engine) *runHandle {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return e.run
}

func dials(es []*Engine) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Dial())
	}
	return out
}

func TestApplyAddKeepRemoveRestart(t *testing.T) {
	fa, fb, fc := newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)
	fa.set(7, 0, 0.2)
	wl := newWorkerLog()
	o := fastOpts()
	o.Worker = wl.worker
	r := NewRegistry(o)
	defer r.Close()

	r.Apply([]EngineConfig{{Dial: fa.dial(), MaxInflight: 8}, {Dial: fb.dial(), Pool: "p1"}}, o)
	a, _ := r.Get(fa.dial())
	b, _ := r.Get(fb.dial())
	testwait.For(t, 15*time.Second, "both known", func() bool { return a.Load().Known && b.Load().Known })
	testwait.For(t, 15*time.Second, "workers started", func() bool { s1, _ := wl.counts(fa.dial()); s2, _ := wl.counts(fb.dial()); return s1 == 1 && s2 == 1 })
	if c := b.Config(); !c.Static || c.Pool != "p1" || c.MetricsURL != "http://"+fb.dial()+"/metrics" || c.TokenizeURL != "http://"+fb.dial()+"/tokenize" {
		t.Fatalf("config defaults: %+v", c)
	}
	if c := a.Config(); c.Pool != DefaultPool {
		t.Fatalf("default pool: %q", c.Pool)
	}
	runA := runHandleOf(r, a)
	ra := a.Reserve()

	// Same configs, new tunables and MaxInflight: nothing restarts.
	o2 := fastOpts()
	o2.PollInterval = 15 * time.Millisecond
	r.Apply([]EngineConfig{{Dial: fa.dial(), MaxInflight: 9}, {Dial: fb.dial(), Pool: "p1"}}, o2)
	if a2, _ := r.Get(fa.dial()); a2 != a || runHandleOf(r, a) != runA {
		t.Fatal("kept engine was replaced or its poller restarted")
	}
	if s, st := wl.counts(fa.dial()); s != 1 || st != 0 {
		t.Fatalf("worker A starts/stops = %d/%d", s, st)
	}
	if l := a.Load(); l.MaxInflight != 9 || l.Inflight != 1 || !l.Known || l.Running != 7 {
		t.Fatalf("kept engine state: %+v", l)
	}

	// Remove B (configured, never used), add C.
	r.Apply([]EngineConfig{{Dial: fa.dial(), MaxInflight: 9}, {Dial: fc.dial()}}, o2)
	if _, ok := r.Get(fb.dial()); ok {
		t.Fatal("removed static engine still registered")
	}
	if s, st := wl.counts(fb.dial()); s != 1 || st != 1 {
		t.Fatalf("worker B starts/stops = %d/%d (Apply must wait for the stop)", s, st)
	}
	if got, want := dials(r.Engines()), slices.Sorted(slices.Values([]string{fa.dial(), fc.dial()})); !slices.Equal(got, want) {
		t.Fatalf("Engines() = %v, want %v", got, want)
	}
	c, _ := r.Get(fc.dial())
	testwait.For(t, 15*time.Second, "C known", func() bool { return c.Load().Known })

	// Config change on A: poller and worker restart, same *Engine, state kept.
	hdr := http.Header{"Authorization": {"Bearer k2"}}
	r.Apply([]EngineConfig{{Dial: fa.dial(), MaxInflight: 9, Header: hdr}, {Dial: fc.dial()}}, o2)
	if a2, _ := r.Get(fa.dial()); a2 != a || runHandleOf(r, a) == runA {
		t.Fatal("changed engine: want same *Engine with a new poller")
	}
	testwait.For(t, 15*time.Second, "worker A restarted", func() bool { s, st := wl.counts(fa.dial()); return s == 2 && st == 1 })
	if wl.cfg(fa.dial()).Header.Get("Authorization") != "Bearer k2" {
		t.Fatal("restarted worker did not see the new config")
	}
	testwait.For(t, 15*time.Second, "new header used", func() bool { return fa.auth() == "Bearer k2" })
	if l := a.Load(); l.Inflight != 1 {
		t.Fatalf("accounting lost across restart: %+v", l)
	}
	ra.Done()

	// Removing A while it has a request in flight demotes it to dynamic.
	rb := a.Reserve()
	r.Apply([]EngineConfig{{Dial: fc.dial()}}, o2)
	if a2, ok := r.Get(fa.dial()); !ok || a2 != a || a.Config().Static {
		t.Fatal("in-use removed engine should be kept as dynamic")
	}
	if _, st := wl.counts(fa.dial()); st != 1 {
		t.Fatal("demoted engine's worker must keep running")
	}
	rb.Done()

	// Invalid and duplicate configs are skipped.
	r.Apply([]EngineConfig{{Dial: fc.dial()}, {Dial: ""}, {Dial: fc.dial(), Pool: "dup"}, {Dial: "x:1", MetricsURL: "ftp://x/metrics"}}, o2)
	if _, ok := r.Get("x:1"); ok {
		t.Fatal("invalid config registered")
	}
	if c.Config().Pool != DefaultPool {
		t.Fatal("duplicate config should be ignored")
	}

	// A removed static engine that was recently used stays, as dynamic.
	r.Ensure(fc.dial())
	r.Apply(nil, o2)
	if c2, ok := r.Get(fc.dial()); !ok || c2 != c || c.Config().Static {
		t.Fatal("recently used removed engine should be kept as dynamic")
	}
}

func TestEnsureAndGC(t *testing.T) {
	fa, fb, fc := newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)
	wl := newWorkerLog()
	o := fastOpts()
	// Idle time is read from the registry's clock: the test ages engines
	// by advancing it and collects them itself, sleeping nowhere. The
	// registry's own collection runs every 15s of wall time, beyond the
	// test's, and would decide the same.
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	o.Now = clk.Now
	o.IdleTTL = time.Minute
	o.Worker = wl.worker
	r := NewRegistry(o)
	defer r.Close()
	collect := func() { r.collect(context.Background()) }

	// Before the first Apply nothing runs.
	a := r.Ensure(fa.dial())
	if r.Ensure(fa.dial()) != a {
		t.Fatal("Ensure must return the registered engine")
	}
	if runHandleOf(r, a) != nil || a.Config().Static {
		t.Fatal("Ensure before Apply must not start a poller; engine is dynamic")
	}
	r.Apply(nil, o)
	testwait.For(t, 15*time.Second, "pre-Apply engine polled", func() bool { return a.Load().Known })

	b := r.Ensure(fb.dial())
	c := r.Ensure(fc.dial())
	testwait.For(t, 15*time.Second, "dynamic engines polled", func() bool { return b.Load().Known && c.Load().Known })
	rc := c.Reserve()

	// a is used again within IdleTTL; b is not; c has a request in flight.
	clk.Advance(40 * time.Second)
	r.Ensure(fa.dial())
	clk.Advance(30 * time.Second)
	collect()
	if _, ok := r.Get(fb.dial()); ok {
		t.Fatal("engine idle for 70s of a 60s IdleTTL was not collected")
	}
	testwait.For(t, 15*time.Second, "b's worker stopped", func() bool { _, st := wl.counts(fb.dial()); return st == 1 })
	if _, ok := r.Get(fa.dial()); !ok {
		t.Fatal("engine in use was collected")
	}
	if _, ok := r.Get(fc.dial()); !ok {
		t.Fatal("engine with a request in flight was collected")
	}
	rc.Done() // uses c: idle from now
	clk.Advance(61 * time.Second)
	r.Ensure(fa.dial())
	collect()
	if _, ok := r.Get(fc.dial()); ok {
		t.Fatal("c not collected an IdleTTL after its request was done")
	}
	if _, ok := r.Get(fa.dial()); !ok {
		t.Fatal("engine in use was collected")
	}

	// A collected dial comes back as a fresh engine.
	b2 := r.Ensure(fb.dial())
	if b2 == b {
		t.Fatal("collected engine reused")
	}
	testwait.For(t, 15*time.Second, "b2 polled", func() bool { return b2.Load().Known })
	if s, _ := wl.counts(fb.dial()); s != 2 {
		t.Fatalf("worker b starts = %d", s)
	}
}

func TestCloseStopsEverythingAndIsFinal(t *testing.T) {
	fa := newFakeEngine(t)
	wl := newWorkerLog()
	o := fastOpts()
	o.Worker = wl.worker
	r := NewRegistry(o)
	r.Apply([]EngineConfig{{Dial: fa.dial()}}, o)
	a, _ := r.Get(fa.dial())
	testwait.For(t, 15*time.Second, "known", func() bool { return a.Load().Known })
	res := a.Reserve()
	r.Close()
	r.Close()
	if _, st := wl.counts(fa.dial()); st != 1 {
		t.Fatal("worker not stopped by Close")
	}
	hits := fa.hits.Load()
	r.Apply([]EngineConfig{{Dial: fa.dial()}}, o)
	d := r.Ensure("127.0.0.1:1")
	if len(r.Engines()) != 0 || runHandleOf(r, d) != nil {
		t.Fatal("Apply/Ensure after Close must not register or start engines")
	}
	res.Done() // still safe
	time.Sleep(100 * time.Millisecond)
	if fa.hits.Load() != hits {
		t.Fatal("polling continued after Close")
	}
	// goleak in TestMain proves no goroutine survived.
}

func TestConcurrentUse(t *testing.T) {
	fs := []*fakeEngine{newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)}
	o := fastOpts()
	o.IdleTTL = 30 * time.Millisecond
	o.Worker = func(ctx context.Context, e *Engine) { <-ctx.Done() }
	r := NewRegistry(o)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				e := r.Ensure(fs[(i+j)%3].dial())
				res := e.Reserve()
				if j%3 == 0 {
					res.Move(r.Ensure(fs[(i+j+1)%3].dial()))
				}
				_ = e.Load()
				_, _ = e.Free(0.9)
				res.Done()
				_ = r.Engines()
				_ = r.Degraded()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for j := range 30 {
			var cfgs []EngineConfig
			if j%2 == 0 {
				cfgs = append(cfgs, EngineConfig{Dial: fs[j%3].dial(), MaxInflight: j})
			}
			r.Apply(cfgs, o)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	wg.Wait()
	for _, e := range r.Engines() {
		if l := e.Load(); l.Inflight != 0 || l.Dispatched != 0 {
			t.Fatalf("%s leaked accounting: %+v", e.Dial(), l)
		}
	}
	r.Close()
}

func TestEngineConfigValidate(t *testing.T) {
	tests := []struct {
		cfg EngineConfig
		ok  bool
	}{
		{EngineConfig{Dial: "10.0.0.1:8000"}, true},
		{EngineConfig{Dial: "[::1]:8000"}, true},
		{EngineConfig{Dial: "h:1", MetricsURL: "https://h:9/m", TokenizeURL: "http://h:1/tokenize"}, true},
		{EngineConfig{Dial: " "}, false},
		{EngineConfig{Dial: "h:1", MaxInflight: -1}, false},
		{EngineConfig{Dial: "h:1", MetricsURL: "/metrics"}, false},
		{EngineConfig{Dial: "h:1", TokenizeURL: "ftp://h/tokenize"}, false},
		{EngineConfig{Dial: "h:1", MetricsURL: "http://%zz"}, false},
	}
	for _, tc := range tests {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
		}
	}
}

func TestEnsureOddDialsFailCleanly(t *testing.T) {
	o := fastOpts()
	r := NewRegistry(o)
	defer r.Close()
	r.Apply(nil, o)
	for _, d := range []string{"", "has space:80", "127.0.0.1:1", "%zz"} {
		e := r.Ensure(d)
		testwait.For(t, 15*time.Second, "failed poll for "+d, func() bool { l := e.Load(); return l.Failures > 0 && l.Degraded })
		if l := e.Load(); l.Known || l.LastError == "" {
			t.Fatalf("%q: %+v", d, l)
		}
	}
}

// TestApplyShorterIdleTTLTakesEffectNow is a regression test: the GC loop
// slept on the timer armed with the old IdleTTL (up to a minute), so a
// reload that shortened idle_ttl did not collect demoted engines in time.
func TestApplyShorterIdleTTLTakesEffectNow(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	defer srv.Close()
	dial := strings.TrimPrefix(srv.URL, "http://")
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	o := Options{PollInterval: time.Hour, IdleTTL: 10 * time.Minute, Now: clk.Now}
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: dial}}, o)
	r.Ensure(dial) // used recently: removal demotes it to dynamic
	r.Apply(nil, o)
	if _, ok := r.Get(dial); !ok {
		t.Fatal("recently used engine removed at once; want it demoted")
	}
	// The registry's own collection re-arms at once for the new IdleTTL
	// (every 50ms of wall time now, not every 2.5 minutes), and finds the
	// engine idle on its clock.
	o.IdleTTL = 20 * time.Millisecond
	r.Apply(nil, o)
	clk.Advance(time.Second)
	testwait.For(t, 5*time.Second, "the demoted engine collected after IdleTTL was shortened", func() bool {
		_, ok := r.Get(dial)
		return !ok
	})
}
