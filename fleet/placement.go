package fleet

import (
	"context"
	"slices"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// DefaultPrefillRate is the prefill speed, in prompt tokens per second,
// that admission assumes for an engine whose rate is neither configured
// (Limits.PrefillRate) nor yet derived from its counters
// (upstreams.Load.PrefillRate: before its first prefill completes, or a
// vLLM without the prefill-time histogram): 10,000 tokens/s is vLLM on one
// GPU for a 7–8B model, the order of magnitude that matters here.
const DefaultPrefillRate = 10000

// DefaultLongPrefill is the uncached prompt length, in tokens, above which
// a placed request occupies its engine for its prefill (Limits.LongPrefill):
// 16k tokens take 1.6 s at the default prefill rate, long enough that a
// request sent behind them is visibly delayed.
const DefaultLongPrefill = 16384

// Reasons a placed request was admitted where it was.
const (
	ReasonHit      = "cache_hit"      // its prefix holder had a free slot
	ReasonHitWait  = "cache_hit_wait" // queued at its full holder: the wait costs less than the prefill it saves
	ReasonCold     = "cold"           // no engine holds any of the prompt: no affinity to keep
	ReasonMoved    = "moved"          // a holder exists but waiting there would cost more: affinity broken
	ReasonFailOpen = "fail_open"      // engine state unknown: admitted on a guess
)

// Placement is where admission means a request to go, computed once when
// the request arrives: the engine holding the longest prefix of its prompt
// (by the KV index, else the approximate tree) and what the candidates
// holding any of it hold. It keeps no prompt or token ids of its own (it
// points to the parsed request, which the handler keeps anyway): a parked
// request costs its body and a few words per holder (and, while
// speculative entries are on, its block keys, one word per block, for
// [Pick.Commit]). Each try ([Placement.Reserve]) weighs it against the
// loads of that moment. The try runs under the admission gate's lock and
// writes the outcome fields; read them once the request is admitted.
//
// A placement is the start of a request's life when admission gates it:
//
//	place := f.Place(ctx, q)                             // nil: f.TryReserve instead
//	res, failOpen, ok := place.Reserve(dials, lim, pass) // at each try of the gate
//	pick, ok := place.Pick(candidates)                   // the policy follows admission
//
// and the rest of it is the [Pick]'s.
type Placement struct {
	Holder   string       // "" when no candidate holds a block of the prompt
	Cached   int          // prompt tokens cached at Holder, credited by tier
	Tier     routing.Tier // Holder's tier; LoadOnly without a holder
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
	// Evicts is how many cached tokens a cold copy of the prefix would
	// evict on the cold alternative when the holder was weighed: they
	// count in WaitBound as much as the prefix does.
	Evicts int
	// Occupies is how long the request holds Engine as a long prefill
	// (its uncached tokens over the prefill rate; 0 when it is not long).
	Occupies time.Duration

	match    map[string]match // the candidates holding blocks of the prompt
	holders  []string         // dials holding at least half of Holder's prefix
	req      routing.Request
	cost     routing.Config
	decision Decision
	f        *Fleet
	request  *openai.Request // for the Pick: its Commit teaches the tree the prefix
}

// Place computes a request's placement among dials (see Placement). It
// tokenizes as Route does (the same cache). It returns nil for a query
// with no request, with a cache key or a pin (the policy pins those
// itself), or for a pooling request (Route sends those by load alone).
func (f *Fleet) Place(ctx context.Context, q Query) *Placement {
	if q.Request == nil || q.CacheKey != "" || q.Pin != "" || q.Request.PrefillOnly {
		return nil
	}
	v := f.queryView(q)
	tokens, keys, tr := f.promptTokens(ctx, q, v)
	q.media = f.promptMedia(q, tr)
	d, rr, cands := f.prefixes(q, v, tokens, keys)
	tr = releaseTokens(tokens, tr)
	d.Tokenize = tr
	p := &Placement{Tier: routing.LoadOnly, Tokenize: tr, match: make(map[string]match), req: rr, cost: q.Settings.Cost, decision: d,
		f: f, request: q.Request}
	p.cost.SetDefaults()
	for i, c := range cands {
		if (c.MatchedBlocks <= 0 && c.CPUBlocks+c.StorageBlocks <= 0) || !v.serves(i) {
			continue // an engine of another model holds no prefix of this one's
		}
		m := match{tier: c.Tier, blocks: max(c.MatchedBlocks, 0), predicted: min(max(c.Speculative, 0), c.MatchedBlocks),
			cpu: c.CPUBlocks, storage: c.StorageBlocks}
		// What the engine offloaded comes from its own events: it counts
		// in held as in cached.
		offloaded := p.creditOffloaded(m)
		m.cached = p.credit(m.tier, m.blocks) + offloaded
		m.held = p.credit(m.tier, m.blocks-m.predicted) + offloaded
		p.match[c.Dial] = m
		if m.cached > p.Cached {
			p.Holder, p.Cached, p.Tier = c.Dial, m.cached, c.Tier
		}
	}
	for _, c := range cands {
		// (p.match has only engines that may serve the model.)
		// A group's prefix may live on several engines; each of them is
		// worth waiting for about as much. Only what an engine's own
		// events say it holds makes it one: a prediction outlives neither
		// its TTL nor a failure, but a parked request keeps its
		// placement, and would wait for a guess that has ended.
		if p.holds(p.heldOn(c.Dial)) {
			p.holders = append(p.holders, c.Dial)
		}
	}
	return p
}

// match is what one candidate holds of the prompt.
type match struct {
	tier      routing.Tier
	blocks    int
	predicted int // of blocks, those only speculative entries make up
	cached    int // tokens, credited by tier
	held      int // of cached, those the engine's own blocks make up
	// cpu and storage are the blocks past blocks the engine keeps in its
	// offload tiers (routing.Candidate.CPUBlocks, StorageBlocks).
	cpu, storage int
}

// cachedOn is the prompt tokens dial holds, credited by tier; 0 for a dial
// that holds none (or that Place did not see). Predicted blocks count:
// they weigh in choosing among engines with room.
func (p *Placement) cachedOn(dial string) int { return p.match[dial].cached }

// heldOn is cachedOn without the predicted blocks: what makes dial a
// holder worth waiting for.
func (p *Placement) heldOn(dial string) int { return p.match[dial].held }

// credit is the prompt tokens blocks of tier count for, credited as
// routing.Pick credits them.
func (p *Placement) credit(tier routing.Tier, blocks int) int {
	blocks = min(blocks, p.req.TotalBlocks)
	if blocks <= 0 {
		return 0
	}
	trust := 1.0
	if tier == routing.Approximate {
		trust = p.cost.ApproximateWeight
	}
	return int(float64(blocks*p.req.BlockSize) * trust)
}

// creditOffloaded is the prompt tokens m's offloaded blocks count for past
// its GPU match, each tier at its weight, as routing.Pick credits them.
func (p *Placement) creditOffloaded(m match) int {
	room := p.req.TotalBlocks - min(m.blocks, p.req.TotalBlocks)
	weights := [2]float64{max(p.cost.CPUTierWeight, 0), max(p.cost.StorageTierWeight, 0)}
	total := 0.0
	for t, n := range [2]int{m.cpu, m.storage} {
		n = min(max(n, 0), max(room, 0))
		room -= n
		total += float64(n*p.req.BlockSize) * weights[t]
	}
	return int(total)
}

// Pick is the routing decision admission made for the request, for the
// policy to follow among the candidates dials: its Index is Engine's place
// in dials, ok false when the request was not placed on a known engine or
// Engine is not among dials (it failed, or was drained, since).
func (p *Placement) Pick(dials []string) (*Pick, bool) {
	if p == nil || p.Engine == "" {
		return nil, false
	}
	for i, d := range dials {
		if d == p.Engine {
			out := &Pick{Decision: p.decision, f: p.f, req: p.request, dials: dials}
			out.Index = i
			return out, true
		}
	}
	return nil, false
}

// Reserve is [Fleet.TryReserve] for a placed request.
// An engine may take the request when it has room as TryReserve counts
// it, or — when it holds the request's prefix (at least half of the
// longest match, by its own blocks: predicted ones do not count here) —
// when the request's expected wait there is shorter than the prefill it
// saves: the requests queued beyond the engine's capacity, plus one, over
// the engine's drain rate (at least the time since its last completion),
// against the prefix's tokens over the prefill rate, counted for every
// sequence a cold prefill would stall (the batch of the roomiest other
// engine, plus one; the holder's own when the fleet is full), and doubled
// at most when that engine's cache is full by its events: the copy evicts
// as many cached tokens there (see coldCopy). Such a request is reserved
// over the holder's capacity and queues in the engine (ReasonHitWait): the
// bound follows the engine's own figures — the slower it drains, the fewer
// wait; the longer the prefix and the fuller the alternative, the more.
//
// Among the engines that may take it, routing.Pick chooses on the prompt's
// prefix and the loads of now, as the policy would, and the reservation
// is made there. With PassPreferred only the prefix's holders are asked.
// When no known engine may take it, it fails open on unknown engines
// unless fail-closed, as TryReserve does.
//
// A request whose uncached prompt at the chosen engine is longer than
// Limits.LongPrefill occupies that engine for its expected prefill (see
// longPrefill): until then the engine has no room for anyone else, and a
// holder's wait counts at least that long.
//
// failOpen says the request was admitted on unknown engine state; ok
// false that no engine may take it now.
func (p *Placement) Reserve(dials []string, lim Limits, pass admission.Pass) (res *upstreams.Reservation, failOpen, ok bool) {
	f := p.f
	p.Engine, p.Reason, p.Wait, p.WaitBound, p.Evicts, p.Occupies = "", "", 0, 0, 0, 0
	// Capacity counts only on engines that may serve the model, learned
	// anew at each try: a parked request sees an engine's models change.
	dials, notFound := f.Serving(p.request.Model, dials)
	if notFound {
		return nil, false, false
	}
	var loads []dialLoad
	if pass == admission.PassPreferred {
		loads = f.loads(p.holdersAmong(dials), lim)
	} else {
		loads = f.loads(dials, lim)
	}
	if !p.weigh(loads, lim) {
		if pass == admission.PassPreferred {
			return nil, false, false
		}
		// (No engine weighed may take it: a holder's queue place would
		// have been offered there, and a cold engine's is not offered
		// to a request whose prefix another engine holds.)
		res, failOpen, ok = f.TryReserve(dials, p.queueLimits(0, lim))
		if ok && failOpen {
			p.Reason = ReasonFailOpen
		}
		return res, failOpen, ok
	}
	i, d := p.pick(f, loads)
	if d.Predicted > 0 {
		// The prefills ahead of it go on while it waits for a slot: it
		// waits for the longer of the two, not both.
		d.slotWait = max(slotWait(loads[i].l, lim)-d.Ahead, 0)
		d.Predicted += d.slotWait
	}
	c := p.cachedOn(loads[i].e.Dial())
	reason := ReasonCold
	switch {
	case c > 0 && loads[i].free > 0:
		reason = ReasonHit
	case c > 0:
		reason = ReasonHitWait
	case p.Holder != "":
		reason = ReasonMoved
	}
	res = p.reserve(loads[i].e, reason, d)
	if p.Occupies = p.longPrefill(loads[i], lim); p.Occupies > 0 {
		res.Occupy(p.Occupies)
	}
	return res, false, true
}

// longPrefill is how long at most the request occupies engine l when its
// uncached prompt there is longer than the long-prefill threshold: those
// tokens over the prefill rate. The hold ends sooner when the stream's
// first token shows the prefill over (upstreams.Reservation.Prefilled).
// vLLM prefills a running request's chunks before it schedules any newly
// waiting one, so a request sent to an engine during a long prefill waits
// for all of it; held as full meanwhile, the engine gets no such request,
// and a long prompt costs the fleet one engine's prefill time instead of
// every request that lands behind it.
func (p *Placement) longPrefill(l dialLoad, lim Limits) time.Duration {
	threshold := lim.LongPrefill
	if threshold == 0 {
		threshold = DefaultLongPrefill
	}
	uncached := p.req.PromptTokens - l.cached
	if threshold < 0 || uncached <= threshold {
		return 0
	}
	return time.Duration(float64(uncached) / prefillRate(l.l, lim) * float64(time.Second))
}

// slotWait is how long, in seconds, a request placed on engine l waits
// for a batch slot. Admission may place it beyond the engine's
// max_inflight, in its engine queue or at a holder worth waiting for;
// there it waits for as many requests to end as are ahead of it beyond
// the batch, itself included, at the engine's drain rate. The prediction
// pick takes from routing.Pick leaves this wait out, since pick tells
// Pick of no batch limit (admission decided who has room): without it,
// the requests that wait longest were predicted as if they had a slot.
// It counts from the batch, not from admission's capacity as
// queuedBeyond does for worthWaiting: a place in the engine queue is no
// slot, and an engine full by its KV cache still has its batch. 0 within
// the batch, or when the limit or the drain rate is unknown; at most an
// hour, so that a rate decayed near zero makes no wild prediction.
func slotWait(l upstreams.Load, lim Limits) float64 {
	limit := batchLimit(l, lim)
	over := inUse(l, lim) + 1 - float64(limit)
	if limit <= 0 || !(over > 0) || !(l.DrainRate > 0) {
		return 0
	}
	return min(over/l.DrainRate, 3600)
}

// prefillRate is the prefill speed assumed for engine l, in uncached
// prompt tokens per second: the configured rate, else the one derived from
// the engine's own counters (Load.PrefillRate), else the default.
func prefillRate(l upstreams.Load, lim Limits) float64 {
	switch {
	case lim.PrefillRate > 0:
		return lim.PrefillRate
	case l.PrefillRate > 0:
		return l.PrefillRate
	}
	return DefaultPrefillRate
}

// reserve reserves on e and records the outcome.
func (p *Placement) reserve(e *upstreams.Engine, reason string, d Decision) *upstreams.Reservation {
	p.Engine, p.Reason, p.decision = e.Dial(), reason, d
	return e.Reserve()
}

// queueLimits are lim for an engine holding held of the prompt's tokens:
// its engine queue (Limits.EngineQueue) is for requests it holds the
// prefix of, or that no engine holds any of. A request whose prefix lives
// elsewhere does not take a place in a cold engine's queue: it would wait
// there for a slot and then prefill the prefix again, where admission
// weighs waiting at its holder against a cold engine's free slot. (The
// kv-pressure scenario's hit rate moves by ±5 points from run to run, too
// much to show the difference either way; the rule is the affinity's.)
func (p *Placement) queueLimits(held int, lim Limits) Limits {
	if p.Holder != "" && !p.holds(held) {
		lim.EngineQueue = 0
	}
	return lim
}

// holds reports whether an engine caching this many of the prompt's
// tokens is one of its holders: at least half of the longest match.
func (p *Placement) holds(cached int) bool { return cached > 0 && 2*cached >= p.Cached }

// holdersAmong is the prefix's holders that are among dials.
func (p *Placement) holdersAmong(dials []string) []string {
	var out []string
	for _, h := range p.holders {
		if slices.Contains(dials, h) {
			out = append(out, h)
		}
	}
	return out
}

// weigh marks which engines of loads may take the request (see
// Placement.Reserve) and reports whether any may.
func (p *Placement) weigh(loads []dialLoad, lim Limits) bool {
	alt := -1 // the roomiest engine that is no holder: the cold alternative
	for i := range loads {
		l := &loads[i]
		if !l.l.Known {
			continue
		}
		l.cached, l.held = p.cachedOn(l.e.Dial()), p.heldOn(l.e.Dial())
		l.free = probeFree(engineFree(l.l, p.queueLimits(l.held, lim)), l.probe)
		if l.free > 0 && !p.holds(l.held) && (alt < 0 || l.free > loads[alt].free) {
			alt = i
		}
	}
	any := false
	evicted := -1 // what a cold copy evicts on alt: read once, at the first full holder
	for i := range loads {
		l := &loads[i]
		switch {
		case !l.l.Known:
		case l.free > 0:
			l.ok = true
		case p.adapterHome(loads, i, alt, lim):
			l.ok = true
		case p.holds(l.held) && !l.probe: // a probe is one request, never a queue
			cold := coldCopy{prefix: l.held, batch: batch(l.l)}
			if alt >= 0 {
				if evicted < 0 {
					evicted = p.evictedOn(loads[alt])
				}
				cold.batch, cold.evicted = batch(loads[alt].l), min(evicted, l.held)
			}
			var wait, bound time.Duration
			l.ok, wait, bound = worthWaiting(l.l, lim, cold)
			if l.e.Dial() == p.Holder {
				p.Wait, p.WaitBound, p.Evicts = wait, bound, cold.evicted
			}
		}
		any = any || l.ok
	}
	return any
}

// adapterHome reports whether loads[i], full, may still take a LoRA
// adapter's request because the adapter runs or waits there: elsewhere it
// would wait for an adapter slot and load (routing.Adapter's costs), which
// is worth a wait in this engine's queue as long as that wait — the queue
// beyond its capacity, plus one, over its drain rate — is shorter than
// the difference at prefill speed. alt is the roomiest engine that holds
// no prefix of the prompt (-1: none), the request's other way in.
// Without this, admission at full load sends an adapter's requests to
// whichever engine frees a slot first, and the adapters spread over
// every engine, each loading and waiting for slots in turn.
func (p *Placement) adapterHome(loads []dialLoad, i, alt int, lim Limits) bool {
	l := &loads[i]
	if p.decision.lora == "" || l.probe || !(l.l.DrainRate > 0) || lim.PrefillRate < 0 {
		return false
	}
	here := adapterOn(l.e, p.decision.lora)
	if here != routing.AdapterRunning && here != routing.AdapterWaiting {
		return false
	}
	elsewhere := routing.AdapterNoSlot
	if alt >= 0 {
		elsewhere = adapterOn(loads[alt].e, p.decision.lora)
	}
	saved := p.cost.AdapterWeight * (elsewhere.Share() - here.Share()) // tokens
	if saved <= 0 {
		return false
	}
	wait := float64(queuedBeyond(l.l, lim)+1) / l.l.DrainRate
	wait = max(wait, l.l.SinceDone.Seconds(), l.l.Occupied.Seconds())
	return wait < saved/prefillRate(l.l, lim)
}

// worthWaiting weighs a wait at a full holder (load l, cached tokens of
// the prompt) against a cold copy of the prefix: ok when the expected
// wait — the queue ahead over the drain rate, and at least the time since
// the holder's last completion — is below the bound, the copy's prefill
// and what it evicts, for the request itself and each sequence of the
// cold batch it stalls, at most maxStalled of them.
func worthWaiting(l upstreams.Load, lim Limits, cold coldCopy) (ok bool, wait, bound time.Duration) {
	if lim.PrefillRate < 0 || l.KVUsage >= lim.KV || cold.prefix <= 0 {
		return false, 0, 0
	}
	bs := float64(min(cold.batch, maxStalled)+1) * float64(cold.prefix+cold.evicted) / prefillRate(l, lim)
	bound = time.Duration(bs * float64(time.Second))
	if !(l.DrainRate > 0) {
		return false, 0, bound // no completion seen yet: the wait is unknown
	}
	ws := float64(queuedBeyond(l, lim)+1) / l.DrainRate
	// A holder that has completed nothing for longer than that (its
	// running requests are long, or not ours) is no faster than its
	// silence: the rate is an average that decays only over ~10 s.
	ws = max(ws, l.SinceDone.Seconds())
	// Nor can it serve the hit before a long prefill it is running ends.
	ws = max(ws, l.Occupied.Seconds())
	return ws < bs, time.Duration(ws * float64(time.Second)), bound
}

// maxStalled is how many sequences of a cold engine's batch the wait at
// a full holder is weighed against. A cold prefill holds each of them up
// about its own length once, one long gap between tokens, where the wait
// delays a first token and everything queued behind it at the holder.
// Counting a whole batch of 16 let a request wait up to 17 prefills at a
// busy holder; on the quality bench's prefix-high at 1.3× the no-hit
// capacity (real Caddy, llm only, 2,048-token prefixes, alternating
// runs) TTFT p90 was 0.58–1.23 s, mean 0.80 s (15 runs), counting the
// whole batch, and 0.42–0.55 s (3 runs) with 2, 0.41–0.63 s (6) with 1,
// 0.45–0.76 s (6) with 3; the hit rate 73.5% against 71.5%, 69.7%, 72.8%.
// At 1.7× and on kv-pressure and prefix-long the runs' spread covered
// the differences.
const maxStalled = 2

// coldCopy is what sending a request away from its prefix's full holder
// costs: the cold engine prefills the prefix again, stalling every
// sequence of its batch meanwhile, and when its cache is full the copy
// evicts as many cached tokens, which a later request there may have to
// prefill again.
type coldCopy struct {
	prefix  int // tokens of the prompt the holder has
	batch   int // sequences the cold engine runs or is about to
	evicted int // cached tokens the copy evicts on the cold engine, at most prefix
}

// evictedOn is how many cached tokens a cold copy of the prompt on l
// evicts: the blocks it stores beyond the room the engine's cache has
// left, by the engine's own events (coldCopy counts at most the prefix's).
// 0 without live events or a known cache size (num_gpu_blocks): the
// mirror's own bound is no engine's.
func (p *Placement) evictedOn(l dialLoad) int {
	m := p.f.index.Mirror(l.e.Dial())
	if m == nil || l.l.NumGPUBlocks <= 0 {
		return 0
	}
	if connected, trusted := m.State(); !connected || !trusted {
		return 0
	}
	bs := m.BlockSize()
	if bs <= 0 {
		return 0
	}
	blocks, capacity := m.Fill()
	stored := (p.req.PromptTokens - l.cached) / bs
	over := blocks + stored - min(capacity, l.l.NumGPUBlocks)
	return max(over, 0) * bs
}

// queuedBeyond is how many requests an engine with no room holds beyond
// its capacity as engineFree counts it: they wait in its queue.
func queuedBeyond(l upstreams.Load, lim Limits) int {
	if free := engineFree(l, lim); free < 0 {
		return -free
	}
	if batchLimit(l, lim) == 0 {
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
	e      *upstreams.Engine
	l      upstreams.Load
	free   int  // engineFree (known engines)
	cached int  // prompt tokens it holds, predicted blocks included
	held   int  // of cached, those of its own blocks (see heldOn)
	ok     bool // it may take the request
	probe  bool // its breaker is half-open: room for one probe at most
}

// loads snapshots the loads of dials that are in service (not drained nor
// asleep) and not, when lim.HonorBreaker, kept out by their breaker (see
// breakerAdmits).
func (f *Fleet) loads(dials []string, lim Limits) []dialLoad {
	out := make([]dialLoad, 0, len(dials))
	b, now := f.Breaker(), time.Now()
	for _, d := range dials {
		if f.OutOfService(d) {
			continue
		}
		e := f.registry.Ensure(d)
		l := e.Load()
		if ok, probe := breakerAdmits(b, now, d, l, lim); ok {
			out = append(out, dialLoad{e: e, l: l, probe: probe})
		}
	}
	return out
}

// pick chooses among the engines that may take the request as the policy
// would: routing.Pick on the placement's prefix figures and the loads of
// now, those that may not take it left out; the first that may when Pick
// has no answer.
func (p *Placement) pick(f *Fleet, loads []dialLoad) (int, Decision) {
	cands := make([]routing.Candidate, len(loads))
	first := -1
	for i := range loads {
		c := f.candidate(Query{}, loads[i].l, loads[i].e.Dial())
		c.Adapter = adapterOn(loads[i].e, p.decision.lora)
		if m, ok := p.match[c.Dial]; ok {
			c.Tier, c.MatchedBlocks, c.Speculative = m.tier, m.blocks, m.predicted
			c.CPUBlocks, c.StorageBlocks = m.cpu, m.storage
		}
		switch {
		case !loads[i].ok:
			c.Unavailable = "full"
		case first < 0:
			first = i
		}
		// Admission decided who has room; a holder taking a request over
		// its capacity is no "saturated" candidate here.
		c.MaxInflight = 0
		cands[i] = c
	}
	d := p.decision
	d.Decision = routing.Pick(p.req, cands, p.cost, false)
	if d.Index < 0 {
		d.Index, d.Tier, d.Outcome, d.Share = first, routing.LoadOnly, routing.Miss, 0
	}
	if loads[d.Index].cached < p.Cached && d.Outcome != routing.OverriddenByLoad {
		// Pick did not see the full holder it was passed over for.
		d.Outcome = routing.OverriddenByLoad
	}
	return d.Index, d
}
