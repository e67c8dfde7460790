package fleet

import (
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Limits are one admission handler's limits.
type Limits struct {
	KV          float64 // an engine at or over this KV usage is full
	MaxInflight int     // for engines without their own max_inflight
	FailClosed  bool    // refuse rather than admit on unknown engine state
	// IgnoreDispatched disables local accounting: only the scraped gauges
	// count (disable_local_accounting), neither the requests sent since the
	// last scrape nor those that finished since.
	IgnoreDispatched bool
	// PrefillRate is the engines' prefill speed in prompt tokens per
	// second, for weighing a wait at a request's prefix holder against the
	// prefill it saves and for how long a long prompt occupies its engine
	// (see Placement.Reserve). 0 means each engine's own rate, derived from its
	// counters, else DefaultPrefillRate; a negative value never lets a
	// request wait at a full holder.
	PrefillRate float64
	// LongPrefill is the uncached prompt length, in tokens, above which a
	// request occupies its engine for its whole prefill (see
	// Placement.Reserve). 0 means DefaultLongPrefill; a negative value
	// disables the rule.
	LongPrefill int
	// HonorBreaker counts no room on an engine the routing circuit
	// breaker keeps out. lb_policy llm routes only where the breaker
	// allows, so room counted there would send the request to the other
	// engines, over their max_inflight; the handler sets it for pools the
	// llm policy routes. Other policies never consult the breaker: there
	// it would hold requests back for nothing. An open breaker is no room;
	// a half-open one is room for its one probe (routing.Breaker.Admits)
	// while none is reserved or out. With every engine kept out the pool
	// is full, not unknown: requests park until a breaker half-opens or
	// max_park ends, since the engines are failing.
	HonorBreaker bool
	// EngineQueue is how many requests an engine at its max_inflight may
	// still take, to wait in its own queue: vLLM fills a slot freed at a
	// step's end from that queue at the next step, where a request parked
	// here would reach the engine only after the finished stream's end
	// came back and the request went out again, about a step later, so
	// that a saturated fleet ran below its capacity. 0 (or negative):
	// none, an engine at max_inflight is full. Engines without a
	// max_inflight are full while anything waits there, whatever this is.
	EngineQueue int
}

// engineQueue is lim's EngineQueue, none when negative.
func (lim Limits) engineQueue() int { return max(lim.EngineQueue, 0) }

// TryReserve admits a request when an engine of the pool has room, reserving
// it on the engine with the most room (the policy moves the reservation if it
// routes elsewhere). Engines whose state is unknown or stale admit too
// (fail-open, reported) unless FailClosed. An empty pool fails open.
// Engines the breaker keeps out are skipped, when lim.HonorBreaker.
func (f *Fleet) TryReserve(dials []string, lim Limits) (res *upstreams.Reservation, failOpen, ok bool) {
	var best, unknown *upstreams.Engine
	bestFree := 0
	b, now := f.Breaker(), time.Now()
	for _, d := range dials {
		if f.OutOfService(d) {
			continue
		}
		e := f.registry.Ensure(d)
		l := e.Load()
		admits, probe := breakerAdmits(b, now, d, l, lim)
		switch {
		case !admits:
		case !l.Known:
			if unknown == nil || l.Inflight < unknown.Load().Inflight {
				unknown = e
			}
		default:
			if free := probeFree(engineFree(l, lim), probe); free > bestFree {
				best, bestFree = e, free
			}
		}
	}
	switch {
	case best != nil:
		return best.Reserve(), false, true
	case unknown != nil && !lim.FailClosed:
		return unknown.Reserve(), true, true
	case len(dials) == 0 && !lim.FailClosed:
		return nil, true, true
	}
	return nil, false, false
}

// breakerAdmits reports whether admission may count room on engine dial
// (load l) as far as its circuit breaker goes (always unless
// lim.HonorBreaker), and whether only for the breaker's one probe. A probe
// already reserved here, which the policy claims only when it routes the
// request, shows as a request dispatched to the engine: one admission per
// probe, however many a single gate kick admits. (A scrape completing
// between that reservation and its routing may let one more through.)
// The breaker runs on the wall clock, as every caller of it does.
func breakerAdmits(b *routing.Breaker, now time.Time, dial string, l upstreams.Load, lim Limits) (ok, probe bool) {
	if !lim.HonorBreaker {
		return true, false
	}
	ok, probe = b.Admits(dial, now)
	if probe && l.Dispatched > 0 {
		return false, false
	}
	return ok, probe
}

// probeFree caps free at the one request a half-open breaker lets through.
func probeFree(free int, probe bool) int {
	if probe {
		return min(free, 1)
	}
	return free
}

// engineFree is how many more requests an engine with known gauges takes:
// none at or over the KV limit; up to max_inflight plus the engine queue
// (Limits.EngineQueue) counting running, waiting
// and what this gateway dispatched since the last scrape, less the scraped
// requests of this gateway that finished since (unless
// disable_local_accounting: the gauges alone). Without a limit it is full
// exactly when its scheduler reports waiting requests (less those that
// finishes have let in since); dispatched requests then have nothing to
// count against, so configure max_inflight (vLLM's --max-num-seqs) for a
// cap tighter than the poll interval.
//
// An engine prefilling a long prompt this gateway sent it (Load.Occupied,
// local accounting too) has no room until that prefill is expected to end.
func engineFree(l upstreams.Load, lim Limits) int {
	free := requestsFree(l, lim)
	if l.Occupied > 0 && !lim.IgnoreDispatched && free > 0 {
		return 0
	}
	return free
}

// requestsFree is engineFree by the request counts alone.
func requestsFree(l upstreams.Load, lim Limits) int {
	if l.KVUsage >= lim.KV {
		return 0
	}
	max := batchLimit(l, lim)
	if max == 0 {
		waiting := l.Waiting
		if !lim.IgnoreDispatched {
			_, waiting = l.Estimated()
		}
		if waiting > 0 {
			return 0
		}
		return 1
	}
	return max + lim.engineQueue() - int(inUse(l, lim))
}

// batchLimit is the most requests engine l runs at once: its own
// max_inflight, else the limits'; 0 when neither is set.
func batchLimit(l upstreams.Load, lim Limits) int {
	if l.MaxInflight != 0 {
		return l.MaxInflight
	}
	return lim.MaxInflight
}

// inUse is how many requests engine l is running or has waiting, as
// admission counts them: with the requests dispatched since the scrape,
// less those of ours that finished since, so that a parked request gets
// a finished request's slot at once, not at the next poll (unless
// lim.IgnoreDispatched: the gauges alone).
func inUse(l upstreams.Load, lim Limits) float64 {
	if lim.IgnoreDispatched {
		return l.Running + l.Waiting
	}
	running, waiting := l.Estimated()
	return running + waiting + float64(l.Dispatched)
}

// AnyKnown reports whether some engine of the pool in service (not
// drained nor asleep) has fresh gauges, so that a fail-closed admission
// has something to wait for.
func (f *Fleet) AnyKnown(dials []string) bool {
	for _, d := range dials {
		if f.OutOfService(d) {
			continue
		}
		if e, ok := f.registry.Get(d); ok && e.Load().Known {
			return true
		}
	}
	return false
}

// DrainRate is the pool's observed completions per second.
func (f *Fleet) DrainRate(dials []string) float64 {
	var sum float64
	for _, d := range dials {
		if e, ok := f.registry.Get(d); ok {
			sum += e.Load().DrainRate
		}
	}
	return sum
}

// RetryAfter is when a refused request should come back: its queue
// position (a newcomer's place in band when position is 0; gate may be
// nil) over the pool's observed drain rate, else the gate's admission
// rate, between a second and maxPark.
func (f *Fleet) RetryAfter(dials []string, gate *admission.Gate, band admission.Band, position int, maxPark time.Duration) time.Duration {
	rate := f.DrainRate(dials)
	if gate != nil {
		if position <= 0 {
			position = gate.Ahead(band) + 1
		}
		if rate <= 0 {
			rate = gate.DrainRate()
		}
	}
	return admission.RetryAfter(position, rate, time.Second, maxPark)
}
