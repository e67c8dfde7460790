package routing

import (
	"cmp"
	"math"
	"slices"
)

// Exclusion reasons reported in Scored.Excluded (besides
// Candidate.Unavailable, which is reported verbatim).
const (
	ExcludedSaturated   = "saturated"    // load >= MaxInflight
	ExcludedKVFull      = "kv_full"      // KVUsage >= Config.KVLimit
	ExcludedBoundedLoad = "bounded_load" // load would exceed the bounded-load cap
)

// maxGauge caps sanitised inputs so that sums of them stay finite.
const maxGauge = 1e9

// stackViews is how many candidates Pick handles without allocating.
const stackViews = 64

// gauge sanitises a float read from outside: NaN and negatives count as 0.
func gauge(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return fmin(v, maxGauge)
}

// counter sanitises a local counter.
func counter(v int64) float64 {
	if v <= 0 {
		return 0
	}
	return fmin(float64(v), maxGauge)
}

// fmin and fmax are for sanitised (non-NaN) values; unlike math.Min/Max
// they inline, which matters in Pick's per-candidate loops.
func fmin(a, b float64) float64 {
	if a < b {
		return a
	}
	return b
}

func fmax(a, b float64) float64 {
	if a > b {
		return a
	}
	return b
}

// prompt is Request with its units reconciled.
type prompt struct {
	tokens    float64 // prompt length in tokens
	blockSize float64 // 0 when unknown
	blocks    int     // full blocks; a match is clamped to it
	// peer holds the speeds a candidate's own fade into, and those a
	// candidate whose engine has shown none of its own is predicted with
	// (see peerSpeeds).
	peer Work
	// peerSpeeds are the speeds peer shows, the configured ones where it
	// shows none.
	peerSpeeds speeds
}

func newPrompt(r Request) prompt {
	var p prompt
	if r.BlockSize > 0 {
		p.blockSize = float64(r.BlockSize)
	}
	switch {
	case r.PromptTokens > 0:
		p.tokens = fmin(float64(r.PromptTokens), maxGauge)
	case r.TotalBlocks > 0 && r.BlockSize > 0:
		p.tokens = fmin(float64(r.TotalBlocks)*p.blockSize, maxGauge)
	}
	switch {
	case r.TotalBlocks > 0:
		p.blocks = r.TotalBlocks
	case p.blockSize > 0:
		p.blocks = int(p.tokens / p.blockSize)
	}
	return p
}

// view is what Pick derives from one candidate.
type view struct {
	load    float64 // requests on the candidate (bounded-load and imbalance unit)
	running float64
	queued  float64
	kv      float64
	matched int     // matched full blocks, clamped to the prompt
	share   float64 // matched / prompt blocks
	cached  float64 // tokens credited as cached (tier-weighted)
	// offloaded are the CPU and storage blocks credited past matched.
	offloaded [2]int
	hard      string // exclusion known before comparing candidates
	adapter   Adapter
	pred      Prediction // without the request's own prefill (see predict)
	// Set by Pick's second pass: the hot-spot rules' exclusion, and the
	// cost (for candidates not excluded).
	excluded string
	cost     float64
}

func (p *prompt) view(c *Candidate, cfg *Config) view {
	v := view{adapter: c.Adapter}
	in := counter(c.Inflight)
	if c.LoadKnown {
		// Requests dispatched since the scrape join the queue if the
		// engine was already queueing, else they start running at once;
		// counting them all as queued would make a holder's own recent
		// traffic outweigh the prefix it holds.
		v.running = gauge(c.Running)
		v.queued = gauge(c.Waiting)
		if v.queued > 0 {
			v.queued += counter(c.Dispatched)
		} else {
			v.running += counter(c.Dispatched)
		}
		// The gauges lag; our own in-flight count is a floor.
		v.load = fmax(v.running+v.queued, in)
		v.kv = fmin(gauge(c.KVUsage), 1)
	} else {
		// Without gauges all we know is what we sent; assume it runs.
		v.running = in
		v.load = in
	}

	trust := 0.0
	switch c.Tier {
	case Precise:
		trust = 1
	case Approximate:
		trust = cfg.ApproximateWeight
	}
	if trust > 0 && c.MatchedBlocks > 0 && p.blocks > 0 {
		v.matched = min(c.MatchedBlocks, p.blocks)
		v.share = float64(v.matched) / float64(p.blocks)
		raw := v.share * p.tokens
		if p.blockSize > 0 {
			raw = float64(v.matched) * p.blockSize
		}
		v.cached = fmin(raw, p.tokens) * trust
	}
	if c.Tier == Precise && p.blockSize > 0 {
		v.creditOffloaded(c, p, cfg)
	}

	switch {
	case c.Unavailable != "":
		v.hard = c.Unavailable
	case c.MaxInflight > 0 && v.load >= float64(c.MaxInflight):
		v.hard = ExcludedSaturated
	case c.LoadKnown && cfg.KVLimit > 0 && v.kv >= cfg.KVLimit:
		v.hard = ExcludedKVFull
	}
	v.pred = v.predictAhead(c, p.speeds(c, cfg), cfg)
	return v
}

// speedFade is how old, in seconds, an engine's own speeds may grow before
// its peers' replace them entirely (see speeds). A few default poll
// intervals (2 s), so that a busy engine whose scrape happened to show no
// ended prefill barely moves; short enough that an idle engine gets a
// request, and with it fresh speeds, within seconds at light load.
const speedFade = 10.0

// speeds are what a prediction divides by and adds: the prefill rate less
// its step and the step taken out of it (see stepless), the whole step
// (for the slot wait), and the mean uncached prompt that prices a waiting
// request that is not this gateway's (0: Config.QueueWeight).
type speeds struct{ rate, step, slotStep, mean float64 }

// speedsOf are the speeds w shows, the configured ones where it shows none.
func speedsOf(w *Work, cfg *Config) speeds {
	step := positiveOr(w.StepSeconds, cfg.StepSeconds)
	rate, taken := stepless(positiveOr(w.PrefillRate, cfg.PrefillRate), w, step)
	return speeds{rate: rate, step: taken, slotStep: step, mean: gauge(w.MeanUncached)}
}

// freshness is how much an engine's own speeds count against its peers':
// 1 while fresh, falling linearly to 0 at speedFade seconds old.
func freshness(age float64) float64 {
	if !(age > 0) {
		return 1
	}
	return fmax(1-age/speedFade, 0)
}

// speeds are the speeds c is predicted with: its engine's own, where it has
// shown them, blended with its peers' (p.peer) by their freshness f:
// seconds per token and steps are f × own + (1 − f) × peers'. Only
// traffic refreshes an engine's speeds, and at light load each request
// goes to the fastest engine predicted, so an idle engine whose own
// figures were a little worse than its peers' (measured under load,
// before a restart or a sleep, or noise) would never get a request to
// show it is as fast: it would starve. Fading them, it ties with its
// peers once they are speedFade old, and the tie-break gives it requests.
// The mean uncached prompt is the engine's own, else its peers'.
func (p *prompt) speeds(c *Candidate, cfg *Config) speeds {
	w := c.Work
	if !known(w.PrefillRate) && known(p.peer.PrefillRate) {
		// The rate was observed on its engine's mean prompt (see
		// stepless): the two go together.
		w.PrefillRate, w.MeanUncached = p.peer.PrefillRate, p.peer.MeanUncached
	}
	if !known(w.StepSeconds) && known(p.peer.StepSeconds) {
		w.StepSeconds = p.peer.StepSeconds
	}
	if !known(w.MeanUncached) {
		// Its prompts are likely its peers': without a mean, stepless
		// could not take the step out of its rate, and it would be
		// predicted slower than peers of the same speed.
		w.MeanUncached = p.peer.MeanUncached
	}
	own := speedsOf(&w, cfg)
	if known(c.Work.MeanUncached) {
		own.mean = c.Work.MeanUncached
	}
	f := freshness(c.Work.SpeedAge)
	if f == 1 {
		return own
	}
	peer := &p.peerSpeeds
	return speeds{
		rate:     1 / (f/own.rate + (1-f)/peer.rate),
		step:     f*own.step + (1-f)*peer.step,
		slotStep: f*own.slotStep + (1-f)*peer.slotStep,
		mean:     own.mean,
	}
}

// known reports a usable observed figure (a positive gauge).
func known(v float64) bool { return v > 0 && v < maxGauge }

// peerSpeeds are the speeds a candidate's own fade into as they age (see
// prompt.speeds), and those a candidate whose engine has not shown its own
// yet is predicted with: the prefill rate, mean prompt and step of the
// median engine among those that have shown a rate, ranked by how long
// the prompt's prefill (tokens) would take there idle, each weighted by
// its freshness (see medianOf); the median step where that engine has
// shown none. One engine's speeds, not medians of each figure, so that
// an engine predicted with them ties with that engine exactly.
//
// Engines of one pool are usually alike, and an engine predicted slower
// than its peers by the configured cold-start figures would win no
// request at light load, so never show its speed: a new, restarted or
// repaired engine would stay idle (TestPolicyRetriesAndBreaker's repaired
// engine was never probed so). Without such peers the configured figures
// apply.
func peerSpeeds(cands []Candidate, tokens float64, cfg *Config) Work {
	var w Work
	idle := func(c *Candidate) float64 {
		if !known(c.Work.PrefillRate) {
			return -1
		}
		sp := speedsOf(&c.Work, cfg)
		return tokens/sp.rate + sp.step
	}
	if i := medianOf(cands, idle); i >= 0 {
		m := &cands[i].Work
		w.PrefillRate, w.MeanUncached, w.StepSeconds = m.PrefillRate, m.MeanUncached, m.StepSeconds
	}
	if !known(w.StepSeconds) {
		if i := medianOf(cands, func(c *Candidate) float64 { return c.Work.StepSeconds }); i >= 0 {
			w.StepSeconds = cands[i].Work.StepSeconds
		}
	}
	return w
}

// medianOf is the index of the candidate with the median figure among
// those that show it (a figure that is not known counts as not shown),
// each weighted by its freshness: the first, in increasing order, to
// reach half their total weight (the lower, faster, one of an even count
// of equal weights). Stale figures so give way to fresh ones: at light
// load the engines that get the requests are those with fresh speeds, and
// idle ones whose stale figures were the median would keep the others' as
// stale as theirs. When no figure is fresh, all weigh alike. -1 when no
// candidate shows the figure. It allocates nothing for up to stackViews
// candidates.
func medianOf(cands []Candidate, figure func(*Candidate) float64) int {
	// Each candidate's figure and weight are taken once: the sort compares
	// figures O(n log n) times.
	type figured struct {
		i          int
		fig, fresh float64
	}
	var buf [stackViews]figured
	fs := buf[:0]
	total := 0.0
	for i := range cands {
		if fig := figure(&cands[i]); known(fig) {
			f := figured{i: i, fig: fig, fresh: freshness(cands[i].Work.SpeedAge)}
			fs = append(fs, f)
			total += f.fresh
		}
	}
	if len(fs) == 0 {
		return -1
	}
	slices.SortStableFunc(fs, func(a, b figured) int { return cmp.Compare(a.fig, b.fig) })
	if total == 0 {
		for k := range fs {
			fs[k].fresh = 1
		}
		total = float64(len(fs))
	}
	cum := 0.0
	for _, f := range fs {
		if cum += f.fresh; cum >= total/2 {
			return f.i
		}
	}
	return fs[len(fs)-1].i
}

// predictAhead is the candidate's predicted time to first token for a
// request with nothing to prefill: the tokens ahead over the prefill rate,
// the wait for a batch slot, one step, and the KV and adapter penalties.
// Pick adds the request's own prefill (see Pick's cost).
func (v *view) predictAhead(c *Candidate, sp speeds, cfg *Config) Prediction {
	w := &c.Work
	pr := Prediction{OwnAhead: gauge(w.OwnPrefill)}
	pr.Rate, pr.StepSeconds = sp.rate, sp.step
	pending := counter(w.OwnPending)
	decoding := counter(w.OwnDecoding)
	if c.LoadKnown {
		// The engine's waiting requests that are not this gateway's: its
		// queue less our pending requests the gauges can show (those
		// dispatched since the scrape cannot).
		mine := fmax(pending-counter(c.Dispatched), 0)
		foreign := fmax(gauge(c.Waiting)-mine, 0)
		pr.ForeignAhead = foreign * positiveOr(sp.mean, cfg.QueueWeight)
		// The decoding sequences: all of them less the prefills priced
		// above (ours pending, the others waiting).
		pr.DecodeAhead = cfg.RunningWeight * fmax(v.running+v.queued-pending-foreign, 0)
	} else {
		pr.DecodeAhead = cfg.RunningWeight * fmax(decoding, v.running-pending)
	}
	if due := gauge(w.OwnDueSeconds); due > 0 && pr.OwnAhead > 0 {
		// The engine has been prefilling ours since they were sent: what
		// they put ahead is the time until the last is due, not their
		// tokens anew.
		pr.OwnDueSeconds = due
		pr.AheadSeconds = due + pr.ForeignAhead/pr.Rate
	} else {
		pr.AheadSeconds = (pr.OwnAhead + pr.ForeignAhead) / pr.Rate
	}
	if c.MaxInflight > 0 {
		// Beyond the batch, each request ahead waits for a slot to free.
		if over := v.load + 1 - float64(c.MaxInflight); over > 0 {
			perSlot := cfg.SlotSteps * sp.slotStep
			if dr := gauge(w.DrainRate); dr > 0 {
				perSlot = 1 / dr
			}
			pr.SlotSeconds = over * perSlot
		}
	}
	// The penalties are waits of their own (an adapter load, preemption),
	// not prefill: converted at the reference rate, so that an engine
	// whose rate is known is not penalised differently from one whose
	// rate is not.
	pr.PenaltySeconds = (cfg.KVWeight*v.kv*v.kv + v.adapterCost(cfg)) / cfg.PrefillRate
	pr.TTFT = pr.AheadSeconds + pr.SlotSeconds + pr.StepSeconds + pr.PenaltySeconds
	return pr
}

// stepless is the engine's observed prefill rate without the step each
// request's prefill time ends with, and the step the prediction adds back.
// The engine's counters time a prefill from scheduling to the first
// token, so a mean request of MeanUncached tokens took MeanUncached ÷ rate
// seconds, one step of them not prefill. At most half of that time is
// taken for the step, so the rate at most doubles, and the step added back
// is what was taken: a mean request is predicted its observed prefill
// time, whatever the step. (The step seen in the streams' token gaps
// includes other requests' prefill chunks and can exceed half a short
// prefill; adding it whole on top of an uncorrected rate counted it twice:
// on the quality bench, 1,032-token prompts were predicted 0.19 s where
// they took 0.12 s.) Without the engine's own rate and mean, the rate is
// the configured one and the whole step is added.
func stepless(rate float64, w *Work, step float64) (float64, float64) {
	mean := gauge(w.MeanUncached)
	if !(w.PrefillRate > 0) || w.PrefillRate >= maxGauge || mean == 0 {
		return rate, step
	}
	per := mean / rate
	taken := fmin(step, per/2)
	return mean / (per - taken), taken
}

// positiveOr is v when it is a usable positive figure, else def.
func positiveOr(v, def float64) float64 {
	if v > 0 && v < maxGauge {
		return v
	}
	return def
}

// withPrefill is the prediction with the request's own uncached prefill
// (tokens, weighted by Config.PrefixWeight) added.
func (pr Prediction) withPrefill(tokens float64, cfg *Config) Prediction {
	pr.Prefill = tokens
	pr.PrefillSeconds = cfg.PrefixWeight * tokens / pr.Rate
	pr.TTFT += pr.PrefillSeconds
	return pr
}

// adapterCost is the adapter term in token-equivalents (Pick converts it
// at Config.PrefillRate): what the request
// waits for its LoRA adapter to get a slot and load there.
func (v *view) adapterCost(cfg *Config) float64 { return cfg.AdapterWeight * v.adapter.Share() }

// Pick chooses the candidate with the least estimated wait for req (see the
// package documentation for the cost model and the hot-spot rules). It
// never panics on any input and allocates nothing unless explain is set or
// there are more than 64 candidates. Index is -1 when cands is empty or every
// candidate is excluded.
func Pick(req Request, cands []Candidate, cfg Config, explain bool) Decision {
	cfg = cfg.normalized()
	d := Decision{Index: -1, Tier: LoadOnly, Outcome: Miss}
	if len(cands) == 0 {
		return d
	}
	p := newPrompt(req)
	p.peer = peerSpeeds(cands, p.tokens, &cfg)
	p.peerSpeeds = speedsOf(&p.peer, &cfg)

	var buf [stackViews]view
	views := buf[:0]
	if len(cands) > stackViews {
		views = make([]view, 0, len(cands))
	}
	// Pass 1: views, load statistics and the rules they set.
	views = p.views(views, cands, &cfg)
	s := newScorer(&p, &cfg, cands, views)

	// Pass 2: every candidate's exclusion and cost; the cheapest.
	minCost := math.Inf(1)
	found := false
	for i := range views {
		v := &views[i]
		if v.excluded = s.excluded(v); v.excluded != "" {
			continue
		}
		if v.cost = s.cost(v); !found || v.cost < minCost {
			minCost, found = v.cost, true
		}
	}

	// Pass 3: among (near-)ties, the highest rendezvous weight of the key,
	// so cold prefixes spread over the fleet yet stay put per key.
	if found {
		tie := fmax(cfg.TieTokens, 0) / cfg.PrefillRate
		key := mix64(req.Key)
		var bestW uint64
		for i := range views {
			if views[i].excluded != "" || views[i].cost > minCost+tie {
				continue
			}
			if w := hrwWeight(key, hashString(cands[i].Dial)); d.Index < 0 || w > bestW {
				d.Index, bestW = i, w
			}
		}
	}
	s.conclude(&d, req, cands, views)
	if explain {
		d.Scored = s.explain(cands, views)
	}
	return d
}

// views appends to dst every candidate's view.
func (p *prompt) views(dst []view, cands []Candidate, cfg *Config) []view {
	for i := range cands {
		dst = append(dst, p.view(&cands[i], cfg))
	}
	return dst
}

// scorer holds what Pick compares candidates by: the config, the prompt,
// and the hot-spot rules the loads set.
type scorer struct {
	cfg        *Config
	p          *prompt
	loadCap    float64 // bounded load: a candidate over it is excluded
	minLoad    float64 // the least loaded usable candidate's load
	loadOnly   bool    // imbalance: prefixes are not honoured
	bestCached float64 // the best prefix on offer among candidates that are up
}

// newScorer derives the load statistics over the usable candidates and
// the best prefix on offer among those that are up.
func newScorer(p *prompt, cfg *Config, cands []Candidate, views []view) scorer {
	s := scorer{cfg: cfg, p: p, loadCap: math.Inf(1)}
	var (
		usable       int
		sum, maxLoad float64
	)
	for i := range views {
		v := &views[i]
		if cands[i].Unavailable == "" {
			s.bestCached = fmax(s.bestCached, v.cached)
		}
		if v.hard != "" {
			continue
		}
		if usable == 0 || v.load < s.minLoad {
			s.minLoad = v.load
		}
		if usable == 0 || v.load > maxLoad {
			maxLoad = v.load
		}
		sum += v.load
		usable++
	}
	if usable > 0 {
		if cfg.Epsilon >= 0 {
			// Consistent hashing with bounded loads: the mean includes
			// this request.
			s.loadCap = fmax((1+cfg.Epsilon)*(sum+1)/float64(usable), cfg.BoundedLoadMin)
		}
		s.loadOnly = cfg.ImbalanceThreshold >= 0 && maxLoad-s.minLoad > cfg.ImbalanceThreshold
	}
	return s
}

// excluded is why v cannot be picked; "" when it can.
func (s *scorer) excluded(v *view) string {
	if v.hard != "" {
		return v.hard
	}
	// The least loaded candidate is never excluded for balance: it
	// cannot make the balance better by refusing.
	if v.load+1 > s.loadCap && v.load > s.minLoad {
		return ExcludedBoundedLoad
	}
	return ""
}

// cost is what Pick compares, in seconds: the predicted TTFT and the
// costs that are no part of it.
func (s *scorer) cost(v *view) float64 {
	// The decode footprint is a cost, not part of the prediction: what
	// the sequences decoding there take from the request's prefill is in
	// the step time, but they hold batch slots that the requests after
	// this one will miss. Like the other terms that are no wait of this
	// request's, it is converted at the reference rate.
	c := v.pred.TTFT + v.pred.DecodeAhead/s.cfg.PrefillRate
	if !s.loadOnly {
		// The request's prefill is its wait here (at this engine's
		// rate) and work for the fleet (in tokens, at the reference
		// rate: engines' rates would only add noise).
		prefill := fmax(s.p.tokens-v.cached, 0)
		c += s.cfg.PrefixWeight*prefill/v.pred.Rate + s.cfg.WorkWeight*prefill/s.cfg.PrefillRate
	}
	return c
}

// conclude fills in the decision's figures, outcome and tier from its
// pick (d.Index, -1 for none).
func (s *scorer) conclude(d *Decision, req Request, cands []Candidate, views []view) {
	if d.Index < 0 {
		if s.bestCached > 0 {
			d.Outcome = OverriddenByLoad
		}
		return
	}
	v := &views[d.Index]
	d.Share = v.share
	d.Prefill = fmax(s.p.tokens-v.cached, 0)
	pr := v.pred.withPrefill(d.Prefill, s.cfg)
	d.Predicted, d.Ahead = pr.TTFT, pr.AheadSeconds
	switch {
	case v.cached < s.bestCached:
		d.Outcome = OverriddenByLoad
	case v.cached > 0:
		d.Outcome = Hit
	}
	switch {
	case v.cached > 0:
		d.Tier = cands[d.Index].Tier
	case req.CacheKey && s.bestCached == 0:
		d.Tier = CacheKey
	}
}

// explain is every candidate as Pick saw it.
func (s *scorer) explain(cands []Candidate, views []view) []Scored {
	out := make([]Scored, len(cands))
	for i := range views {
		v := &views[i]
		out[i] = Scored{
			Dial:              cands[i].Dial,
			Tier:              cands[i].Tier,
			TierReason:        cands[i].TierReason,
			MatchedBlocks:     v.matched,
			SpeculativeBlocks: speculative(cands[i], v.matched),
			CPUBlocks:         v.offloaded[0],
			StorageBlocks:     v.offloaded[1],
			Share:             v.share,
			Load:              v.load,
			Adapter:           v.adapter,
			AdapterCost:       v.adapterCost(s.cfg) / s.cfg.PrefillRate,
			Prediction:        v.pred.withPrefill(fmax(s.p.tokens-v.cached, 0), s.cfg),
			Cost:              s.cost(v),
			Excluded:          s.excluded(v),
		}
	}
	return out
}

// creditOffloaded adds to v.cached the prompt's blocks c keeps in its
// offload tiers past its GPU match, each tier at its weight.
func (v *view) creditOffloaded(c *Candidate, p *prompt, cfg *Config) {
	room := p.blocks - v.matched
	for t, held := range [2]int{c.CPUBlocks, c.StorageBlocks} {
		n := min(max(held, 0), max(room, 0))
		v.offloaded[t] = n
		room -= n
		v.cached += float64(n) * p.blockSize * [2]float64{cfg.CPUTierWeight, cfg.StorageTierWeight}[t]
	}
	v.cached = fmin(v.cached, p.tokens)
}

// speculative is how many of the matched blocks (c's match after clamping)
// are c's speculative ones: they lie past the held ones, so a clamp to the
// prompt cuts them first. Bad figures count as none.
func speculative(c Candidate, matched int) int {
	spec := min(max(c.Speculative, 0), c.MatchedBlocks)
	held := c.MatchedBlocks - spec
	return max(min(spec, matched-held), 0)
}

// LeastLoaded is the least_conn-like fallback: the candidate (not
// Unavailable) with the fewest requests in flight from this gateway, then
// the fewest Running+Waiting (when LoadKnown). Ties are broken by rendezvous
// hashing keyed by the fleet's total in-flight and dispatched counts, so
// successive picks among equals rotate deterministically instead of always
// landing on the first. It returns -1 when no candidate is available.
func LeastLoaded(cands []Candidate) int {
	var key uint64
	for i := range cands {
		if cands[i].Unavailable == "" {
			key += uint64(counter(cands[i].Inflight)) + uint64(counter(cands[i].Dispatched))
		}
	}
	key = mix64(key)

	best := -1
	var bestIn, bestQ float64
	var bestW uint64
	for i := range cands {
		c := &cands[i]
		if c.Unavailable != "" {
			continue
		}
		in := counter(c.Inflight)
		q := 0.0
		if c.LoadKnown {
			q = gauge(c.Running) + gauge(c.Waiting)
		}
		w := hrwWeight(key, hashString(c.Dial))
		if best < 0 || in < bestIn || (in == bestIn && (q < bestQ || (q == bestQ && w > bestW))) {
			best, bestIn, bestQ, bestW = i, in, q, w
		}
	}
	return best
}
