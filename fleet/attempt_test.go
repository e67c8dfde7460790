package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestRequestLife walks requests through their whole life against a real
// fleet, in the order the types allow: admission places and reserves one,
// the policy follows admission's pick and commits to it, the attempt is
// dispatched, the proxy follows it, it ends and its reservation is done.
// A second request fails where it was sent. Reporting an attempt's end
// twice, or ending its reservation twice, counts once.
func TestRequestLife(t *testing.T) {
	ctx := context.Background()
	f, _, dials := specFleet(t, 2)
	f.SetBreaker(routing.BreakerConfig{Failures: 2, Cooldown: time.Hour})
	for _, d := range dials {
		scrape(f, d, upstreams.Gauges{})
	}
	q := Query{Request: chatRequest(t, nil, "a life"), Dials: dials, Settings: DefaultSettings(), Tokens: tokens(9, 1024, 0)}

	explain := q
	explain.Explain = true // Scored, to see the speculative blocks

	// Admission: placed once, reserved by a try of the gate.
	place := f.Place(ctx, q)
	res, failOpen, ok := place.Reserve(dials, Limits{KV: 0.9, MaxInflight: 4}, admission.PassAny)
	if !ok || failOpen || res.Engine().Dial() != place.Engine || place.Reason != ReasonCold {
		t.Fatalf("reserved ok %v fail-open %v on %v (%s), want a cold placement on %s", ok, failOpen, res, place.Reason, place.Engine)
	}
	// The policy: admission's pick, committed.
	pick, ok := place.Pick(dials)
	if !ok || dials[pick.Index] != place.Engine {
		t.Fatalf("the policy's pick %v (ok %v) is not admission's %s", pick, ok, place.Engine)
	}
	dial := place.Engine
	a := pick.Commit(dial)
	if a.Dial() != dial {
		t.Fatalf("the attempt is on %s, want %s", a.Dial(), dial)
	}
	if d := f.Route(ctx, explain); d.Index < 0 || dials[d.Index] != dial || d.Outcome != routing.Hit || d.Scored[d.Index].SpeculativeBlocks == 0 {
		t.Fatalf("after Commit the prompt is no speculative hit on %s: %+v", dial, d.Decision)
	}
	if got := a.Dispatch(res); got != res {
		t.Fatal("Dispatch did not keep admission's reservation")
	}
	if l := f.Registry().Ensure(dial).Load(); l.Inflight != 1 || l.Dispatched != 1 {
		t.Fatalf("dispatched: inflight %d dispatched %d on %s, want 1 and 1", l.Inflight, l.Dispatched, dial)
	}
	f.Proxied(dial).Follow(res) // the proxy used the pick: nothing moves
	if res.Engine().Dial() != dial {
		t.Fatalf("Follow moved the reservation to %s", res.Engine().Dial())
	}
	// The end: a success, reported once; a late failure report of the
	// same attempt is no failure.
	a.Outcome(nil, 200)
	a.Failed()
	a.Failed()
	if st := f.Breaker().State(dial, time.Now()); st != routing.StateClosed {
		t.Fatalf("after a success the breaker is %s", st)
	}
	if d := f.Route(ctx, q); d.Outcome != routing.Hit {
		t.Fatalf("a late failure report of a successful attempt dropped its predictions: %+v", d.Decision)
	}
	res.Done()
	res.Done()
	if l := f.Registry().Ensure(dial).Load(); l.Inflight != 0 {
		t.Fatalf("after Done twice %d in flight on %s, want 0", l.Inflight, dial)
	}

	// A request without admission in front fails where it was sent: one
	// failure however often it is reported, and the engine's predictions
	// are gone.
	failing := f.Route(ctx, Query{Request: chatRequest(t, nil, "a failing life"), Dials: dials, Settings: DefaultSettings(), Tokens: tokens(9, 1024, 1)})
	b := failing.Commit(dial)
	own := b.Dispatch(nil)
	b.Failed()
	b.Failed()
	b.Outcome(nil, 502)
	own.Done()
	if st := f.Breaker().State(dial, time.Now()); st != routing.StateClosed {
		t.Fatalf("one failed attempt reported thrice left the breaker %s (2 failures open it)", st)
	}
	if d := f.Route(ctx, q); d.Outcome != routing.Miss {
		t.Fatalf("after a failure on %s its predictions still draw the prompt: %+v", dial, d.Decision)
	}
	f.Proxied(dial).Failed() // another request's failure: the second
	if st := f.Breaker().State(dial, time.Now()); st != routing.StateOpen {
		t.Fatalf("after two failed attempts the breaker is %s, want open", st)
	}
	if l := f.Registry().Ensure(dial).Load(); l.Inflight != 0 {
		t.Fatalf("%d in flight on %s after every request ended", l.Inflight, dial)
	}
}
