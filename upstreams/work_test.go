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
