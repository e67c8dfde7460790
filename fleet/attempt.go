package fleet

import (
	"sync/atomic"
	"time"

	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Pick is one attempt's routing decision for one request: where the fleet
// means it to go among the candidates it was asked about. Its methods are
// the rest of the request's life, so they can only be called in order:
//
//	pick := f.Route(ctx, q)        // or place.Pick(dials), or f.Unrouted(req, dials)
//	a := pick.Commit(dial)         // the request goes to dial: the fleet learns it
//	res = a.Dispatch(res)          // counted on dial's engine, handed to it
//	...                            // the proxy sends it, the engine answers
//	a.Outcome(err, status)         // the breaker hears how it ended; or a.Failed()
//	res.Done()                     // the engine's slot is free again
//
// A retry elsewhere is a new Pick after a.Failed(). A Pick that is never
// committed (the explain API) changes nothing. The embedded Decision is
// the decision and what it was made from; its Index is into the
// candidates, -1 when no candidate may take the request: the caller then
// picks one itself (least_conn) and commits to it all the same, so that
// the fleet learns where the request went.
type Pick struct {
	Decision
	f     *Fleet
	req   *openai.Request
	dials []string // the candidates, whose unused half-open probes Commit hands back
}

// Unrouted is a pick the fleet did not make: the caller chooses among
// dials on load alone, having no request to route on or no candidate.
// Committing it still teaches the approximate tree where req went (req
// may be nil: then it teaches nothing).
func (f *Fleet) Unrouted(req *openai.Request, dials []string) *Pick {
	return &Pick{f: f, req: req, dials: dials,
		Decision: Decision{Decision: routing.Decision{Index: -1, Tier: routing.LoadOnly, Outcome: routing.Miss}}}
}

// Commit records that the request goes to dial (see [Pick]) and returns
// the attempt there. The approximate tree learns the prompt's prefix on
// dial, and the index predicts dial holds the prompt's blocks (see
// routed). The half-open breaker probes claimed for the other candidates
// are handed back, so that the next request may probe them at once.
func (p *Pick) Commit(dial string) *Attempt {
	for _, d := range p.dials {
		if d != dial {
			p.f.releaseProbe(d)
		}
	}
	p.f.routed(p.req, p.Decision, dial)
	a := &Attempt{f: p.f, dial: dial, prefill: -1, unstreamed: p.req != nil && !p.req.Stream}
	switch {
	case p.Index >= 0 && p.Index < len(p.dials) && p.dials[p.Index] == dial:
		a.prefill, a.Predicted, a.slotWait = int(p.Decision.Prefill), p.Decision.Predicted, p.Decision.slotWait
	case p.Tokens > 0:
		// The caller chose another engine (least_conn): what it
		// holds is not known here, so the whole prompt counts.
		a.prefill = p.Tokens
	}
	return a
}

// Attempt is a request sent to one engine: what the fleet hears of it
// after the pick. It is had from [Pick.Commit], or from [Fleet.Proxied]
// for a request the fleet did not route. Its outcome is reported once:
// Failed and Outcome after the first report do nothing, so a caller
// reaching the end of a request twice does not count one failure twice.
type Attempt struct {
	f        *Fleet
	dial     string
	reported atomic.Bool
	// prefill is the request's uncached prompt tokens at dial, recorded
	// as its work there by Dispatch; -1 when unknown.
	prefill int
	// unstreamed: the response is not streamed, so no first token will
	// end the request's prefill (see Dispatch).
	unstreamed bool
	// Predicted is the routing decision's predicted time to first token
	// at the engine, in seconds; 0 when the fleet made no prediction for
	// it (the caller chose, or another policy did).
	Predicted float64
	// slotWait is the part of Predicted spent waiting for a batch slot
	// (Decision.slotWait).
	slotWait float64
}

// Proxied is the attempt of a request the proxy sent to dial however it
// chose it (a selection policy other than llm, or the llm policy's pick as
// the proxy reports it): admission follows it there and reports how it
// ended. dial "" is no engine: the attempt's methods do nothing.
func (f *Fleet) Proxied(dial string) *Attempt { return &Attempt{f: f, dial: dial, prefill: -1} }

// Dial is the engine the attempt went to.
func (a *Attempt) Dial() string { return a.dial }

// Dispatch counts the request on the attempt's engine and marks it handed
// to the engine: res, its admission reservation, moves there; without one
// (no admission in front) a new reservation is made, which the caller ends
// with Done when the request ends. It returns the reservation now counting
// the request.
func (a *Attempt) Dispatch(res *upstreams.Reservation) *upstreams.Reservation {
	if res == nil {
		res = a.f.registry.Ensure(a.dial).Reserve()
	} else {
		res.Move(a.f.registry.Ensure(a.dial))
	}
	// The request reaches the engine only now: keep it counted as
	// dispatched until a scrape whose epoch began after this succeeds,
	// and once a scrape counts it, its end frees the slot before the next
	// one.
	res.Sent()
	// Its uncached prompt is work the engine owes until its first token
	// (see routing.Work), weighed by the next decisions.
	res.Work(a.prefill)
	res.Predict(a.Predicted, a.slotWait)
	if prefill := a.Predicted - a.slotWait; a.unstreamed && prefill > 0 {
		// No first token will say the prefill is over: take it as
		// over at twice the predicted time, the slack for a queue the
		// prediction missed. (A wait for a batch slot is the slot
		// term's, as in the due time.)
		res.PrefillDue(time.Duration(2 * prefill * float64(time.Second)))
	}
	return res
}

// Follow moves res to the attempt's engine when it counts elsewhere: with
// a selection policy other than llm, the engine admission reserved on was
// only a guess, and the proxy's choice is known once it sends the request.
func (a *Attempt) Follow(res *upstreams.Reservation) {
	if a.dial == "" || a.dial == res.Engine().Dial() {
		return
	}
	res.Move(a.f.registry.Ensure(a.dial))
}

// Outcome reports how the request ended: a transport error (err not nil),
// no status or a 5xx counts against the engine as [Attempt.Failed] does;
// anything else is a success for its circuit breaker.
func (a *Attempt) Outcome(err error, status int) {
	if a.dial == "" {
		return
	}
	if err != nil || status == 0 || status >= 500 {
		a.Failed()
		return
	}
	if a.reported.Swap(true) {
		return
	}
	a.f.Breaker().Success(a.dial, time.Now())
}

// Failed reports that the request failed on the attempt's engine (a
// transport error, a 5xx, a retry elsewhere): it counts against the
// engine's circuit breaker, and the engine's speculative entries are
// dropped at once, since it may never store the blocks they predict.
// Every one of them, not only this request's: a failing engine's other
// predictions are as doubtful, and a wrong drop costs only until its
// events arrive.
func (a *Attempt) Failed() {
	if a.dial == "" || a.reported.Swap(true) {
		return
	}
	a.f.Breaker().Failure(a.dial, time.Now())
	a.f.index.DropPredictions(a.dial)
}

// releaseProbe returns a half-open probe claimed by Allow for a replica
// that was not picked.
func (f *Fleet) releaseProbe(dial string) {
	b := f.Breaker()
	if b.State(dial, time.Now()) == routing.StateHalfOpen {
		b.Release(dial)
	}
}
