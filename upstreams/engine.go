package upstreams

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Unlimited is the free capacity [Engine.Free] reports when no request-count
// limit applies (MaxInflight == 0).
const Unlimited = math.MaxInt32

// Engine is one upstream engine: its config, last scraped gauges and the
// gateway's own accounting. All methods are safe for concurrent use.
type Engine struct {
	reg   *Registry // options and OnUpdate; never nil
	dial  string
	added time.Time // when the registry created it

	lastUsed atomic.Int64 // unix nanos of the last Ensure/Reserve/Done (0 = never)

	mu  sync.Mutex
	cfg EngineConfig
	// Scrape state.
	g         gauges
	scraped   bool // at least one successful scrape (ever, across config changes)
	scrapedAt time.Time
	failures  int
	stale     bool
	lastErr   string
	degraded  bool
	checked   bool // the startup self-check (first scrape of this config) ran
	sleeping  bool // the sleep state last announced through OnSleep
	// Local accounting. Reservations are stamped with the scrape epoch at
	// which they were sent; a successful scrape of epoch E makes every
	// reservation with an epoch < E visible in the gauges. The poller ends
	// the previous epoch and starts E at least markLead before the scrape.
	inflight  int64
	epoch     uint64 // incremented when a scrape's epoch starts
	dropBelow uint64 // reservations with epoch < dropBelow are no longer "dispatched"
	dispCur   int64  // active sent reservations with epoch == epoch
	dispOld   int64  // active sent reservations with dropBelow <= epoch < epoch
	// unsent counts active reservations not yet Sent: the request is
	// still on its way (routing, the proxy's dial and write), so no
	// scrape can show it, whenever it started.
	unsent int64
	// finished counts reservations sent before the epoch of the last
	// successful scrape (epoch < dropBelow: its gauges show them) that
	// ended after that scrape was recorded; reset by the next successful
	// scrape. See [Reservation.Done] for what counts.
	finished int64
	drain    drainEstimator
	// occupied holds, per reservation of a long prompt, when its prefill
	// is expected to end (see [Reservation.Occupy]); nil when none.
	occupied map[*Reservation]time.Time
	// prefill derives PrefillRate from the scraped counters; rateAt is
	// the scrape that last set or moved it (SpeedAge).
	prefill prefillEstimator
	rateAt  time.Time
	// prompts derives MeanUncached from the scraped counters.
	prompts promptMean
	// ownPrefill sums the uncached prompt tokens of this gateway's
	// requests here that have not produced a first token (ownPending of
	// them); ownDecoding counts those past it. See [Reservation.Work].
	ownPrefill  float64
	ownPending  int64
	ownDecoding int64
	// ownDue is the latest predicted first token of the pending ones
	// ([Reservation.Predict]); zero when none was predicted.
	ownDue time.Time
	// dueShift is how far first tokens have moved the pending prefills'
	// due times since Predict recorded them (see reanchorDueLocked).
	dueShift time.Duration
	// prefillDue holds, per reservation whose first token the gateway
	// will not see, when its prefill counts as done (PrefillDue).
	prefillDue map[*Reservation]time.Time
	// steps derives StepTime, and from it the scrape lead, from the
	// scraped inter-token latency.
	steps stepEstimator
	// models is what the engine's /v1/models said.
	models modelsState
	// sentLoRA holds, by LoRA adapter, the scrape epoch in which this
	// gateway last sent the engine a request for it (see SentAdapter);
	// nil until one is sent.
	sentLoRA map[string]uint64

	// run is the poller/worker handle; guarded by reg.mu.
	run *runHandle
	// kick wakes the poller early (interval change); buffered(1).
	kick chan struct{}
}

// newEngine creates an engine; a dynamic one counts as used now (it is being
// Ensure'd), a static one only once traffic touches it.
func newEngine(r *Registry, cfg EngineConfig) *Engine {
	e := &Engine{reg: r, dial: cfg.Dial, cfg: cfg, kick: make(chan struct{}, 1), added: r.now()}
	if !cfg.Static {
		e.touch()
	}
	return e
}

func (e *Engine) touch() { e.lastUsed.Store(e.reg.now().UnixNano()) }

// Dial returns the engine's dial address (the registry key).
func (e *Engine) Dial() string { return e.dial }

// Config returns a copy of the engine's current config (defaults filled).
func (e *Engine) Config() EngineConfig {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cfg.clone()
}

// Load is a snapshot of an engine's state.
type Load struct {
	// Running and Waiting are vllm:num_requests_{running,waiting} summed over
	// all series (the `engine` label = DP ranks served behind one address).
	Running, Waiting float64
	// KVUsage is vllm:kv_cache_usage_perc (or legacy
	// vllm:gpu_cache_usage_perc) in 0..1: the mean over `engine` labels,
	// weighted by each rank's num_gpu_blocks when known — the fraction of
	// all KV blocks behind this address in use.
	KVUsage float64
	// KVUsageMax is the fullest rank's KV usage (equals KVUsage with one rank).
	KVUsageMax float64
	// BlockSize and NumGPUBlocks come from vllm:cache_config_info labels
	// (blocks summed over engine labels); 0 when not exposed.
	BlockSize, NumGPUBlocks int
	// Known: at least one successful scrape and not stale. The gauge fields
	// keep the last good values while Failures < StaleAfter.
	Known bool
	// Stale: StaleAfter or more consecutive polls failed.
	Stale bool
	// ScrapedAt is the time of the last successful scrape; Age is how long
	// ago that was (0 if never).
	ScrapedAt time.Time
	Age       time.Duration
	// Inflight counts requests through THIS gateway currently in flight on
	// this engine (reserved and not Done).
	Inflight int64
	// Dispatched counts requests this gateway reserved on this engine that
	// the gauges cannot show yet, and not yet Done: those not yet sent,
	// and those sent since the epoch of the last successful scrape began,
	// at least markLead before it started. A request that finished before
	// any scrape saw it leaves the count, since it will never appear in
	// running.
	Dispatched int64
	// Finished counts requests this gateway sent to this engine that the
	// last successful scrape counted (sent before its epoch began) and
	// that have ended since it was recorded: their slots are free although
	// Running and Waiting still show them. [Load.Estimated] applies it; a newer
	// successful scrape resets it.
	Finished int64
	// Occupied is how much longer the engine is expected to be busy
	// prefilling a long prompt this gateway sent it ([Reservation.Occupy]):
	// the longest such prefill still running, 0 when none.
	Occupied time.Duration
	// MaxInflight is the configured limit (0 = none).
	MaxInflight int
	// DrainRate is the observed completion rate in requests/s: an
	// exponentially-decaying average (time constant 10s) over completions
	// through this gateway ([Reservation.Done]), over the time it has
	// watched them when that is shorter (see drainEstimator); 0 before the
	// first, or the first after a long idle spell. Other clients' traffic
	// is not included.
	DrainRate float64
	// SinceDone is how long ago the last of those completions was (0 when
	// none was seen): an engine silent for long drains slower than its
	// DrainRate, which decays only over tens of seconds, says.
	SinceDone time.Duration
	// PrefillRate is the engine's effective prefill speed in uncached
	// prompt tokens per second of prefill (batching contention included),
	// derived from the deltas of vllm:prompt_tokens_total,
	// vllm:prefix_cache_hits_total and vllm:request_prefill_time_seconds
	// between successful scrapes: pooled over the first ~10 s of prefill
	// time, then smoothed over ~10 s of it. With the request counts of
	// vllm:time_to_first_token_seconds (tokens) and of the prefill-time
	// histogram (seconds, observed a decode later) each window is a ratio
	// of per-request means; until a first request ends, the time to first
	// token stands in for the prefill time.
	// It keeps its last value while no new prefill is seen (also when the
	// engine goes stale); 0 = unknown (the engine exposes no such counters,
	// or has not prefilled since it was first scraped).
	PrefillRate float64
	// SpeedAge is how long before the latest successful scrape
	// PrefillRate last took in new prefill: 0 while every scrape brings
	// some (a busy engine), growing while the engine is idle, asleep or
	// sent nothing; 0 too while the rate is unknown. StepTime comes from
	// the same traffic, so it says how stale both are: routing trusts an
	// idle engine's speeds less the older they are (see package routing).
	SpeedAge time.Duration
	// OwnPrefill is the uncached prompt tokens this gateway's requests
	// here still have to prefill (recorded by [Reservation.Work], done at
	// their first token); OwnPending counts those requests and
	// OwnDecoding this gateway's requests here past their first token.
	OwnPrefill              float64
	OwnPending, OwnDecoding int64
	// OwnDue is how long until the last of the OwnPending requests is
	// predicted to reach its first token (the latest dispatch time plus
	// predicted TTFT that [Reservation.Predict] recorded for them); 0
	// when none is pending, none was predicted, or they are overdue: the
	// engine is slower than predicted (or busy with other gateways'
	// requests), and how long it still needs is unknown.
	OwnDue time.Duration
	// MeanUncached is the engine's mean uncached prompt per request, in
	// tokens, from the deltas of vllm:prompt_tokens_total,
	// vllm:prefix_cache_hits_total and the count of
	// vllm:time_to_first_token_seconds (counted with the tokens; without
	// it, of vllm:request_prefill_time_seconds) between successful scrapes,
	// smoothed over ~32 requests; 0 = unknown. It prices the requests
	// waiting there that this gateway did not send.
	MeanUncached float64
	// StepTime is the engine's mean scheduler step, smoothed over ~64
	// output tokens: the gaps between tokens of the streams this gateway
	// relayed from it ([Reservation.Streamed]), or, when it relayed none
	// for 30 s, the deltas of the engine's vllm:inter_token_latency_seconds
	// _sum and _count between successful scrapes; 0 = unknown.
	// ScrapeLead is how long before each scrape its epoch begins (two
	// steps plus the API server's parsing, else 100 ms while the step is
	// unknown; a quarter of poll_interval at most): requests sent within
	// it count as dispatched until the scrape after. See markLead.
	StepTime, ScrapeLead time.Duration
	// Failures counts consecutive failed polls; LastError is the latest poll
	// error ("" after a success).
	Failures  int
	LastError string
	// Degraded: the startup self-check failed — the metrics were unreadable
	// or lacked running/waiting/KV-usage. Cleared by a complete scrape.
	Degraded bool
	// Asleep: the gauges are known and vllm:engine_sleep_state shows no
	// rank awake ([Engine.Asleep]); SleepLevel is then vLLM's sleep level
	// (1: weights offloaded, 2: discarded), else 0. An engine without the
	// gauge (vLLM before sleep mode) is awake.
	Asleep     bool
	SleepLevel int
}

// Load returns a snapshot of the engine's gauges and accounting.
func (e *Engine) Load() Load {
	now := e.reg.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.settleDueLocked(now)
	l := Load{
		Running:      e.g.Running,
		Waiting:      e.g.Waiting,
		KVUsage:      e.g.KVUsage,
		KVUsageMax:   e.g.KVUsageMax,
		BlockSize:    e.g.BlockSize,
		NumGPUBlocks: e.g.NumGPUBlocks,
		Known:        e.scraped && !e.stale,
		Stale:        e.stale,
		ScrapedAt:    e.scrapedAt,
		Inflight:     e.inflight,
		Dispatched:   e.dispatched(),
		Finished:     e.finished,
		MaxInflight:  e.cfg.MaxInflight,
		DrainRate:    e.drain.rate(now),
		PrefillRate:  e.prefill.rate(),
		OwnPrefill:   e.ownPrefill,
		OwnPending:   e.ownPending,
		OwnDecoding:  e.ownDecoding,
		MeanUncached: e.prompts.estimate(),
		Failures:     e.failures,
		LastError:    e.lastErr,
		Degraded:     e.degraded,
		Asleep:       e.asleepLocked(),
	}
	if l.Asleep {
		l.SleepLevel = e.g.SleepLevel
	}
	if !e.scrapedAt.IsZero() {
		l.Age = now.Sub(e.scrapedAt)
	}
	l.SinceDone = e.drain.sinceDone(now)
	if e.ownPending > 0 && e.ownDue.After(now) {
		l.OwnDue = e.ownDue.Sub(now)
	}
	if !e.rateAt.IsZero() {
		l.SpeedAge = e.scrapedAt.Sub(e.rateAt)
	}
	l.Occupied = e.occupiedLocked(now)
	if step, ok := e.steps.estimate(); ok {
		l.StepTime = step
	}
	l.ScrapeLead = e.leadLocked()
	return l
}

// Estimated returns the engine's running and waiting requests now, as far
// as this gateway knows: the scraped gauges less the Finished requests. The
// scheduler fills a freed slot from its waiting queue, so a finish shortens
// the queue first and the running batch only once nothing waits. Both are
// floored at 0. Dispatched requests are not included (they are not yet in
// the gauges either; where they go depends on the caller's model).
func (l Load) Estimated() (running, waiting float64) {
	return settle(l.Running, l.Waiting, l.Finished)
}

// settle takes finished requests off waiting first, then off running.
func settle(running, waiting float64, finished int64) (float64, float64) {
	if !(running > 0) { // also NaN
		running = 0
	}
	if !(waiting > 0) {
		waiting = 0
	}
	f := float64(max(finished, 0))
	fromWaiting := min(f, waiting)
	return max(running-(f-fromWaiting), 0), waiting - fromWaiting
}

// Free reports the engine's admission headroom, for the admission gate.
//
// When the gauges are known: free = MaxInflight − (Running + Waiting −
// Finished, floored at 0, + Dispatched), floored at 0, or [Unlimited] when
// MaxInflight == 0 (no request limit configured); and free = 0 when
// kvLimit > 0 and KVUsage >= kvLimit, or the engine is asleep. known is true.
//
// When the gauges are not known (never scraped, or stale), known is false and
// free is a local-accounting-only hint: MaxInflight − Inflight (floored at 0),
// or [Unlimited]. The gate decides whether to fail open.
func (e *Engine) Free(kvLimit float64) (free int, known bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	maxIn := e.cfg.MaxInflight
	if !e.scraped || e.stale {
		if maxIn <= 0 {
			return Unlimited, false
		}
		return clampFree(float64(maxIn) - float64(e.inflight)), false
	}
	if e.asleepLocked() || (kvLimit > 0 && e.g.KVUsage >= kvLimit) {
		return 0, true
	}
	if maxIn <= 0 {
		return Unlimited, true
	}
	running, waiting := settle(e.g.Running, e.g.Waiting, e.finished)
	used := running + waiting + float64(e.dispatched())
	return clampFree(float64(maxIn) - used), true
}

func clampFree(f float64) int {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= Unlimited:
		return Unlimited
	}
	return int(f)
}

// Reservation is one request's claim on an engine's local accounting.
// Methods are safe for concurrent use; Done is idempotent.
type Reservation struct {
	mu    sync.Mutex
	e     *Engine
	epoch uint64 // the scrape epoch at Sent
	sent  bool   // Sent since it was made or last moved: e has the request
	done  bool
	// work is the uncached prompt recorded by Work, counted on e while
	// working: as prefill until decoding (the first token), then as a
	// decoding request.
	work              float64
	working, decoding bool
	// predicted is the routing decision's predicted time to first token
	// in seconds (0 = none), recorded at predictedAt (see Predict).
	predicted   float64
	predictedAt time.Time
	// due is when Predict expected the request's prefill to end, for one
	// predicted with a batch slot (zero otherwise), and shift the
	// engine's dueShift then: its first token re-anchors the engine's due
	// time (see reanchorDueLocked). Guarded by its engine's mutex, as the
	// work fields are.
	due   time.Time
	shift time.Duration
}

// Reserve records a request dispatched to the engine: Inflight++, and
// Dispatched++ until a successful scrape whose epoch began after its Sent, so
// admission can count it before the engine's gauges show it. Call Done
// when the request finishes.
func (e *Engine) Reserve() *Reservation {
	e.touch()
	e.acquire()
	return &Reservation{e: e}
}

// acquire counts a new reservation, not yet sent.
func (e *Engine) acquire() {
	now := e.reg.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.drain.begin(now, e.inflight == 0)
	e.inflight++
	e.unsent++
}

// dispatched is Load.Dispatched. e.mu held.
func (e *Engine) dispatched() int64 { return e.dispCur + e.dispOld + e.unsent }

// unstamp takes a reservation of the given epoch out of the dispatched
// counts. e.mu held.
func (e *Engine) unstamp(epoch uint64) {
	switch {
	case epoch < e.dropBelow: // already visible in the gauges
	case epoch == e.epoch:
		e.dispCur--
	default:
		e.dispOld--
	}
}

// release undoes acquire, and Sent's stamp when sent (the request was
// handed to this engine at epoch, so that a scrape may count it);
// completed also feeds the drain rate and, for a sent request, Finished.
func (e *Engine) release(epoch uint64, sent, completed bool) {
	now := e.reg.now()
	e.mu.Lock()
	e.inflight--
	switch {
	case !sent:
		e.unsent--
	case completed && epoch < e.dropBelow:
		// The last successful scrape's epoch began after the request was sent,
		// so its gauges count it; the engine has let it go since.
		e.finished++
		e.unstamp(epoch)
	default:
		e.unstamp(epoch)
	}
	if completed {
		e.drain.done(now)
	}
	e.mu.Unlock()
	e.touch()
	e.reg.notify(e.dial)
}

// Engine returns the engine the reservation currently counts against.
func (r *Reservation) Engine() *Engine {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.e
}

// Move transfers the reservation to another engine, for when the routing
// policy picked a different engine than the one reserved. No-op after Done,
// for nil, or for the same engine.
//
// The old engine does not count the move as a finished request: a
// reservation moved before it was sent was never there, and one moved after
// (the proxy retrying elsewhere) most likely failed to reach it; should it
// have arrived after all, its slot merely shows as busy until the next
// scrape, the safe side. On the new engine the request counts as
// dispatched and not yet sent.
func (r *Reservation) Move(to *Engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || to == nil || to == r.e {
		return
	}
	from, epoch, sent := r.e, r.epoch, r.sent
	to.touch()
	to.acquire()
	r.e, r.epoch, r.sent = to, 0, false
	if until, ok := from.unoccupy(r); ok {
		to.occupy(r, until)
	}
	from.dropWork(r)
	from.release(epoch, sent, false)
}

// Sent records that the request has just been handed to the engine. The
// request reaches the engine well after its reservation (after routing and
// the proxy's dial and write; on a loaded machine, after the parked
// request's goroutine is scheduled at all), and a scrape that starts in
// between renders the engine's gauges without it. So a reservation counts
// as dispatched, whatever scrapes succeed, until it is sent, and from then
// on until a scrape whose epoch began after this call succeeds (the poller
// begins it at least markLead before the scrape, since the engine shows a
// request only some time after receiving it) — at worst counted twice for
// one poll interval, the safe side of a soft cap.
// Were unsent reservations dropped at the next scrape, a scrape racing a
// just-admitted request would free its slot a second time. Only a sent
// request counts as Finished when it ends (see Done). A second
// call re-stamps it; no-op after Done.
func (r *Reservation) Sent() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	e := r.e
	e.mu.Lock()
	if r.sent {
		e.unstamp(r.epoch)
	} else {
		e.unsent--
	}
	r.epoch = e.epoch
	e.dispCur++
	e.mu.Unlock()
	r.sent = true
}

// Done ends the reservation: Inflight--, a completion for the drain rate,
// and OnUpdate. Idempotent.
//
// A request that was Sent before the epoch of the last successful scrape
// began (markLead or more before the scrape) is in that scrape's running
// or waiting gauge; when it ends its slot is free at once, so it counts in
// Load.Finished until the next successful scrape renders the engine
// without it. That holds however it ended:
// answered, failed by the engine, or abandoned by the client (vLLM aborts a
// request whose connection closes) — either way it has left the
// scheduler. A reservation never sent (refused after admission, or moved
// away before the proxy wrote it) was never in the gauges and does not
// count.
//
// The scrape in flight when a request ends may render the engine with or
// without it, so such a completion is counted by neither: it counts
// against the previous scrape only until this one succeeds and resets the
// count, and until the next one the slot shows as busy — the safe side.
// The converse error is bounded by one network trip: a request the engine
// finished just before a scrape rendered its gauges, whose last bytes reach
// the gateway only after the scrape's response did, is counted by both
// (absent from the gauges and Finished) until the next scrape.
func (r *Reservation) Done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	r.e.unoccupy(r)
	r.e.finishWork(r)
	r.e.release(r.epoch, r.sent, true)
}
