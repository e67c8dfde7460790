package fleet

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// clockedFleet is manualFleet on a test clock.
func clockedFleet(t *testing.T, engines ...*EngineConfig) (*Fleet, *testclock.Clock) {
	t.Helper()
	clk := testclock.New(time.Unix(1_000_000, 0))
	f := New(zap.NewNop(), Options{ManualScrape: true, Now: clk.Now})
	t.Cleanup(f.Close)
	f.Start(f.NewGeneration(testConfig(engines...), zap.NewNop()))
	return f, clk
}

// drain records n completions on dial now, its first request sent 100 s
// before: its drain rate becomes n / 10 s (the estimator's time constant,
// over a watch long enough that its span does not count) on a clock that
// then stands still.
func drain(f *Fleet, clk *testclock.Clock, dial string, n int) {
	e := f.Registry().Ensure(dial)
	first := e.Reserve()
	clk.Advance(100 * time.Second)
	for range n - 1 {
		e.Reserve().Done()
	}
	first.Done()
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
	f, clk := clockedFleet(t, &EngineConfig{Dial: hot, MaxInflight: 4}, &EngineConfig{Dial: cold, MaxInflight: 4})
	dials := deadDials[:2]
	lim := Limits{KV: 0.9}
	drain(f, clk, hot, 50)
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
		{"short prefix goes cold", strings.Repeat("short ", 70), cold, ReasonMoved},
	} {
		f.Unrouted(chatRequest(t, nil, tc.prefix), nil).Commit(hot)
		p := placedOn(t, f, dials, tc.prefix+" and a question of its own")
		if p.Holder != hot {
			t.Fatalf("%s: holder %q, want %s", tc.name, p.Holder, hot)
		}
		res, failOpen, ok := p.Reserve(dials, lim, admission.PassAny)
		if !ok || failOpen || res.Engine().Dial() != tc.want || p.Reason != tc.reason {
			t.Fatalf("%s: ok=%v failOpen=%v engine %v reason %q (wait %v, bound %v), want %s/%s",
				tc.name, ok, failOpen, res.Engine().Dial(), p.Reason, p.Wait, p.WaitBound, tc.want, tc.reason)
		}
		// The first case's reservation ended: one completion more.
		if p.Wait < 190*time.Millisecond || p.Wait > 200*time.Millisecond {
			t.Errorf("%s: expected wait %v, want 200ms", tc.name, p.Wait)
		}
		if d, ok := p.Pick(dials); !ok || dials[d.Index] != tc.want {
			t.Errorf("%s: the policy is told %v (ok %v), want %s", tc.name, d.Index, ok, tc.want)
		}
		res.Done() // no Sent: the hot engine's load is as before
	}
}

// TestPlacedSlotWaitPredicted: a request admission places beyond its
// engine's batch (here at a full holder worth waiting for) is predicted
// the wait for a slot, (requests beyond the batch + 1) ÷ the drain rate,
// on top of what routing predicts for it with a slot.
func TestPlacedSlotWaitPredicted(t *testing.T) {
	hot, cold := deadDials[0], deadDials[1]
	f, clk := clockedFleet(t, &EngineConfig{Dial: hot, MaxInflight: 4}, &EngineConfig{Dial: cold, MaxInflight: 4})
	dials := deadDials[:2]
	drain(f, clk, hot, 50) // 5/s on the standing clock
	prefix := strings.Repeat("the shared system prompt ", 480)
	f.Unrouted(chatRequest(t, nil, prefix), nil).Commit(hot)
	predicted := func(running float64, reason string) float64 {
		t.Helper()
		scrape(f, hot, upstreams.Gauges{Running: running})
		scrape(f, cold, upstreams.Gauges{Running: 0})
		p := placedOn(t, f, dials, prefix+" and a question of its own")
		res, _, ok := p.Reserve(dials, Limits{KV: 0.9}, admission.PassAny)
		if !ok || res.Engine().Dial() != hot || p.Reason != reason {
			t.Fatalf("%v running: ok=%v engine %v reason %q, want %s/%s", running, ok, res.Engine(), p.Reason, hot, reason)
		}
		defer res.Done() // one completion more: the rate becomes 5.1/s
		pick, ok := p.Pick(dials)
		if !ok || !(pick.Predicted > 0) {
			t.Fatalf("%v running: pick ok=%v, predicted %v", running, ok, pick.Predicted)
		}
		return pick.Predicted
	}
	withSlot := predicted(3, ReasonHit)
	beyond := predicted(4, ReasonHitWait)
	if d := beyond - withSlot; d < 0.19 || d > 0.2 {
		t.Errorf("a request beyond the batch is predicted %.3f s more than one with a slot, want 1 ÷ 5.1/s = 0.196 s", d)
	}
}

// TestPlacedSlotWaitBehindWorkAhead: the prefills ahead of a request go
// on while it waits for a batch slot, so it is predicted the longer of
// the two, not both: with 0.3 s of prefill pending at the holder (3,000
// tokens at the default rate) a wait of 0.2 s for a slot adds nothing.
func TestPlacedSlotWaitBehindWorkAhead(t *testing.T) {
	hot, cold := deadDials[0], deadDials[1]
	f, clk := clockedFleet(t, &EngineConfig{Dial: hot, MaxInflight: 4}, &EngineConfig{Dial: cold, MaxInflight: 4})
	dials := deadDials[:2]
	drain(f, clk, hot, 50) // 5/s
	prefix := strings.Repeat("the shared system prompt ", 960)
	f.Unrouted(chatRequest(t, nil, prefix), nil).Commit(hot)
	pending := f.Registry().Ensure(hot).Reserve()
	pending.Sent()
	pending.Work(3000)
	defer pending.Done()
	predicted := func(running float64, reason string) (ttft, slot float64) {
		t.Helper()
		scrape(f, hot, upstreams.Gauges{Running: running}) // the pending request is one of them
		scrape(f, cold, upstreams.Gauges{Running: 0})
		p := placedOn(t, f, dials, prefix+" and a question of its own")
		res, _, ok := p.Reserve(dials, Limits{KV: 0.9}, admission.PassAny)
		if !ok || res.Engine().Dial() != hot || p.Reason != reason {
			t.Fatalf("%v running: ok=%v engine %v reason %q, want %s/%s", running, ok, res.Engine(), p.Reason, hot, reason)
		}
		defer res.Done()
		pick, ok := p.Pick(dials)
		if !ok || !(pick.Predicted > 0) || !(pick.Ahead >= 0.25) {
			t.Fatalf("%v running: pick ok=%v, predicted %v, ahead %v (want ≥ 0.25 s)", running, ok, pick.Predicted, pick.Ahead)
		}
		return pick.Predicted, pick.slotWait
	}
	withSlot, _ := predicted(3, ReasonHit)
	beyond, slot := predicted(4, ReasonHitWait)
	if slot != 0 || math.Abs(beyond-withSlot) > 0.02 {
		t.Errorf("beyond the batch: predicted %.3f s (slot wait %.3f), with a slot %.3f s: want the same, the 0.2 s wait hidden by 0.3 s of work ahead", beyond, slot, withSlot)
	}
}

// TestSlotWait: the wait for a batch slot counts the requests beyond the
// batch as admission counts them, plus the request, at the drain rate.
func TestSlotWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    upstreams.Load
		lim  Limits
		want float64
	}{
		{"within the batch", upstreams.Load{Running: 3, MaxInflight: 4, DrainRate: 2}, Limits{}, 0},
		{"the last slot beyond", upstreams.Load{Running: 4, MaxInflight: 4, DrainRate: 2}, Limits{}, 0.5},
		{"dispatched and waiting count", upstreams.Load{Running: 4, Waiting: 1, Dispatched: 1, MaxInflight: 4, DrainRate: 2}, Limits{}, 1.5},
		{"finished since the scrape leave", upstreams.Load{Running: 4, Waiting: 1, Finished: 1, MaxInflight: 4, DrainRate: 2}, Limits{}, 0.5},
		{"the gauges alone", upstreams.Load{Running: 4, Dispatched: 3, MaxInflight: 4, DrainRate: 2}, Limits{IgnoreDispatched: true}, 0.5},
		{"the limits' max_inflight", upstreams.Load{Running: 4, DrainRate: 2}, Limits{MaxInflight: 2}, 1.5},
		{"no limit", upstreams.Load{Running: 40, DrainRate: 2}, Limits{}, 0},
		{"no drain rate", upstreams.Load{Running: 8, MaxInflight: 4}, Limits{}, 0},
		{"a rate decayed near zero", upstreams.Load{Running: 8, MaxInflight: 4, DrainRate: 1e-300}, Limits{}, 3600},
	} {
		if got := slotWait(tc.l, tc.lim); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// holderFleet is two engines of max_inflight 4 running hot and cold
// requests, the first of them (dials[0]) holding text's prefix.
func holderFleet(t *testing.T, hot, cold float64) (f *Fleet, dials []string, text string) {
	t.Helper()
	dials = deadDials[:2]
	f, _ = clockedFleet(t, &EngineConfig{Dial: dials[0], MaxInflight: 4}, &EngineConfig{Dial: dials[1], MaxInflight: 4})
	scrape(f, dials[0], upstreams.Gauges{Running: hot})
	scrape(f, dials[1], upstreams.Gauges{Running: cold})
	text = strings.Repeat("the shared system prompt ", 100)
	f.Unrouted(chatRequest(t, nil, text), nil).Commit(dials[0])
	return f, dials, text
}

// TestPlacedHolderFirst: a holder with room takes its request even when
// another engine has more room; with PassPreferred a full holder not
// worth waiting for means no reservation at all, however free the rest.
func TestPlacedHolderFirst(t *testing.T) {
	f, dials, text := holderFleet(t, 3, 0)
	hot := dials[0]
	lim := Limits{KV: 0.9}
	p := placedOn(t, f, dials, text+" question")
	res, _, ok := p.Reserve(dials, lim, admission.PassPreferred)
	if !ok || res.Engine().Dial() != hot || p.Reason != ReasonHit {
		t.Fatalf("holder with room: ok=%v reason %q", ok, p.Reason)
	}
	// The holder is now full (3 running + 1 dispatched) and has no drain
	// rate: no wait is worth it.
	if res2, _, ok := p.Reserve(dials, lim, admission.PassPreferred); ok {
		t.Fatalf("PassPreferred reserved on %s with the holder full", res2.Engine().Dial())
	}
	res.Done()
}

// starvation is the starvation test's model: two engines of two slots,
// each request running svc, admission through a real gate on the test
// clock.
type starvation struct {
	t        *testing.T
	f        *Fleet
	clk      *testclock.Clock
	g        *admission.Gate
	dials    []string
	hot      map[string]string // dial -> the prefix it holds
	run      []starvationReq
	admitted []*upstreams.Reservation
}

type starvationReq struct {
	res *upstreams.Reservation
	end time.Time
}

const starvationSvc = time.Second

func newStarvation(t *testing.T, aging time.Duration) *starvation {
	a, b := deadDials[0], deadDials[1]
	f, clk := clockedFleet(t, &EngineConfig{Dial: a, MaxInflight: 2}, &EngineConfig{Dial: b, MaxInflight: 2})
	m := &starvation{t: t, f: f, clk: clk, g: admission.NewGateClock(admission.Config{Aging: aging}, clk.Now),
		dials: deadDials[:2], hot: map[string]string{a: strings.Repeat("group a ", 40), b: strings.Repeat("group b ", 40)}}
	for d, text := range m.hot {
		f.Unrouted(chatRequest(t, nil, text), nil).Commit(d)
	}
	m.scrape()
	return m
}

// enter places a request and passes it through the gate, as the handler does.
func (m *starvation) enter(text string) *admission.Waiter {
	p := placedOn(m.t, m.f, m.dials, text)
	w, err := m.g.EnterPlaced(admission.Normal, func(pass admission.Pass) bool {
		res, _, ok := p.Reserve(m.dials, Limits{KV: 0.9}, pass)
		if ok {
			m.admitted = append(m.admitted, res)
		}
		return ok
	})
	if err != nil {
		m.t.Fatal(err)
	}
	return w
}

// dispatch starts what the gate admitted, as the policy and the engine do.
func (m *starvation) dispatch() {
	for _, res := range m.admitted {
		m.run = append(m.run, starvationReq{m.f.Proxied(res.Engine().Dial()).Dispatch(res), m.clk.Now().Add(starvationSvc)})
	}
	m.admitted = m.admitted[:0]
}

// finish ends the requests whose time is up.
func (m *starvation) finish() {
	keep := m.run[:0]
	for _, r := range m.run {
		if m.clk.Now().Before(r.end) {
			keep = append(keep, r)
		} else {
			r.res.Done()
		}
	}
	m.run = keep
}

func (m *starvation) scrape() {
	for _, d := range m.dials {
		n := countOn(m.run, d, func(r starvationReq) string { return r.res.Engine().Dial() })
		scrape(m.f, d, upstreams.Gauges{Running: float64(n)})
	}
}

// starvationRun: both engines busy when one cold request (no holder)
// parks, then a backlog of hot requests for the two holders, and more
// arrive at exactly the fleet's capacity, so every freed slot has a hot
// waiter whose holder it is. It returns how long the cold request waited,
// or -1 when it was still parked after 20 s.
func starvationRun(t *testing.T, aging time.Duration) time.Duration {
	const step, end = 10 * time.Millisecond, 20 * time.Second
	m := newStarvation(t, aging)
	for i := range 4 { // both engines busy, finishing over the first service time
		m.enter("warm-up " + strings.Repeat("x", i))
		m.dispatch()
		m.run[i].end = m.clk.Now().Add(starvationSvc * time.Duration(i+1) / 4)
	}
	cold := m.enter("a cold prompt nobody holds")
	if isReady(cold) {
		t.Fatal("the cold request was admitted with both engines busy")
	}
	for i := range 4 { // a backlog of hot waiters behind it, two per holder
		m.enter(m.hot[m.dials[i%2]] + " an early question " + strings.Repeat("e", i))
	}
	start := m.clk.Now()
	for i := 0; m.clk.Now().Sub(start) < end; i++ {
		m.clk.Advance(step)
		m.finish()
		if i%25 == 0 { // hot arrivals at capacity: 4 per second
			m.enter(m.hot[m.dials[(i/25)%2]] + " a question " + strings.Repeat("q", i%7))
			m.scrape()
		}
		m.g.Kick()
		m.dispatch()
		if isReady(cold) {
			return cold.Waited()
		}
	}
	return -1
}

func countOn[T any](xs []T, dial string, of func(T) string) int {
	n := 0
	for _, x := range xs {
		if of(x) == dial {
			n++
		}
	}
	return n
}

func isReady(w *admission.Waiter) bool {
	select {
	case <-w.Ready():
		return true
	default:
		return false
	}
}

// TestColdRequestNotStarved is issue 12's starvation test: hot requests
// take every slot that frees on their holder ahead of an older cold
// request; once the cold one has aged it takes the next free slot, so it
// is admitted within aging plus one service time. Without aging it waits
// for as long as the hot stream lasts: the bound is aging's doing.
func TestColdRequestNotStarved(t *testing.T) {
	const aging, svc = 2 * time.Second, time.Second
	w := starvationRun(t, aging)
	t.Logf("cold request admitted after %v with aging %v", w, aging)
	if w < 0 || w > aging+svc {
		t.Fatalf("cold request admitted after %v (-1: never), want within aging + one service time (%v)", w, aging+svc)
	}
	if w := starvationRun(t, -1); w >= 0 {
		t.Fatalf("without aging the cold request was admitted after %v: the test does not starve it", w)
	}
}

// TestExplainShowsWaitBound: /llm/explain's admission part names the
// holder and, for a full holder, the expected wait and its bound; and how
// long a long prompt would occupy its engine.
func TestExplainShowsWaitBound(t *testing.T) {
	hot, cold := deadDials[0], deadDials[1]
	f, clk := clockedFleet(t, &EngineConfig{Dial: hot, MaxInflight: 4}, &EngineConfig{Dial: cold, MaxInflight: 4})
	s := DefaultSettings()
	s.Tokenize = false
	f.SetPolicy(upstreams.DefaultPool, s)
	f.LearnPool(f.running, upstreams.DefaultPool, deadDials[:2])
	drain(f, clk, hot, 50)
	scrape(f, hot, upstreams.Gauges{Running: 4})
	scrape(f, cold, upstreams.Gauges{})
	text := strings.Repeat("the shared system prompt ", 480)
	f.Unrouted(chatRequest(t, nil, text), nil).Commit(hot)
	ex, err := f.Explain(context.Background(), chatRequest(t, nil, text+" a question"), upstreams.DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	a := ex.Admission
	if a == nil || a.Holder != hot || !a.HolderFull || !a.WouldWait || a.ExpectedWait <= 0 || a.WaitBound <= a.ExpectedWait {
		t.Fatalf("explain's admission part %+v, want the full holder %s with a wait below its bound", a, hot)
	}
	if a.LongPrefill != 0 {
		t.Fatalf("a ~3,000-token prompt shows a long prefill of %v s", a.LongPrefill)
	}
	// ~20,000 tokens, ~17,000 of them not at the holder: 1.7 s at 10,000/s.
	ex, err = f.Explain(context.Background(), chatRequest(t, nil, text+strings.Repeat(" a long question", 4300)), upstreams.DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	if a = ex.Admission; a == nil || a.LongPrefill < 1.5 || a.LongPrefill > 2 {
		t.Fatalf("explain's admission part %+v, want a long prefill of ~1.7 s", a)
	}
}

// TestPlacedColdWithoutHolder: a prompt no engine holds has no affinity to
// keep: its admission is "cold", not "moved" (which counts affinity
// broken).
func TestPlacedColdWithoutHolder(t *testing.T) {
	f, _ := clockedFleet(t, &EngineConfig{Dial: deadDials[0], MaxInflight: 4}, &EngineConfig{Dial: deadDials[1], MaxInflight: 4})
	dials := deadDials[:2]
	scrape(f, deadDials[0], upstreams.Gauges{Running: 1})
	scrape(f, deadDials[1], upstreams.Gauges{Running: 2})
	p := placedOn(t, f, dials, strings.Repeat("a prompt nobody has seen ", 100))
	if p.Holder != "" {
		t.Fatalf("holder %q for a prompt no engine holds", p.Holder)
	}
	res, _, ok := p.Reserve(dials, Limits{KV: 0.9}, admission.PassAny)
	if !ok || p.Reason != ReasonCold {
		t.Fatalf("ok=%v reason %q, want %q", ok, p.Reason, ReasonCold)
	}
	res.Done()
}

// TestLongPrefillOccupiesEngine: a request whose uncached prompt is over
// the long-prefill threshold holds its engine as full for its prefill
// (uncached tokens over the prefill rate): a short request whose prefix
// lives there goes elsewhere meanwhile and back once the prefill is over;
// the hold ends with the request, and a negative threshold turns it off.
func TestLongPrefillOccupiesEngine(t *testing.T) {
	a, b := deadDials[0], deadDials[1]
	f, clk := clockedFleet(t, &EngineConfig{Dial: a, MaxInflight: 4}, &EngineConfig{Dial: b, MaxInflight: 4})
	dials := deadDials[:2]
	scrape(f, a, upstreams.Gauges{})
	scrape(f, b, upstreams.Gauges{})
	hot := strings.Repeat("a hot system prompt ", 20) // ~100 tokens, held by a
	f.Unrouted(chatRequest(t, nil, hot), nil).Commit(a)
	long := strings.Repeat("a long document ", 1000) // ~4,000 uncached tokens
	lim := Limits{KV: 0.9, LongPrefill: 2000, PrefillRate: 1000}

	tryHot := func(step, want, reason string) {
		t.Helper()
		p := placedOn(t, f, dials, hot+" and a question")
		res, _, ok := p.Reserve(dials, lim, admission.PassAny)
		if !ok || res.Engine().Dial() != want || p.Reason != reason || p.Occupies != 0 {
			t.Fatalf("%s: ok=%v engine %v reason %q occupies %v, want %s/%s", step, ok, res.Engine().Dial(), p.Reason, p.Occupies, want, reason)
		}
		res.Done()
	}
	tryHot("before", a, ReasonHit)

	p := placedOn(t, f, []string{a}, long)
	res, _, ok := p.Reserve([]string{a}, lim, admission.PassAny)
	if !ok || res.Engine().Dial() != a {
		t.Fatalf("long prompt: ok=%v engine %v", ok, res.Engine().Dial())
	}
	// The prompt is the whole request body in bytes over 4: ~4,000 tokens.
	if p.Occupies < 3*time.Second || p.Occupies > 5*time.Second {
		t.Fatalf("long prompt occupies %v, want ~4s (4,000 tokens at 1,000/s)", p.Occupies)
	}
	if got := f.Registry().Ensure(a).Load().Occupied; got != p.Occupies {
		t.Fatalf("engine occupied %v, want %v", got, p.Occupies)
	}
	tryHot("during the long prefill", b, ReasonMoved)
	clk.Advance(p.Occupies)
	tryHot("after the long prefill", a, ReasonHit)

	res.Occupy(time.Minute) // as if still prefilling
	res.Done()
	tryHot("after the long request ended", a, ReasonHit)

	lim.LongPrefill = -1
	p = placedOn(t, f, []string{a}, long)
	res, _, _ = p.Reserve([]string{a}, lim, admission.PassAny)
	defer res.Done()
	if p.Occupies != 0 || f.Registry().Ensure(a).Load().Occupied != 0 {
		t.Fatalf("long_prefill -1: occupies %v", p.Occupies)
	}
}

// TestEngineQueueKeepsAffinity: with an engine queue (Limits.EngineQueue)
// both engines are full but may each queue one request. A request whose
// prefix the hot engine holds queues there, not at the cold engine; with
// the holder's queue taken too it gets no place in the cold engine's
// queue; a request nobody holds any of takes the cold engine's.
func TestEngineQueueKeepsAffinity(t *testing.T) {
	f, dials, text := holderFleet(t, 4, 4)
	hot, cold := dials[0], dials[1]
	lim := Limits{KV: 0.9, EngineQueue: 1}
	p := placedOn(t, f, dials, text+" question")
	first, _, ok := p.Reserve(dials, lim, admission.PassAny)
	if !ok || first.Engine().Dial() != hot || p.Reason != ReasonHit {
		t.Fatalf("a hit with the holder's queue free: ok=%v engine %v reason %q, want %s/%s", ok, first.Engine(), p.Reason, hot, ReasonHit)
	}
	defer first.Done()
	if res, _, ok := placedOn(t, f, dials, text+" another question").Reserve(dials, lim, admission.PassAny); ok {
		t.Fatalf("a hit took %s's queue with its holder's queue full", res.Engine().Dial())
	}
	res, _, ok := placedOn(t, f, dials, "a prompt nobody holds any of").Reserve(dials, lim, admission.PassAny)
	if !ok || res.Engine().Dial() != cold {
		t.Fatalf("a cold request: ok=%v engine %v, want the cold engine's queue", ok, res.Engine())
	}
	res.Done()
}

// TestWaitCountsEviction: a cold copy of a prefix into a full cache evicts
// as many cached tokens, which a later request may prefill again, so the
// wait a full holder is worth grows by them (at most the prefix again).
// The holder frees a slot in 1/6 s; the cold engine, idle, would prefill
// the 1,024-token prefix in 0.1 s (the default 10,000 tokens/s): with
// room in its cache the request goes there; with its cache full by its
// events (and its num_gpu_blocks known) the 0.2 s bound makes the wait
// worth it.
func TestWaitCountsEviction(t *testing.T) {
	hot, cold := deadDials[0], deadDials[1]
	f, clk := clockedFleet(t, &EngineConfig{Dial: hot, MaxInflight: 4}, &EngineConfig{Dial: cold, MaxInflight: 4})
	dials := deadDials[:2]
	for _, d := range dials {
		if _, err := f.index.AddEngine(d, kvindex.MirrorConfig{}); err != nil {
			t.Fatal(err)
		}
		f.index.Mirror(d).SetCapacity(200)
	}
	prompt := tokens(3, 1024, 1) // 1,024 shared and 64 of its own
	feedEvents(t, f, hot, groupStored(prompt[:1024], 0, ""))
	drain(f, clk, hot, 60) // 6/s on the standing clock
	scrape(f, hot, upstreams.Gauges{Running: 4})
	s := DefaultSettings()
	s.Tokenize = false
	for _, tc := range []struct {
		name       string
		coldBlocks int // blocks cold's cache holds, of 200
		sizeKnown  bool
		want       string
		reason     string
		evicts     int
	}{
		{"room in the cold cache", 100, true, cold, ReasonMoved, 0},
		// 68 blocks stored where none are free: 1,088 tokens evicted,
		// counted up to the 1,024 of the prefix.
		{"the cold cache full", 200, true, hot, ReasonHitWait, 1024},
		// 150 + 68 - 200: 18 blocks evicted, 288 tokens: 0.13 s.
		{"the cold cache nearly full", 150, true, cold, ReasonMoved, 288},
		// The mirror at its bound says nothing of an engine whose
		// num_gpu_blocks its gauges do not show.
		{"the cache's size unknown", 200, false, cold, ReasonMoved, 0},
	} {
		g := upstreams.Gauges{}
		if tc.sizeKnown {
			g.BlockSize, g.NumGPUBlocks = 16, 200
		}
		scrape(f, cold, g)
		f.index.Mirror(cold).Reset("test") // (the earlier case's blocks)
		feedEvents(t, f, cold, groupStored(tokens(9, 16*tc.coldBlocks, 0)[:16*tc.coldBlocks], 0, ""))
		p := f.Place(context.Background(), Query{Request: chatRequest(t, nil, "unused"), Dials: dials, Settings: s, Tokens: prompt})
		if p == nil || p.Holder != hot {
			t.Fatalf("%s: placement %+v, want the holder %s", tc.name, p, hot)
		}
		res, _, ok := p.Reserve(dials, Limits{KV: 0.9}, admission.PassAny)
		if !ok || res.Engine().Dial() != tc.want || p.Reason != tc.reason || p.Evicts != tc.evicts {
			t.Fatalf("%s: ok=%v engine %v reason %q (wait %v, bound %v, %d evicted), want %s/%s, %d evicted",
				tc.name, ok, res.Engine().Dial(), p.Reason, p.Wait, p.WaitBound, p.Evicts, tc.want, tc.reason, tc.evicts)
		}
		res.Done()
	}
}

// TestWaitCountsFewStalled: the wait a full holder is worth counts a cold
// copy's stall for at most maxStalled sequences of the cold batch. The
// holder of a 1,024-token prefix (0.1 s of prefill at the default rate)
// frees a slot every 1/drain s; the cold engine has room beside b running
// sequences. With 16 running, counting them all made a 0.5 s wait worth
// it (bound 1.7 s), where it now loses to the cold copy (bound 0.3 s).
func TestWaitCountsFewStalled(t *testing.T) {
	hot, cold := deadDials[0], deadDials[1]
	dials := deadDials[:2]
	prompt := tokens(3, 1024, 1) // 1,024 shared and 64 of its own
	s := DefaultSettings()
	s.Tokenize = false
	for _, tc := range []struct {
		name        string
		completions int // in the drain's 10 s
		coldRunning int
		want        string
		bound       time.Duration
	}{
		{"idle cold engine, 0.25 s wait", 40, 0, cold, 102 * time.Millisecond},
		{"two running, 0.25 s wait", 40, 2, hot, 307 * time.Millisecond},
		{"sixteen running, 0.25 s wait", 40, 16, hot, 307 * time.Millisecond},
		{"sixteen running, 0.5 s wait", 20, 16, cold, 307 * time.Millisecond},
	} {
		f, clk := clockedFleet(t, &EngineConfig{Dial: hot, MaxInflight: 4}, &EngineConfig{Dial: cold, MaxInflight: 32})
		if _, err := f.index.AddEngine(hot, kvindex.MirrorConfig{}); err != nil {
			t.Fatal(err)
		}
		feedEvents(t, f, hot, groupStored(prompt[:1024], 0, ""))
		drain(f, clk, hot, tc.completions)
		scrape(f, hot, upstreams.Gauges{Running: 4})
		scrape(f, cold, upstreams.Gauges{Running: float64(tc.coldRunning)})
		p := f.Place(context.Background(), Query{Request: chatRequest(t, nil, "unused"), Dials: dials, Settings: s, Tokens: prompt})
		if p == nil || p.Holder != hot {
			t.Fatalf("%s: placement %+v, want the holder %s", tc.name, p, hot)
		}
		res, _, ok := p.Reserve(dials, Limits{KV: 0.9}, admission.PassAny)
		if !ok || res.Engine().Dial() != tc.want {
			t.Fatalf("%s: ok=%v engine %v (wait %v, bound %v), want %s", tc.name, ok, res.Engine().Dial(), p.Wait, p.WaitBound, tc.want)
		}
		if d := p.WaitBound - tc.bound; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("%s: bound %v, want %v", tc.name, p.WaitBound, tc.bound)
		}
		res.Done()
	}
}
