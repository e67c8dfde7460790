package fleet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// admitter enters requests into its own admission gate (a pool of its
// own) as the handler does, each reserving with lim on dials; it keeps
// the reservations it made.
type admitter struct {
	t     *testing.T
	f     *Fleet
	gate  *admission.Gate
	dials []string
	lim   Limits
	res   []*upstreams.Reservation
}

func newAdmitter(t *testing.T, f *Fleet, dials []string, lim Limits) *admitter {
	pool := fmt.Sprintf("%s-%d", t.Name(), len(f.gateList()))
	a := &admitter{t: t, f: f, gate: f.Gate(pool, admission.Config{QueueSize: 8}), dials: dials, lim: lim}
	t.Cleanup(func() {
		for _, r := range a.res {
			r.Done()
		}
	})
	return a
}

// enter enters one request (placed by p when not nil) and reports whether
// it was admitted at once; a parked one is admitted by a later Kick.
func (a *admitter) enter(p *Placement) (*admission.Waiter, bool) {
	a.t.Helper()
	try := func(pass admission.Pass) bool {
		r, _, ok := reservePlaced(a.f, p, a.dials, a.lim, pass)
		if ok {
			a.res = append(a.res, r)
		}
		return ok
	}
	w, err := a.gate.EnterPlaced(admission.Normal, try)
	if err != nil {
		a.t.Fatal(err)
	}
	select {
	case <-w.Ready():
		return w, true
	default:
		return w, false
	}
}

// reservePlaced is the admission handler's try: p's Reserve, or for a
// request it did not place (p nil) TryReserve, which has nothing to prefer.
func reservePlaced(f *Fleet, p *Placement, dials []string, lim Limits, pass admission.Pass) (*upstreams.Reservation, bool, bool) {
	if p != nil {
		return p.Reserve(dials, lim, pass)
	}
	if pass == admission.PassPreferred {
		return nil, false, false
	}
	return f.TryReserve(dials, lim)
}

// last is the engine the latest reservation counts on, "" before any.
func (a *admitter) last() string {
	if len(a.res) == 0 {
		return ""
	}
	return a.res[len(a.res)-1].Engine().Dial()
}

// openBreaker opens dial's breaker for an hour.
func openBreaker(f *Fleet, dial string) {
	f.SetBreaker(routing.BreakerConfig{Failures: 1, Cooldown: time.Hour})
	f.Proxied(dial).Failed()
}

// TestAdmissionHonorsBreaker is the benchmark's bug: an engine whose
// breaker is open is one lb_policy llm cannot route to, so admission for
// an llm pool (HonorBreaker) counts no room there — neither for a plain
// request nor for one whose prefix it holds — and parks requests once the
// others are full, instead of admitting them onto the others' queues. A
// parked request is admitted when the breaker closes. Without the flag
// (Caddy's own policies, which never consult the breaker) the broken
// engine takes requests as before.
func TestAdmissionHonorsBreaker(t *testing.T) {
	broken, ok := deadDials[0], deadDials[1]
	f, _ := clockedFleet(t, &EngineConfig{Dial: broken, MaxInflight: 4}, &EngineConfig{Dial: ok, MaxInflight: 2})
	dials := deadDials[:2]
	scrape(f, broken, upstreams.Gauges{})
	scrape(f, ok, upstreams.Gauges{Running: 1})
	prefix := strings.Repeat("the shared system prompt ", 480)
	f.Unrouted(chatRequest(t, nil, prefix), nil).Commit(broken)
	openBreaker(f, broken)

	llm := newAdmitter(t, f, dials, Limits{KV: 0.9, HonorBreaker: true})
	p := placedOn(t, f, dials, prefix+" and a question")
	if _, admitted := llm.enter(p); !admitted || llm.last() != ok || p.Reason != ReasonMoved {
		t.Fatalf("placed at the broken holder: admitted %v on %v (%s), want %s (%s)", admitted, llm.last(), p.Reason, ok, ReasonMoved)
	}
	parked, admitted := llm.enter(nil)
	if admitted {
		t.Fatalf("admitted on %s with the only routable engine full", llm.last())
	}

	other := newAdmitter(t, f, dials, Limits{KV: 0.9})
	if _, admitted := other.enter(nil); !admitted || other.last() != broken {
		t.Fatal("without HonorBreaker the broken engine's room does not count")
	}
	p = placedOn(t, f, dials, prefix+" and another question")
	if _, admitted := other.enter(p); !admitted || other.last() != broken || p.Reason != ReasonHit {
		t.Fatalf("without HonorBreaker a placed request went to %v (%s), want its holder %s", other.last(), p.Reason, broken)
	}

	f.Breaker().Reset(broken, time.Now()) // the engine restarted
	llm.gate.Kick()
	select {
	case <-parked.Ready():
	default:
		t.Fatal("the parked request stays parked after the breaker closed")
	}
	if llm.last() != broken {
		t.Fatalf("the parked request was admitted on %s, want %s", llm.last(), broken)
	}
}

// TestAdmissionBreakerHalfOpen: a half-open breaker lets one probe
// through, so admission counts one slot there however much room the
// engine shows — and, with that probe reserved, none until it is routed
// and answered, also within one gate kick.
func TestAdmissionBreakerHalfOpen(t *testing.T) {
	probing, full := deadDials[0], deadDials[1]
	f, _ := clockedFleet(t, &EngineConfig{Dial: probing, MaxInflight: 8}, &EngineConfig{Dial: full, MaxInflight: 2})
	dials := deadDials[:2]
	scrape(f, probing, upstreams.Gauges{})
	scrape(f, full, upstreams.Gauges{Running: 2})
	f.SetBreaker(routing.BreakerConfig{Failures: 1, Cooldown: time.Minute})
	f.Breaker().Failure(probing, time.Now().Add(-time.Hour)) // opened long ago: half-open
	if st := f.Breaker().State(probing, time.Now()); st != routing.StateHalfOpen {
		t.Fatalf("breaker %s, want half_open", st)
	}
	a := newAdmitter(t, f, dials, Limits{KV: 0.9, HonorBreaker: true})
	if _, admitted := a.enter(nil); !admitted || a.last() != probing {
		t.Fatal("the half-open engine does not take its probe")
	}
	if _, admitted := a.enter(nil); admitted {
		t.Fatalf("a second request admitted on %s beside the probe", a.last())
	}
	// The policy routes the probe: it claims it, and sends the request.
	if !f.Breaker().Allow(probing, time.Now()) {
		t.Fatal("admission claimed the probe the policy needs")
	}
	f.Proxied(probing).Dispatch(a.res[0])
	scrape(f, probing, upstreams.Gauges{Running: 1})
	a.gate.Kick()
	if len(a.res) != 1 {
		t.Fatalf("admitted on %s while the probe is out", a.last())
	}
	f.Proxied(probing).Outcome(nil, 200) // the probe succeeded: closed
	a.gate.Kick()
	if len(a.res) != 2 || a.last() != probing {
		t.Fatal("the parked request is not admitted once the breaker closed")
	}
}

// TestAdmissionAllBreakersOpen: with every engine's breaker open the pool
// is full, not unknown: requests park (the engines are failing) rather
// than fail open — also when the engines' gauges are unknown too. Without
// HonorBreaker admission goes on as before.
func TestAdmissionAllBreakersOpen(t *testing.T) {
	f, _ := clockedFleet(t, &EngineConfig{Dial: deadDials[0], MaxInflight: 4}, &EngineConfig{Dial: deadDials[1], MaxInflight: 4})
	dials := deadDials[:2]
	openBreaker(f, deadDials[0])
	f.Proxied(deadDials[1]).Failed()
	lim := Limits{KV: 0.9, HonorBreaker: true}
	if r, failOpen, ok := f.TryReserve(dials, lim); ok {
		t.Fatalf("unknown engines, all open: admitted on %v (fail-open %v)", r.Engine().Dial(), failOpen)
	}
	if r, failOpen, ok := f.TryReserve(dials, Limits{KV: 0.9}); !ok || !failOpen {
		t.Fatal("without HonorBreaker unknown engines no longer fail open")
	} else {
		r.Done()
	}
	scrape(f, deadDials[0], upstreams.Gauges{})
	scrape(f, deadDials[1], upstreams.Gauges{})
	if _, admitted := newAdmitter(t, f, dials, lim).enter(nil); admitted {
		t.Fatal("admitted with every breaker open")
	}
	if _, admitted := newAdmitter(t, f, dials, Limits{KV: 0.9}).enter(nil); !admitted {
		t.Fatal("without HonorBreaker an open breaker holds requests back")
	}
}
