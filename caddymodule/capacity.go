package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

// limits are one handler's admission limits.
type limits struct {
	kv          float64
	maxInflight int
	failClosed  bool
	// ignoreDispatched disables local accounting: only the scraped gauges
	// count (disable_local_accounting), neither the requests sent since the
	// last scrape nor those that finished since.
	ignoreDispatched bool
}

// tryReserve admits a request when an engine of the pool has room, reserving
// it on the engine with the most room (the policy moves the reservation if it
// routes elsewhere). Engines whose state is unknown or stale admit too
// (fail-open, reported) unless failClosed. An empty pool fails open.
func (f *fleet) tryReserve(dials []string, lim limits) (res *upstreams.Reservation, failOpen, ok bool) {
	var best, unknown *upstreams.Engine
	bestFree := 0
	for _, d := range dials {
		if f.isDrained(d) {
			continue
		}
		e := f.registry.Ensure(d)
		l := e.Load()
		if !l.Known {
			if unknown == nil || l.Inflight < unknown.Load().Inflight {
				unknown = e
			}
			continue
		}
		if free := engineFree(l, lim); free > bestFree {
			best, bestFree = e, free
		}
	}
	switch {
	case best != nil:
		return best.Reserve(), false, true
	case unknown != nil && !lim.failClosed:
		return unknown.Reserve(), true, true
	case len(dials) == 0 && !lim.failClosed:
		return nil, true, true
	}
	return nil, false, false
}

// engineFree is how many more requests an engine with known gauges takes:
// none at or over the KV limit; up to max_inflight counting running, waiting
// and what this gateway dispatched since the last scrape, less the scraped
// requests of this gateway that finished since (unless
// disable_local_accounting: the gauges alone). Without a limit it is full
// exactly when its scheduler reports waiting requests (less those that
// finishes have let in since); dispatched requests then have nothing to
// count against, so configure max_inflight (vLLM's --max-num-seqs) for a
// cap tighter than the poll interval.
func engineFree(l upstreams.Load, lim limits) int {
	if l.KVUsage >= lim.kv {
		return 0
	}
	running, waiting := l.Running, l.Waiting
	if !lim.ignoreDispatched {
		// A parked request gets a finished request's slot at once, not
		// at the next poll.
		running, waiting = l.Estimated()
	}
	max := l.MaxInflight
	if max == 0 {
		max = lim.maxInflight
	}
	if max == 0 {
		if waiting > 0 {
			return 0
		}
		return 1
	}
	used := int(running + waiting)
	if !lim.ignoreDispatched {
		used += int(l.Dispatched)
	}
	return max - used
}

// anyKnown reports whether some undrained engine of the pool has fresh
// gauges, so that a fail-closed admission has something to wait for.
func (f *fleet) anyKnown(dials []string) bool {
	for _, d := range dials {
		if f.isDrained(d) {
			continue
		}
		if e, ok := f.registry.Get(d); ok && e.Load().Known {
			return true
		}
	}
	return false
}

// drainRate is the pool's observed completions per second.
func (f *fleet) drainRate(dials []string) float64 {
	var sum float64
	for _, d := range dials {
		if e, ok := f.registry.Get(d); ok {
			sum += e.Load().DrainRate
		}
	}
	return sum
}

// notePoolModel remembers the model a pool serves, for the saturation metric.
func (f *fleet) notePoolModel(pool, model string) {
	if model == "" {
		return
	}
	f.mu.Lock()
	if f.poolModels == nil {
		f.poolModels = make(map[string]string)
	}
	f.poolModels[pool] = model
	f.mu.Unlock()
}

// followUpstream moves a request's reservation to the engine reverse_proxy
// is using for it, unless the llm policy chose (and moved it) already: with
// another selection policy the engine reserved at admission is only a guess.
func (f *fleet) followUpstream(r *http.Request, res *upstreams.Reservation) {
	if last, _ := caddyhttp.GetVar(r.Context(), "llm.last").(string); last != "" {
		return
	}
	d := servedBy(r)
	if d == "" || d == res.Engine().Dial() {
		return
	}
	res.Move(f.registry.Ensure(d))
}
