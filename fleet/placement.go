package fleet

import (
	"context"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// DefaultPrefillRate is the prefill speed, in prompt tokens per second,
// that admission assumes when it weighs a wait at a prefix holder against
// the prefill the wait saves (Limits.PrefillRate). Engines do not report
// theirs; 10,000 tokens/s is vLLM on one GPU for a 7–8B model, the order of
// magnitude that matters here.
const DefaultPrefillRate = 10000

// Reasons a placed request was admitted where it was.
const (
	ReasonHit      = "cache_hit"      // its prefix holder had a free slot
	ReasonHitWait  = "cache_hit_wait" // queued at its full holder: the wait costs less than the prefill it saves
	ReasonCold     = "cold"           // another engine: no holder, or waiting there would cost more
	ReasonFailOpen = "fail_open"      // engine state unknown: admitted on a guess
)

// Placement is where admission means a request to go, computed once when
// the request arrives: the engine holding the longest prefix of its prompt
// (by the KV index, else the approximate tree) and what every candidate
// holds. Each try ([Fleet.ReservePlaced]) weighs it against the loads of
// that moment. The try runs under the admission gate's lock and writes the
// outcome fields; read them once the request is admitted.
type Placement struct {
	Holder string       // "" when no candidate holds a block of the prompt
	Cached int          // prompt tokens cached at Holder, credited by tier
	Tier   routing.Tier // Holder's tier; LoadOnly without a holder
	// Tokens are the prompt's ids when known (the policy routes on them).
	Tokens   []uint64
	Tokenize TokenizeResult

	// Outcome of the last try. Engine is where the reservation counts
	// ("" when none, or admitted fail-open on a guess); Reason why (one
	// of the Reason constants). Wait is the expected wait at the full
	// holder when it was weighed and WaitBound the most it may be: the
	// prefill a cold engine would spend, in time of the sequences it
	// stalls.
	Engine          string
	Reason          string
	Wait, WaitBound time.Duration

	dials    []string
	cands    []routing.Candidate // prefix figures by dial, loads of Place
	at       map[string]int      // index in dials
	req      routing.Request
	cost     routing.Config
	decision Decision
}

// Place computes a request's placement among dials (see Placement). It
// tokenizes as Route does (the same cache). It returns nil for a query
// with no request or with a cache key (the policy pins those itself).
func (f *Fleet) Place(ctx context.Context, q Query) *Placement {
	if q.Request == nil || q.CacheKey != "" {
		return nil
	}
	v := f.view(q.Dials, q.Settings)
	tokens := q.Tokens
	if tokens == nil {
		tokens = promptIDs(q.Request)
	}
	var tr TokenizeResult
	if tokens == nil && q.Settings.Tokenize {
		tokens, tr = f.tokenize(ctx, q.Request, v)
	}
	d, rr, cands := f.prefixes(q, v, tokens)
	d.Tokenize = tr
	p := &Placement{Tier: routing.LoadOnly, Tokens: tokens, Tokenize: tr, dials: q.Dials, cands: cands,
		at: make(map[string]int, len(q.Dials)), req: rr, cost: q.Settings.Cost, decision: d}
	p.cost.SetDefaults()
	for i, c := range cands {
		p.at[c.Dial] = i
		if n := p.cachedAt(i); n > p.Cached {
			p.Holder, p.Cached, p.Tier = c.Dial, n, c.Tier
		}
	}
	return p
}

// cachedAt is the prompt tokens candidate i holds, credited by its tier as
// routing.Pick credits them.
func (p *Placement) cachedAt(i int) int {
	c := &p.cands[i]
	blocks := min(c.MatchedBlocks, p.req.TotalBlocks)
	if blocks <= 0 {
		return 0
	}
	trust := 1.0
	if c.Tier == routing.Approximate {
		trust = p.cost.ApproximateWeight
	}
	return int(float64(blocks*p.req.BlockSize) * trust)
}

// Decision is the routing decision admission made for the request, for
// the policy to follow: Index is Engine's place in dials, ok false when
// the request was not placed on a known engine or Engine is not among
// dials (it failed, or was drained, since).
func (p *Placement) Decision(dials []string) (Decision, bool) {
	if p == nil || p.Engine == "" {
		return Decision{}, false
	}
	for i, d := range dials {
		if d == p.Engine {
			out := p.decision
			out.Index = i
			return out, true
		}
	}
	return Decision{}, false
}

// ReservePlaced is TryReserve for a placed request (p nil: TryReserve).
// The rule, in order:
//
//  1. Its prefix holder has room (as TryReserve counts it): reserve there.
//  2. The holder is full but the request's expected wait there — the
//     requests queued beyond its capacity, plus one, over its drain rate —
//     is shorter than the prefill a cold engine would spend on the
//     holder's cached tokens, counted for every sequence that prefill
//     stalls (the cold engine's batch, plus one): reserve on the holder
//     over its capacity; the engine queues the request (ReasonHitWait).
//     The bound thus follows the engine's own figures: the slower it
//     drains, the fewer wait; the larger the prefix and the fuller the
//     alternative, the more.
//  3. With PassPreferred, nothing else: the request keeps its place.
//  4. Any engine with room, chosen by routing.Pick among them (prefix and
//     load), as the policy would: ReasonCold.
//  5. As TryReserve: fail open on unknown engines unless fail-closed.
func (f *Fleet) ReservePlaced(p *Placement, dials []string, lim Limits, pass admission.Pass) (*upstreams.Reservation, bool, bool) {
	if p == nil {
		if pass == admission.PassPreferred {
			return nil, false, false
		}
		return f.TryReserve(dials, lim)
	}
	p.Engine, p.Reason, p.Wait, p.WaitBound = "", "", 0, 0
	he, hl, held := f.holderLoad(p, dials)
	if held && engineFree(hl, lim) > 0 {
		return p.reserve(he, ReasonHit, p.holderDecision()), false, true
	}
	if pass == admission.PassPreferred {
		if held && p.worthWaiting(hl, lim, batch(hl)) {
			return p.reserve(he, ReasonHitWait, p.holderDecision()), false, true
		}
		return nil, false, false
	}
	loads := f.loads(dials)
	alt := roomiest(loads, lim, p.Holder)
	b := batch(hl)
	if alt >= 0 {
		b = batch(loads[alt].l)
	}
	if held && p.worthWaiting(hl, lim, b) {
		return p.reserve(he, ReasonHitWait, p.holderDecision()), false, true
	}
	if alt >= 0 {
		i, d := p.pickCold(f, loads, lim, alt)
		return p.reserve(loads[i].e, ReasonCold, d), false, true
	}
	res, failOpen, ok := f.TryReserve(dials, lim)
	if ok && failOpen {
		p.Reason = ReasonFailOpen
	}
	return res, failOpen, ok
}

// reserve reserves on e and records the outcome.
func (p *Placement) reserve(e *upstreams.Engine, reason string, d Decision) *upstreams.Reservation {
	p.Engine, p.Reason, p.decision = e.Dial(), reason, d
	return e.Reserve()
}

// holderDecision is the decision of a request sent to its holder.
func (p *Placement) holderDecision() Decision {
	d := p.decision
	d.Tier, d.Outcome, d.Share = p.Tier, routing.Hit, 0
	if i, ok := p.at[p.Holder]; ok && p.req.TotalBlocks > 0 {
		d.Share = float64(min(p.cands[i].MatchedBlocks, p.req.TotalBlocks)) / float64(p.req.TotalBlocks)
	}
	return d
}

// holderLoad is the holder's engine and load when it is a candidate that
// may take the request: among dials, not drained, with known gauges.
func (f *Fleet) holderLoad(p *Placement, dials []string) (*upstreams.Engine, upstreams.Load, bool) {
	if p.Holder == "" || f.IsDrained(p.Holder) {
		return nil, upstreams.Load{}, false
	}
	found := false
	for _, d := range dials {
		if d == p.Holder {
			found = true
			break
		}
	}
	if !found {
		return nil, upstreams.Load{}, false
	}
	e := f.registry.Ensure(p.Holder)
	l := e.Load()
	return e, l, l.Known
}

// worthWaiting applies rule 2 of ReservePlaced to the full holder's load
// l, b being the batch a cold prefill would stall, and records the wait
// and its bound.
func (p *Placement) worthWaiting(l upstreams.Load, lim Limits, b int) bool {
	rate := lim.PrefillRate
	if rate == 0 {
		rate = DefaultPrefillRate
	}
	if rate < 0 || l.KVUsage >= lim.KV || p.Cached <= 0 {
		return false
	}
	bound := float64(b+1) * float64(p.Cached) / rate
	p.WaitBound = time.Duration(bound * float64(time.Second))
	if !(l.DrainRate > 0) {
		return false // no completion seen yet: the wait is unknown
	}
	wait := float64(queuedBeyond(l, lim)+1) / l.DrainRate
	p.Wait = time.Duration(wait * float64(time.Second))
	return wait < bound
}

// queuedBeyond is how many requests an engine with no room holds beyond
// its capacity as engineFree counts it: they wait in its queue.
func queuedBeyond(l upstreams.Load, lim Limits) int {
	if free := engineFree(l, lim); free < 0 {
		return -free
	}
	if l.MaxInflight == 0 && lim.MaxInflight == 0 {
		// No limit: full while anything waits, and everything waiting
		// (and dispatched since the scrape) is queued.
		_, waiting := l.Estimated()
		if !lim.IgnoreDispatched {
			waiting += float64(l.Dispatched)
		}
		return int(waiting)
	}
	return 0
}

// batch is the sequences an engine is running or about to: a prefill
// there stalls each of them.
func batch(l upstreams.Load) int {
	running, _ := l.Estimated()
	return int(running) + int(l.Dispatched)
}

// dialLoad is one candidate engine's load as one try sees it.
type dialLoad struct {
	e    *upstreams.Engine
	l    upstreams.Load
	free int // engineFree; 0 for unknown or drained engines
}

// loads snapshots the candidates' loads.
func (f *Fleet) loads(dials []string) []dialLoad {
	out := make([]dialLoad, 0, len(dials))
	for _, d := range dials {
		if f.IsDrained(d) {
			continue
		}
		e := f.registry.Ensure(d)
		out = append(out, dialLoad{e: e, l: e.Load()})
	}
	return out
}

// roomiest returns the index of the known engine other than skip with the
// most room, -1 when none has any; it fills each entry's free.
func roomiest(loads []dialLoad, lim Limits, skip string) int {
	best, bestFree := -1, 0
	for i := range loads {
		if !loads[i].l.Known {
			continue
		}
		loads[i].free = engineFree(loads[i].l, lim)
		if loads[i].e.Dial() != skip && loads[i].free > bestFree {
			best, bestFree = i, loads[i].free
		}
	}
	return best
}

// pickCold chooses among the engines with room as the policy would,
// routing.Pick on the placement's prefix figures and the loads of now;
// alt (the roomiest) when Pick has no answer.
func (p *Placement) pickCold(f *Fleet, loads []dialLoad, lim Limits, alt int) (int, Decision) {
	cands := make([]routing.Candidate, len(loads))
	for i := range loads {
		c := f.candidate(Query{}, loads[i].l, loads[i].e.Dial())
		if j, ok := p.at[c.Dial]; ok {
			c.Tier, c.MatchedBlocks = p.cands[j].Tier, p.cands[j].MatchedBlocks
		}
		if loads[i].free <= 0 {
			c.Unavailable = "full"
		}
		cands[i] = c
	}
	d := p.decision
	d.Decision = routing.Pick(p.req, cands, p.cost, false)
	if d.Index < 0 {
		d.Index, d.Tier, d.Outcome = alt, routing.LoadOnly, routing.Miss
	}
	if p.Holder != "" && cands[d.Index].Dial != p.Holder {
		// Pick saw the full holder as unavailable; it was passed over.
		d.Outcome = routing.OverriddenByLoad
	}
	return d.Index, d
}
