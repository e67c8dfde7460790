package upstreams

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/internal/ctxsleep"
	"github.com/llmgw/caddy-llmgw/internal/httpbody"
)

// maxRetainedBuf caps the per-poller buffers kept between scrapes, so one
// large page does not pin megabytes per engine.
const maxRetainedBuf = 1 << 20

// runHandle stops one engine's poller and worker.
type runHandle struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (h *runHandle) stop() {
	if h == nil {
		return
	}
	h.cancel()
	<-h.done
}

// start launches the engine's poller and the optional worker. The caller
// holds reg.mu and stores the handle in e.run.
func (e *Engine) start(worker func(context.Context, *Engine)) *runHandle {
	ctx, cancel := context.WithCancel(context.Background())
	h := &runHandle{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		workerDone := make(chan struct{})
		if worker != nil {
			go func() {
				defer close(workerDone)
				worker(ctx, e)
			}()
		} else {
			close(workerDone)
		}
		if e.reg.manual {
			<-ctx.Done()
		} else {
			e.pollLoop(ctx)
		}
		<-workerDone
	}()
	return h
}

// An engine shows a request in its gauges only some time after the
// gateway hands it over: vLLM first parses and tokenizes the prompt in its
// API server (apiLag), a request arriving during a scheduler step joins
// the queue only before the next step, and the gauges change when that
// step's stats reach the API server: up to two steps. A scrape that starts
// within that time renders the engine without the request, so the poller
// begins a scrape's epoch that long before the scrape starts (markLead). A
// request handed over later stays counted as dispatched until the next
// scrape, instead of counting as visible in gauges that miss it and then,
// when it finishes, freeing a slot someone else holds. A lead longer than
// the engine's lag costs slots: a request sent in the excess is counted
// twice, in the gauges and as dispatched, for one more interval, which is
// why the lead follows the engine's own step time (stepEstimator) rather
// than a fixed bound. Manual scrapes ([Engine.StartScrape]) begin their
// epoch as they start.
const (
	// apiLag is the API server's share: parsing and tokenizing.
	apiLag = 5 * time.Millisecond
	// gaugeLag is the lead while the step time is unknown (the engine
	// exports no inter-token latency, or has produced no two tokens of a
	// request since it was first scraped).
	gaugeLag = 100 * time.Millisecond
)

// markLead is how long before a scrape its epoch begins, at the least: two
// steps plus apiLag when the step time is known, else gaugeLag; a quarter
// of the poll interval at most, so scrapes keep their cadence.
func markLead(interval, step time.Duration, stepKnown bool) time.Duration {
	lead := gaugeLag
	if stepKnown {
		lead = 2*step + apiLag
	}
	return min(lead, interval/4)
}

// lead is the engine's markLead at the current poll interval.
func (e *Engine) lead() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leadLocked()
}

// leadLocked is lead with e.mu held.
func (e *Engine) leadLocked() time.Duration {
	step, ok := e.steps.estimate()
	return markLead(e.reg.options().PollInterval, step, ok)
}

// pollLoop scrapes (the startup self-check), then scrapes again every
// PollInterval (+ up to 10% jitter) measured from the start of each scrape.
// Each scrape's epoch begins at least markLead before it: a scrape that
// would be due sooner (one overdue after a slow scrape, or the first of a
// restarted poller) waits that long. A new engine's first scrape is taken
// at once, its gauges being unknown until then, and begins no epoch: what
// was sent before it stays dispatched through it.
//
// After a successful scrape it fetches the engine's /v1/models when due
// (see fetchModelsIfDue).
func (e *Engine) pollLoop(ctx context.Context) {
	var buf, scratch []byte
	var models modelsSchedule
	due, epoch := time.Now(), uint64(0)
	for first := true; ; first = false {
		if !first || !e.isNew() {
			epoch = e.markEpoch()
			if !ctxsleep.Sleep(ctx, max(time.Until(due), e.lead())) {
				return
			}
		}
		start := time.Now()
		e.fetchModelsIfDue(ctx, &models, e.scrapeSince(ctx, epoch, &buf, &scratch))
		if cap(buf) > maxRetainedBuf {
			buf = nil
		}
		if cap(scratch) > maxRetainedBuf {
			scratch = nil
		}
		var ok bool
		if due, ok = e.waitNext(ctx, start); !ok {
			return
		}
	}
}

// isNew reports whether no scrape of the engine has begun an epoch yet.
func (e *Engine) isNew() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.epoch == 0
}

// waitNext sleeps until markLead before the next poll is due and returns
// when it is due; false when ctx is done. A kick (interval changed by
// Apply) recomputes the deadline.
func (e *Engine) waitNext(ctx context.Context, start time.Time) (due time.Time, ok bool) {
	for {
		iv := e.reg.options().PollInterval
		due = start.Add(iv + time.Duration(rand.Int64N(int64(iv)/10+1)))
		wait := time.Until(due.Add(-e.lead()))
		if wait <= 0 {
			return due, ctx.Err() == nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return due, false
		case <-e.kick:
			t.Stop()
		case <-t.C:
			return due, true
		}
	}
}

// scrapeSince runs one scrape and records its result; its gauges count the
// reservations sent before startEpoch began.
func (e *Engine) scrapeSince(ctx context.Context, startEpoch uint64, buf, scratch *[]byte) scrapeResult {
	o := e.reg.options()
	e.mu.Lock()
	t := scrapeTarget{url: e.cfg.MetricsURL, header: e.cfg.Header, engine: e.cfg.EngineLabel}
	e.mu.Unlock()

	g, err := scrape(ctx, o, t, buf, scratch)
	if err != nil && ctx.Err() != nil {
		return scrapeResult{} // stopping, not an engine failure
	}
	res := e.record(startEpoch, g, err, o)
	e.announce(res)
	return res
}

// announce calls the registry's hooks for a recorded scrape: OnRestart,
// OnSleep on a change of sleep state, then OnUpdate.
func (e *Engine) announce(res scrapeResult) {
	if res.restarted {
		e.reg.restarted(e.dial)
	}
	if res.slept || res.woke {
		e.reg.sleepChanged(e.dial, res.slept)
	}
	e.reg.notify(e.dial)
}

// modelsSchedule is when a poller next fetches its engine's /v1/models.
type modelsSchedule struct {
	due     time.Time     // on the registry's clock; zero: at the next successful scrape
	backoff time.Duration // after failed fetches: the last retry delay
}

// fetchModelsIfDue fetches the engine's /v1/models after a successful
// scrape when the schedule says so, or at once when the scrape found the
// engine restarted or back from staleness: a new process may serve other
// models. The schedule runs on the registry's clock (Options.Now).
func (e *Engine) fetchModelsIfDue(ctx context.Context, s *modelsSchedule, res scrapeResult) {
	o := e.reg.options()
	if !res.ok || o.ModelsInterval < 0 {
		return
	}
	now := e.reg.now()
	if !s.due.IsZero() && now.Before(s.due) && !res.restarted && !res.recovered {
		return
	}
	e.mu.Lock()
	url, header := e.cfg.ModelsURL, e.cfg.Header
	e.mu.Unlock()
	list, err := fetchModels(ctx, o, url, header)
	if err != nil && ctx.Err() != nil {
		return // stopping
	}
	e.recordModels(list, err, o)
	s.due = now.Add(s.next(err, o))
}

// next is the delay until the fetch after one that ended with err: the
// interval after a success, ten intervals when the engine does not serve
// /v1/models, and after a failure PollInterval doubling per failure up to
// the interval.
func (s *modelsSchedule) next(err error, o *Options) time.Duration {
	switch {
	case err == nil:
		s.backoff = 0
		return o.ModelsInterval
	case errors.Is(err, ErrModelsUnavailable):
		s.backoff = 0
		return modelsUnavailableFactor * o.ModelsInterval
	}
	s.backoff = min(max(2*s.backoff, o.PollInterval), o.ModelsInterval)
	return s.backoff
}

// markEpoch begins the next scrape's epoch: reservations sent from now on
// may be too recent for it to see.
func (e *Engine) markEpoch() uint64 {
	e.mu.Lock()
	epoch := e.newEpochLocked()
	e.mu.Unlock()
	if hook := e.reg.onMark; hook != nil {
		hook(e.dial)
	}
	return epoch
}

// newEpochLocked starts a scrape's epoch: reservations made from now on
// may be too recent for this scrape to see. e.mu held.
func (e *Engine) newEpochLocked() uint64 {
	e.epoch++
	e.dispOld += e.dispCur
	e.dispCur = 0
	return e.epoch
}

// Gauges are what one scrape read off an engine, for callers that scrape
// engines themselves ([Options.ManualScrape]).
type Gauges struct {
	Running, Waiting float64
	KVUsage          float64 // 0..1
	BlockSize        int     // 0 = unknown
	NumGPUBlocks     int     // 0 = unknown
	// PromptTokens, CachedTokens and PrefillSeconds are the engine's
	// cumulative vllm:prompt_tokens_total, vllm:prefix_cache_hits_total and
	// vllm:request_prefill_time_seconds_sum (summed over its series), from
	// whose deltas between scrapes [Load.PrefillRate] is derived. Leave them
	// 0 when unknown: counters that do not move yield no rate. A NaN,
	// infinite or negative value makes the scrape count as without them.
	PromptTokens, CachedTokens, PrefillSeconds float64
	// PrefillCount is vllm:request_prefill_time_seconds_count, from whose
	// deltas with the token counters' [Load.MeanUncached] is derived; 0
	// when unknown.
	PrefillCount float64
	// FirstTokens is vllm:time_to_first_token_seconds_count, which with
	// PrefillCount pairs each window's tokens with its prefill times
	// (see [Load.PrefillRate]); 0 when unknown.
	FirstTokens float64
	// TTFTSeconds is vllm:time_to_first_token_seconds_sum, the engine's
	// rate until its first request ends; 0 when unknown.
	TTFTSeconds float64
	// LoRA is the engine's LoRA state ([Engine.LoRA]); leave it zero when
	// unknown. Its lists are kept, not copied.
	LoRA LoRAState
	// SleepLevel is the engine's vLLM sleep level ([SleepWeightsOffload],
	// [SleepDiscardAll]); 0 when awake.
	SleepLevel int
}

// StartScrape begins a scrape made by the caller instead of a poller: the
// returned function records its result exactly as a successful poll would
// (reservations sent before StartScrape become visible in the gauges,
// finished counts reset, OnUpdate called). Call it once.
func (e *Engine) StartScrape() (record func(Gauges)) {
	e.mu.Lock()
	startEpoch := e.newEpochLocked()
	e.mu.Unlock()
	return func(g Gauges) {
		res := e.record(startEpoch, gauges{Running: g.Running, Waiting: g.Waiting, KVUsage: g.KVUsage, KVUsageMax: g.KVUsage,
			BlockSize: g.BlockSize, NumGPUBlocks: g.NumGPUBlocks, Ranks: 1,
			PromptTokens: g.PromptTokens, CachedTokens: g.CachedTokens, PrefillSeconds: g.PrefillSeconds,
			HasPrefill:   usableCounter(g.PromptTokens) && usableCounter(g.CachedTokens) && usableCounter(g.PrefillSeconds),
			PrefillCount: g.PrefillCount, HasPrefillCount: usableCounter(g.PrefillCount) && g.PrefillCount > 0,
			FirstTokens: g.FirstTokens, TTFTSeconds: g.TTFTSeconds,
			HasFirstTokens: usableCounter(g.FirstTokens) && g.FirstTokens > 0 && usableCounter(g.TTFTSeconds),
			LoRA:           g.LoRA, SleepLevel: g.SleepLevel}, nil, e.reg.options())
		e.announce(res)
	}
}

// promptCount is the request count the prompt-token counters pair with:
// the first tokens, counted with them, when the engine exposes them, else
// the ended prefills, which lag them by a decode.
func promptCount(g gauges) float64 {
	if g.HasFirstTokens {
		return g.FirstTokens
	}
	return g.PrefillCount
}

// usableCounter: a cumulative counter value the prefill rate can use.
func usableCounter(v float64) bool { return v >= 0 && !math.IsInf(v, 0) } // NaN fails v >= 0

// scrapeResult is what record made of a scrape.
type scrapeResult struct {
	ok bool // the scrape succeeded
	// restarted: the engine restarted since the previous successful
	// scrape (its cumulative counters went down).
	restarted bool
	// recovered: the engine was stale before this scrape.
	recovered bool
	// slept and woke: the engine went to sleep, or woke, since the
	// previous successful scrape that changed its sleep state.
	slept, woke bool
}

// record applies a scrape result: gauges, failure counting, staleness and
// the self-check.
func (e *Engine) record(startEpoch uint64, g gauges, err error, o *Options) (res scrapeResult) {
	log := o.Logger.With(zap.String("engine", e.dial))
	e.mu.Lock()
	defer e.mu.Unlock()
	firstCheck := !e.checked
	e.checked = true
	if err == nil {
		e.g = g
		res.ok = true
		now := e.reg.now()
		res.restarted = e.observeSpeeds(&g, now)
		e.scraped = true
		e.scrapedAt = now
		wasStale, wasDegraded := e.stale, e.degraded
		res.recovered = wasStale
		e.failures, e.stale, e.degraded, e.lastErr = 0, false, false, ""
		res.slept, res.woke = e.sleepTransition(g.SleepLevel > 0)
		if startEpoch > e.dropBelow {
			e.dropBelow = startEpoch
			e.dispOld = 0
			// These gauges are rendered without the requests that ended
			// before this scrape started, and maybe without those that
			// ended while it ran; either way they no longer need taking
			// off (see Reservation.Done).
			e.finished = 0
		}
		if wasStale {
			log.Info("engine metrics recovered")
		}
		if wasDegraded {
			log.Info("engine metrics self-check now passes")
		}
		return res
	}
	e.failures++
	e.lastErr = err.Error()
	if firstCheck {
		e.degraded = true
		log.Error("engine metrics self-check failed: admission and routing treat this engine's load as unknown until a scrape succeeds",
			zap.String("metrics_url", redactURL(e.cfg.MetricsURL)), zap.Error(err))
	}
	if !e.stale && e.failures >= o.StaleAfter {
		e.stale = true
		e.reg.staleTransitions.Add(1)
		log.Warn("engine metrics stale", zap.Int("failures", e.failures), zap.Error(err))
	} else {
		log.Debug("engine metrics poll failed", zap.Int("failures", e.failures), zap.Error(err))
	}
	return res
}

// observeSpeeds feeds a successful scrape's counters to the engine's
// prefill, prompt and step estimators, and notes when the prefill rate
// last took in new prefill (Load.SpeedAge). It reports whether the
// counters went down: the engine restarted. Callers hold e.mu.
func (e *Engine) observeSpeeds(g *gauges, now time.Time) (restarted bool) {
	if g.HasPrefill {
		before := e.prefill.updates
		restarted = e.prefill.observe(prefillSample{prompt: g.PromptTokens, cached: g.CachedTokens, secs: g.PrefillSeconds,
			firsts: g.FirstTokens, finished: g.PrefillCount, ttft: g.TTFTSeconds, paired: g.HasPrefillCount && g.HasFirstTokens})
		if g.HasPrefillCount {
			e.prompts.observe(promptSample{prompt: g.PromptTokens, cached: g.CachedTokens, count: promptCount(*g)})
		}
		if e.prefill.updates != before {
			e.rateAt = now
		}
	}
	if g.HasStep {
		e.steps.observe(stepSample{secs: g.ITLSeconds, count: g.ITLCount}, now)
	}
	return restarted
}

// sleepTransition records the sleep state a successful scrape found
// (asleep) and reports whether the engine went to sleep or woke since the
// last change announced. Staleness in between changes nothing: an engine
// that went to sleep, went stale and comes back asleep had its mirror
// dropped already. e.mu held.
func (e *Engine) sleepTransition(asleep bool) (slept, woke bool) {
	was := e.sleeping
	e.sleeping = asleep
	return asleep && !was, !asleep && was
}

// scrapeTarget is what one scrape reads: the page at url, fetched with
// header, and of it the series of engine (the `engine` label; "" for all).
type scrapeTarget struct {
	url    string
	header http.Header
	engine string
}

// scrape fetches and parses one /metrics page within o.PollTimeout and
// o.MaxMetricsBytes.
func scrape(ctx context.Context, o *Options, t scrapeTarget, buf, scratch *[]byte) (gauges, error) {
	url, header := t.url, t.header
	ctx, cancel := context.WithTimeout(ctx, o.PollTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return gauges{}, fmt.Errorf("metrics request: %w", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	}
	resp, err := o.Client.Do(req)
	if err != nil {
		return gauges{}, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return gauges{}, fmt.Errorf("scrape metrics: HTTP %d: %s", resp.StatusCode, httpbody.Snippet(resp.Body))
	}
	*buf, err = httpbody.ReadLimited(resp.Body, o.MaxMetricsBytes, *buf)
	if err != nil {
		return gauges{}, fmt.Errorf("scrape metrics: %w", err)
	}
	return parseRankGauges(*buf, scratch, t.engine)
}
