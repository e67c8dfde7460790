package fleet

import (
	"context"
	"fmt"
	"testing"
)

// TestDispatchRecordsWork: a routed request's uncached prompt counts on
// its engine from Dispatch to its first token, then it counts as
// decoding until Done; the next decision sees that work ahead and sends a
// request with another prefix to an idle engine.
func TestDispatchRecordsWork(t *testing.T) {
	f, _, dials := specFleet(t, 2)
	ctx := context.Background()
	s := DefaultSettings()
	q := func(i int) Query {
		return Query{Request: chatRequest(t, nil, fmt.Sprintf("work %d", i)), Dials: dials, Settings: s, Tokens: tokens(uint64(i+1), 4096, uint64(i))}
	}
	d := f.Route(ctx, q(0))
	if d.Index < 0 || d.Prefill != float64(len(q(0).Tokens)) || d.Predicted <= 0 {
		t.Fatalf("first decision %+v: want a pick with the whole prompt to prefill and a prediction", d.Decision)
	}
	a := d.Commit(dials[d.Index])
	res := a.Dispatch(nil)
	e := f.Registry().Ensure(dials[d.Index])
	if l := e.Load(); l.OwnPrefill != d.Prefill || l.OwnPending != 1 || l.OwnDecoding != 0 {
		t.Fatalf("after Dispatch: own prefill %v pending %d decoding %d, want %v, 1, 0", l.OwnPrefill, l.OwnPending, l.OwnDecoding, d.Prefill)
	}
	if p, _, ok := res.Predicted(); !ok || p != d.Predicted {
		t.Fatalf("reservation's prediction %v (ok %v), want %v", p, ok, d.Predicted)
	}
	next := f.Route(ctx, q(1))
	if next.Index < 0 || next.Index == d.Index {
		t.Fatalf("a second cold prompt went to %d, beside the first's pending prefill on %d", next.Index, d.Index)
	}
	res.Prefilled()
	if l := e.Load(); l.OwnPrefill != 0 || l.OwnPending != 0 || l.OwnDecoding != 1 {
		t.Fatalf("after the first token: own prefill %v pending %d decoding %d, want 0, 0, 1", l.OwnPrefill, l.OwnPending, l.OwnDecoding)
	}
	res.Done()
	if l := e.Load(); l.OwnPrefill != 0 || l.OwnPending != 0 || l.OwnDecoding != 0 {
		t.Fatalf("after Done: own prefill %v pending %d decoding %d, want none", l.OwnPrefill, l.OwnPending, l.OwnDecoding)
	}
}
