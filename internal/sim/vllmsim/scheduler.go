package vllmsim

import (
	"sync"
	"time"

	"github.com/llmgw/caddy-llmgw/kvindex"
)

// simRequest is one generation request. Scheduler fields are guarded by
// Engine.mu; the output fields by mu, so handlers never take Engine.mu to
// read progress.
type simRequest struct {
	id        string
	tokens    []uint64 // prompt, then generated tokens
	promptLen int
	maxTokens int
	seed      uint64
	stream    bool             // wake the handler for every token, not only at the end
	pooling   bool             // prefill only (embeddings, score, ...): no prefix cache, no output tokens
	model     string           // echoed in responses
	lora      string           // LoRA adapter name, "" for the base model
	loraID    int              // its lora_id, 0 for the base model
	extra0    []any            // extra keys of block 0 ([lora, salt], [salt] or [lora]), nil if none
	extraRest []any            // extra keys of every later block ([lora]), nil if none
	mm        kvindex.KeySpec  // with multimodal items (MM not empty): each block's extra keys
	hashes    []kvindex.Digest // digests of full blocks of tokens known so far
	arrival   float64          // simulated clock at submission, seconds
	scheduled float64          // simulated clock when first scheduled (valid once admitted)
	prefill   float64          // simulated seconds from first scheduling to first token (once out > 0)
	lastTok   float64          // simulated clock at its latest output token (once out > 0)
	seq       uint64           // arrival order (Engine.submitted)

	// Scheduler state (Engine.mu).
	blocks      []int32
	numComputed int
	numStored   int // leading blocks cached by this request (hits or stored)
	stepTokens  int
	admitted    bool // counted in prefix-cache queries once
	aborted     bool
	finished    bool

	mu       sync.Mutex
	notify   chan struct{} // cap 1: progress was made
	out      int           // generated tokens
	cached   int           // prompt tokens served from the prefix cache
	done     bool
	err      error
	finish   string
	firstTok time.Time
}

func (r *simRequest) signal() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// progress returns the output state.
func (r *simRequest) progress() (out int, done bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out, r.done, r.err
}

// counters are the engine's cumulative statistics for the current process.
type counters struct {
	requestsServed uint64
	promptTokens   uint64
	genTokens      uint64
	queries        uint64
	hits           uint64
	preemptions    uint64
	batches        uint64
	steps          uint64
	events         uint64
	loraLoads      uint64
	poolingServed  uint64            // pooling requests finished (Stats.PoolingRequestsServed)
	byEndpoint     map[string]uint64 // requests received by API path (Stats.RequestsByEndpoint)
	// adapterArrivals and adapterInFlight are Stats.AdapterArrivals and
	// Stats.AdapterArrivalsInFlight.
	adapterArrivals, adapterInFlight uint64
	ttft                             histogram
	itl                              histogram // inter_token_latency_seconds: simulated time between a request's output tokens
	prefillTime                      histogram // request_prefill_time_seconds, observed when a request finishes
}

// ttftBuckets are vLLM's time_to_first_token_seconds buckets.
var ttftBuckets = [...]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// itlBuckets are vLLM's inter_token_latency_seconds buckets.
var itlBuckets = [...]float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}

// requestTimeBuckets are vLLM's buckets of the per-request phase histograms
// (request_latency_buckets in vllm/v1/metrics/loggers.py), here
// request_prefill_time_seconds.
var requestTimeBuckets = [...]float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

// maxBuckets bounds every histogram's finite buckets. The counts are an
// array, not a slice, so that copying the counters under Engine.mu (as
// metricsText does) copies them too.
const maxBuckets = 24

// histogram is a Prometheus histogram over the finite upper bounds in
// bounds (+Inf is implied by count).
type histogram struct {
	bounds []float64          // shared, read-only
	counts [maxBuckets]uint64 // non-cumulative, per bound
	count  uint64
	sum    float64
}

// Compile-time checks that every bucket list fits maxBuckets.
var (
	_ [maxBuckets - len(ttftBuckets)]struct{}
	_ [maxBuckets - len(requestTimeBuckets)]struct{}
	_ [maxBuckets - len(itlBuckets)]struct{}
)

func (h *histogram) observe(v float64) {
	h.count++
	h.sum += v
	for i, b := range h.bounds {
		if v <= b {
			h.counts[i]++
			return
		}
	}
}

// newCounters returns zeroed counters with their histograms' buckets.
func newCounters() counters {
	return counters{ttft: histogram{bounds: ttftBuckets[:]}, itl: histogram{bounds: itlBuckets[:]}, prefillTime: histogram{bounds: requestTimeBuckets[:]},
		byEndpoint: make(map[string]uint64)}
}

// simNowLocked is the simulated clock: it advances by each step's simulated
// duration (interpolated from wall time inside a step) and stands still
// while the engine idles, so latency metrics exclude the host's own
// overheads and do not depend on TimeScale.
func (e *Engine) simNowLocked() float64 {
	if !e.inStep {
		return e.simClock
	}
	return min(e.simClock+time.Since(e.stepWall).Seconds()*e.cfg.TimeScale, e.stepEnd)
}

// metricSeconds is a simulated duration as the latency histograms report
// it: on the simulated clock, or in wall seconds with WallClockMetrics.
func (e *Engine) metricSeconds(d float64) float64 {
	if e.cfg.WallClockMetrics {
		return d / e.cfg.TimeScale
	}
	return d
}

func (e *Engine) blocksFor(tokens int) int {
	return (tokens + e.cfg.BlockSize - 1) / e.cfg.BlockSize
}

// hasWorkLocked reports whether a step would do anything.
func (e *Engine) hasWorkLocked() bool { return len(e.running) > 0 || len(e.waiting) > 0 }

// run is the scheduler goroutine: schedule a step, sleep its simulated
// duration, apply its outputs, repeat; idle when nothing is queued.
func (e *Engine) run() {
	defer e.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var deadline time.Time
	for {
		e.mu.Lock()
		if !e.hasWorkLocked() {
			e.mu.Unlock()
			select {
			case <-e.stop:
				return
			case <-e.wake:
			}
			continue
		}
		epoch := e.epoch
		dur, ok := e.scheduleLocked()
		if !ok {
			// Nothing could be scheduled (the queue head waits for blocks
			// that only a finishing request frees): idle until woken. vLLM
			// would still have run an empty step and rendered its stats.
			e.showLocked()
			e.mu.Unlock()
			select {
			case <-e.stop:
				return
			case <-e.wake:
			}
			continue
		}
		e.inStep, e.stepWall, e.stepEnd = true, time.Now(), e.simClock+dur.Seconds()
		e.mu.Unlock()

		// Sleep until the step's end. The deadline advances by the step's
		// duration so that short steps (large TimeScale) keep their average
		// rate even when a single sleep overshoots; after idling or falling
		// far behind it restarts from now.
		now := time.Now()
		if deadline.IsZero() || now.Sub(deadline) > 50*time.Millisecond {
			deadline = now
		}
		deadline = deadline.Add(e.cfg.scaled(dur))
		if wait := time.Until(deadline); wait > 0 {
			timer.Reset(wait)
			select {
			case <-e.stop:
				return
			case <-timer.C:
			}
		}

		e.mu.Lock()
		if e.epoch == epoch {
			e.completeLocked()
		}
		e.mu.Unlock()
	}
}

// scheduleLocked plans one step and returns its simulated duration, or
// false when nothing could be scheduled.
func (e *Engine) scheduleLocked() (time.Duration, bool) {
	cfg := &e.cfg
	budget := cfg.MaxNumBatchedTokens
	prefill := 0
	e.step = e.step[:0]
	e.stepSeq = e.submitted

	// Drop aborted requests first so their blocks are reusable.
	e.waiting = removeFunc(e.waiting, func(r *simRequest) bool {
		if r.aborted {
			e.finishLocked(r, "abort", nil)
			return true
		}
		return false
	})
	e.running = removeFunc(e.running, func(r *simRequest) bool {
		if r.aborted {
			e.freeLocked(r)
			e.finishLocked(r, "abort", nil)
			return true
		}
		return false
	})

	// Running requests first.
	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		n := min(len(r.tokens)-r.numComputed, budget)
		if n <= 0 {
			continue
		}
		need := e.blocksFor(r.numComputed+n) - len(r.blocks)
		preemptedSelf := false
		for need > 0 {
			var ok bool
			if r.blocks, ok = e.pool.allocate(r.blocks, need); ok {
				break
			}
			victim := e.running[len(e.running)-1]
			e.preemptLocked(victim)
			if victim == r {
				preemptedSelf = true
				break
			}
		}
		if preemptedSelf {
			break
		}
		if len(r.tokens)-r.numComputed > 1 || r.numComputed < r.promptLen {
			prefill += n
		}
		r.stepTokens = n
		budget -= n
		e.storeBlocksLocked(r, r.numComputed+n)
		e.step = append(e.step, r)
	}

	prefill = e.admitLocked(prefill, budget)
	if len(e.step) == 0 {
		return 0, false
	}
	dur := cfg.DecodeStepTime + time.Duration(float64(prefill)/cfg.PrefillTokensPerSec*float64(time.Second))
	// The worker loads the batch's missing adapters before the forward
	// pass, one after the other.
	if loads := e.slots.load(); loads > 0 {
		e.ctr.loraLoads += uint64(loads)
		dur += time.Duration(loads) * cfg.LoRALoadTime
	}
	return dur, true
}

// admitLocked admits waiting requests into the step being planned, in
// order, and returns the step's prefill tokens. The queue's head waits for
// KV blocks and holds back those behind it, as in vLLM; a request whose
// adapter would exceed MaxLoRAs is skipped instead, keeping its place for
// the next step, as vLLM's scheduler does.
func (e *Engine) admitLocked(prefill, budget int) int {
	cfg := &e.cfg
	bs := cfg.BlockSize
	e.slots.begin(e.step)
	queue, skipped := e.waiting, 0
	for len(e.waiting) > 0 && len(e.running) < cfg.MaxNumSeqs && budget > 0 {
		r := e.waiting[0]
		if !e.slots.admits(r.loraID) {
			// Skipped requests are compacted at the front of the queue's
			// array, in order, and put back at its head below.
			queue[skipped] = r
			skipped++
			e.waiting = e.waiting[1:]
			continue
		}
		maxHit := min(len(r.hashes), (len(r.tokens)-1)/bs)
		e.hitBuf = e.pool.lookup(e.hitBuf[:0], r.hashes[:maxHit])
		hits := e.hitBuf
		need := e.blocksFor(len(r.tokens)) - len(hits)
		if need > e.pool.numFree-e.pool.freeAmong(hits) {
			break // head of line waits for blocks
		}
		e.pool.touch(hits)
		r.blocks = append(r.blocks[:0], hits...)
		r.blocks, _ = e.pool.allocate(r.blocks, need)
		r.numComputed = len(hits) * bs
		r.numStored = len(hits)
		if !r.admitted {
			r.admitted = true
			r.scheduled = e.simClock // the step being planned starts now
			if !r.pooling {
				e.ctr.queries += uint64(r.promptLen)
			}
			e.ctr.hits += uint64(r.numComputed)
			r.mu.Lock()
			r.cached = r.numComputed
			r.mu.Unlock()
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		e.slots.add(r.loraID)

		n := min(len(r.tokens)-r.numComputed, budget)
		prefill += n
		r.stepTokens = n
		budget -= n
		e.storeBlocksLocked(r, r.numComputed+n)
		e.step = append(e.step, r)
	}
	// queue[:skipped] are the skipped requests and queue[skipped:popped]
	// the admitted ones' stale slots; e.waiting is queue[popped:].
	popped := len(queue) - len(e.waiting)
	copy(queue[popped-skipped:popped], queue[:skipped])
	clear(queue[:popped-skipped])
	e.waiting = queue[popped-skipped:]
	return prefill
}

// blockExtra is the extra keys of the request's block i.
func (r *simRequest) blockExtra(i int) []any {
	switch {
	case len(r.mm.MM) > 0:
		return r.mm.BlockExtraKeys(i)
	case i == 0:
		return r.extra0
	}
	return r.extraRest
}

// storeBlocksLocked caches the request's blocks that are full once upto
// tokens are computed and records one BlockStored event for them.
func (e *Engine) storeBlocksLocked(r *simRequest, upto int) {
	bs := e.cfg.BlockSize
	full := upto / bs
	if full <= r.numStored || r.pooling {
		return
	}
	for len(r.hashes) < full {
		i := len(r.hashes)
		parent := e.hasher.Root()
		if i > 0 {
			parent = r.hashes[i-1]
		}
		d, err := e.hasher.Block(parent, r.tokens[i*bs:(i+1)*bs], r.blockExtra(i))
		if err != nil {
			// Extra keys are strings, ints and tuples of them: hashing cannot fail.
			panic("vllmsim: block hash: " + err.Error())
		}
		r.hashes = append(r.hashes, d)
	}
	ev := kvEvent{
		kind:      evStored,
		hashes:    r.hashes[r.numStored:full],
		tokens:    r.tokens[r.numStored*bs : full*bs],
		blockSize: bs,
		extraRest: r.extraRest,
		loraName:  r.lora,
		loraID:    r.loraID,
	}
	if len(r.mm.MM) > 0 {
		ev.extras = make([][]any, 0, full-r.numStored)
		for b := r.numStored; b < full; b++ {
			ev.extras = append(ev.extras, r.blockExtra(b))
		}
	}
	if r.numStored > 0 {
		ev.hasParent, ev.parent = true, r.hashes[r.numStored-1]
		ev.extraFirst = r.extraRest
	} else {
		ev.extraFirst = r.extra0
	}
	for b := r.numStored; b < full; b++ {
		e.pool.cache(r.blocks[b], r.hashes[b])
	}
	r.numStored = full
	if e.pub != nil {
		e.events = append(e.events, ev)
	}
}

// preemptLocked frees a running request's blocks and puts it back at the
// head of the waiting queue (vLLM's recompute preemption).
func (e *Engine) preemptLocked(r *simRequest) {
	e.freeLocked(r)
	r.numComputed, r.numStored = 0, 0
	e.running = removeFunc(e.running, func(x *simRequest) bool { return x == r })
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = r
	e.ctr.preemptions++
}

func (e *Engine) freeLocked(r *simRequest) {
	e.pool.free(r.blocks)
	r.blocks = r.blocks[:0]
}

// completeLocked applies the outputs of the step just simulated and
// publishes its events.
func (e *Engine) completeLocked() {
	now := time.Now()
	e.simClock, e.inStep = e.stepEnd, false
	e.ctr.steps++
	finished := false
	for _, r := range e.step {
		if r.finished || r.aborted {
			continue
		}
		r.numComputed += r.stepTokens
		r.stepTokens = 0
		if r.numComputed < len(r.tokens) {
			continue // chunked prefill continues next step
		}
		if r.pooling {
			e.finishPoolingLocked(r)
			finished = true
			continue
		}
		r.mu.Lock()
		k := r.out
		tok, _ := outputToken(r.seed, k)
		r.tokens = append(r.tokens, tok)
		r.out++
		if k > 0 {
			e.ctr.itl.observe(e.metricSeconds(e.simClock - r.lastTok))
		}
		r.lastTok = e.simClock
		if k == 0 {
			r.firstTok = now
			// vLLM counts a request's prompt tokens in the step that
			// produces its first token, cached ones included.
			e.ctr.promptTokens += uint64(r.promptLen)
			e.ctr.ttft.observe(e.metricSeconds(e.simClock - r.arrival))
			r.prefill = e.simClock - r.scheduled
		}
		e.ctr.genTokens++
		done := r.out >= r.maxTokens
		r.mu.Unlock()
		if done {
			e.freeLocked(r)
			e.finishLocked(r, "length", nil)
			e.ctr.requestsServed++
			finished = true
		} else if r.stream {
			r.signal()
		}
	}
	if finished {
		e.running = removeFunc(e.running, func(r *simRequest) bool { return r.finished })
	}
	e.step = e.step[:0]
	e.showLocked()
	e.flushEventsLocked(now)
}

// finishPoolingLocked ends a pooling request once its prefill is done: it
// frees its blocks (never cached: see pooling.go) and counts its prompt
// tokens, without generating a token or observing time to first token.
func (e *Engine) finishPoolingLocked(r *simRequest) {
	e.ctr.promptTokens += uint64(r.promptLen)
	e.ctr.requestsServed++
	e.ctr.poolingServed++
	e.freeLocked(r)
	e.finishLocked(r, "stop", nil)
}

// showLocked renders the gauges as vLLM's stats after a step: the running
// requests, and the waiting ones taken in before the step was planned.
func (e *Engine) showLocked() {
	waiting := 0
	for _, r := range e.waiting {
		if r.seq <= e.stepSeq {
			waiting++
		}
	}
	e.shownRunning, e.shownWaiting = len(e.running), waiting
}

// finishLocked marks a request finished and wakes its handler.
func (e *Engine) finishLocked(r *simRequest, reason string, err error) {
	r.finished = true
	r.mu.Lock()
	if r.out > 0 {
		// vLLM observes the prefill phase when the request finishes, for
		// requests that got as far as a first token.
		e.ctr.prefillTime.observe(e.metricSeconds(r.prefill))
	}
	r.done = true
	r.finish = reason
	r.err = err
	r.mu.Unlock()
	r.signal()
}

// flushEventsLocked publishes the pending events as one batch.
func (e *Engine) flushEventsLocked(now time.Time) {
	if len(e.events) == 0 {
		return
	}
	if e.pub != nil {
		ts := float64(now.UnixNano()) / 1e9
		payload := e.enc.encodeBatch(ts, e.events, e.cfg.DPRank)
		e.pub.publish(payload)
		e.ctr.batches++
		e.ctr.events += uint64(len(e.events))
	}
	clear(e.events)
	e.events = e.events[:0]
}

// onEvict records BlockRemoved for an evicted cached block.
func (e *Engine) onEvict(h kvindex.Digest) {
	if e.pub == nil {
		return
	}
	e.events = append(e.events, kvEvent{kind: evRemoved, hashes: []kvindex.Digest{h}})
}

func removeFunc(s []*simRequest, del func(*simRequest) bool) []*simRequest {
	out := s[:0]
	for _, r := range s {
		if !del(r) {
			out = append(out, r)
		}
	}
	clear(s[len(out):])
	return out
}
