package upstreams

import (
	"math"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
)

// TestWorkFollowsTheRequest: recorded work counts as prefill until the
// first token, as decoding until Done, and leaves an engine the request
// moves away from.
func TestWorkFollowsTheRequest(t *testing.T) {
	r := NewRegistry(Options{ManualScrape: true})
	t.Cleanup(r.Close)
	a, b := r.Ensure("a:1"), r.Ensure("b:1")
	own := func(e *Engine) (float64, int64, int64) {
		l := e.Load()
		return l.OwnPrefill, l.OwnPending, l.OwnDecoding
	}
	res := a.Reserve()
	res.Sent()
	res.Work(700)
	res.Work(500) // replaces
	if p, n, d := own(a); p != 500 || n != 1 || d != 0 {
		t.Fatalf("after Work: %v %d %d, want 500 1 0", p, n, d)
	}
	res.Move(b)
	if p, n, d := own(a); p != 0 || n != 0 || d != 0 {
		t.Fatalf("the old engine keeps work after Move: %v %d %d", p, n, d)
	}
	res.Work(300)
	res.Prefilled()
	res.Prefilled()
	if p, n, d := own(b); p != 0 || n != 0 || d != 1 {
		t.Fatalf("after the first token: %v %d %d, want 0 0 1", p, n, d)
	}
	res.Done()
	res.Work(100) // after Done: nothing
	if p, n, d := own(b); p != 0 || n != 0 || d != 0 {
		t.Fatalf("after Done: %v %d %d, want none", p, n, d)
	}
}

// TestMeanUncached: the mean uncached prompt is the token counters' delta
// over the prefill count's, kept while a window holds no request, and a
// restart (counters going down) starts over without a sample.
func TestMeanUncached(t *testing.T) {
	var p promptMean
	steps := []struct {
		s    promptSample
		want float64
	}{
		{promptSample{prompt: 1000, cached: 200, count: 2}, 0},     // first: a base only
		{promptSample{prompt: 5000, cached: 1200, count: 4}, 1500}, // (4000 − 1000) / 2
		{promptSample{prompt: 5100, cached: 1200, count: 4}, 1500}, // no request yet: kept
		{promptSample{prompt: 10, cached: 0, count: 1}, 1500},      // restart: new base
	}
	for i, st := range steps {
		p.observe(st.s)
		if got := p.estimate(); got != st.want {
			t.Fatalf("step %d: mean %v, want %v", i, got, st.want)
		}
	}
}

// TestPrefillDue: the prefill of a request whose first token the gateway
// will not see counts until its bound, then as decoding; Prefilled before
// the bound ends it at once, and Work drops the bound.
func TestPrefillDue(t *testing.T) {
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	r := NewRegistry(Options{ManualScrape: true, Now: clk.Now})
	t.Cleanup(r.Close)
	e := r.Ensure("a:1")
	res := e.Reserve()
	res.Sent()
	res.PrefillDue(time.Second) // no work yet: nothing to bound
	res.Work(800)
	res.PrefillDue(time.Second)
	clk.Advance(999 * time.Millisecond)
	if l := e.Load(); l.OwnPrefill != 800 || l.OwnPending != 1 {
		t.Fatalf("before the bound: own prefill %v pending %d, want 800 1", l.OwnPrefill, l.OwnPending)
	}
	clk.Advance(time.Millisecond)
	if l := e.Load(); l.OwnPrefill != 0 || l.OwnPending != 0 || l.OwnDecoding != 1 {
		t.Fatalf("at the bound: own prefill %v pending %d decoding %d, want 0 0 1", l.OwnPrefill, l.OwnPending, l.OwnDecoding)
	}
	res.Work(500) // a new record has no bound
	res.PrefillDue(0)
	clk.Advance(time.Hour)
	if l := e.Load(); l.OwnPrefill != 500 || l.OwnPending != 1 || l.OwnDecoding != 0 {
		t.Fatalf("a new record: own prefill %v pending %d decoding %d, want 500 1 0", l.OwnPrefill, l.OwnPending, l.OwnDecoding)
	}
	res.Done()
	if l := e.Load(); l.OwnPrefill != 0 || l.OwnPending != 0 || l.OwnDecoding != 0 {
		t.Fatalf("after Done: %+v", l)
	}
}

// TestOwnDue: an engine is busy with this gateway's prefills until the
// latest predicted first token among them, less any wait for a batch
// slot; overdue, the due time is unknown (0), and the record ends with
// the last pending prefill.
func TestOwnDue(t *testing.T) {
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	r := NewRegistry(Options{ManualScrape: true, Now: clk.Now})
	t.Cleanup(r.Close)
	e := r.Ensure("a:1")
	first, second := e.Reserve(), e.Reserve()
	first.Sent()
	second.Sent()
	first.Predict(0.5, 0) // no work recorded: nothing pending to be due
	if d := e.Load().OwnDue; d != 0 {
		t.Fatalf("due without work: %v, want 0", d)
	}
	first.Work(2000)
	if d := e.Load().OwnDue; d != 0 {
		t.Fatalf("due without a prediction: %v, want 0", d)
	}
	first.Predict(0.3, 0)
	clk.Advance(100 * time.Millisecond)
	second.Work(1000)
	second.Predict(0.15, 0) // due 0.1 + 0.15 = 0.25 s, before the first's 0.3
	if d := e.Load().OwnDue; d != 200*time.Millisecond {
		t.Fatalf("due %v, want 200ms (the later prediction)", d)
	}
	clk.Advance(time.Second)
	if d := e.Load().OwnDue; d != 0 {
		t.Fatalf("overdue: %v, want 0 (unknown)", d)
	}
	first.Prefilled()
	second.Prefilled()
	if d := e.Load().OwnDue; d != 0 {
		t.Fatalf("none pending: %v, want 0", d)
	}
	third := e.Reserve()
	third.Sent()
	third.Work(100)
	third.Predict(0.05, 0)
	if d := e.Load().OwnDue; d != 50*time.Millisecond {
		t.Fatalf("a new busy spell: %v, want 50ms (the old record gone)", d)
	}
	third.Predict(2.05, 2) // two seconds of it waiting for a batch slot
	if d := e.Load().OwnDue; d != 50*time.Millisecond {
		t.Fatalf("due %v with a slot wait, want 50ms: the wait is no prefill of the engine's", d)
	}
	if p, _, _ := third.Predicted(); p != 2.05 {
		t.Fatalf("predicted %v, want the whole 2.05 s", p)
	}
	third.Predict(math.Inf(1), 0)
	if d := e.Load().OwnDue; d != time.Hour {
		t.Fatalf("an infinite prediction: due %v, want the 1h bound", d)
	}
}

// TestOwnDueReanchored: a pending prefill's first token moves the due time
// of those sent behind it by how early or late it came, so that a steady
// stream of requests, one always pending, keeps the due time where the
// engine is instead of ratcheting it on; a request predicted to wait for
// a slot moves nothing.
func TestOwnDueReanchored(t *testing.T) {
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	r := NewRegistry(Options{ManualScrape: true, Now: clk.Now})
	t.Cleanup(r.Close)
	e := r.Ensure("a:1")
	send := func(ttft, slotWait float64) *Reservation {
		res := e.Reserve()
		res.Sent()
		res.Work(100)
		res.Predict(ttft, slotWait)
		return res
	}
	due := func(want time.Duration, what string) {
		t.Helper()
		if d := e.Load().OwnDue; d != want {
			t.Fatalf("%s: due %v, want %v", what, d, want)
		}
	}
	a := send(0.1, 0)
	b := send(0.2, 0) // behind a: due 0.1 s after a's
	clk.Advance(20 * time.Millisecond)
	a.Prefilled() // 80 ms early: b is too
	due(100*time.Millisecond, "a early")
	c := send(0.125, 0) // behind b (now due in 0.1 s), 0.025 s after it
	clk.Advance(150 * time.Millisecond)
	b.Prefilled() // 50 ms late: c is too, due 25 ms from now
	due(25*time.Millisecond, "b late")

	// A steady stream, one request always pending: each is predicted
	// behind the last and its first token comes as soon as the one ahead
	// of it is done. The due time stays one prefill ahead.
	prev := c
	for i := range 50 {
		next := send(e.Load().OwnDue.Seconds()+0.025, 0)
		clk.Advance(10 * time.Millisecond)
		prev.Prefilled()
		if d := e.Load().OwnDue; d > 40*time.Millisecond {
			t.Fatalf("request %d: due %v, ratcheting on", i, d)
		}
		prev = next
	}
	prev.Prefilled()
	due(0, "none pending")

	// Responses not streamed show no first token, but one that ends
	// before its due bounds it; one that ends after says nothing.
	p := send(0.3, 0)
	q := send(0.4, 0)
	s := send(0.6, 0)
	clk.Advance(100 * time.Millisecond)
	p.Done() // 200 ms early at least: s is due at 0.4 s
	due(300*time.Millisecond, "p ended early")
	clk.Advance(250 * time.Millisecond)
	q.Done() // 150 ms after its due, now 0.2 s
	due(50*time.Millisecond, "q ended late: s not moved")
	s.Done()

	w := send(0.5, 0.4) // waits for a slot: its due leaves the wait out
	x := send(0.2, 0)
	clk.Advance(300 * time.Millisecond)
	w.Prefilled()
	due(0, "x overdue, not moved by w")
	x.Done()
}
