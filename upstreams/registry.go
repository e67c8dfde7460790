package upstreams

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Registry holds the fleet's engines keyed by dial address. It is built to
// outlive config reloads: [Registry.Apply] reconfigures it in place and keeps
// running engines (their gauges, accounting and goroutines) untouched.
// All methods are safe for concurrent use.
type Registry struct {
	opts             atomic.Pointer[Options] // resolved (defaults filled)
	worker           func(context.Context, *Engine)
	manual           bool // Options.ManualScrape
	now              func() time.Time
	ownClient        *http.Client // the default client, closed by Close; nil if the caller supplied one
	staleTransitions atomic.Uint64
	// onMark, set only by this package's tests before the first Apply, is
	// called after a poller begins a scrape's epoch and before the scrape.
	onMark func(dial string)

	// lifeMu serialises lifecycle changes (Apply, GC, Close), which wait for
	// goroutines to stop and so cannot hold mu.
	lifeMu sync.Mutex

	mu       sync.RWMutex
	engines  map[string]*Engine
	running  bool // first Apply happened and not closed
	closed   bool
	gcCancel context.CancelFunc
	gcDone   chan struct{}
	gcWake   chan struct{} // an IdleTTL change re-arms the GC timer at once
}

// NewRegistry returns an empty registry. No goroutines run until the first
// [Registry.Apply].
func NewRegistry(opts Options) *Registry {
	r := &Registry{engines: make(map[string]*Engine), worker: opts.Worker, manual: opts.ManualScrape, now: opts.Now, gcWake: make(chan struct{}, 1)}
	if r.now == nil {
		r.now = time.Now
	}
	r.setOptions(opts)
	return r
}

// newDefaultClient builds the scrape client: no overall timeout (each scrape
// has a context deadline) but bounded dials and headers, few idle conns.
func newDefaultClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 nil, // engines are internal; never via an env proxy
		DialContext:           (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 10 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
	}}
}

func (r *Registry) setOptions(o Options) (intervalChanged bool) {
	o = o.withDefaults()
	o.Worker = r.worker
	if o.Client == nil {
		if r.ownClient == nil {
			r.ownClient = newDefaultClient()
		}
		o.Client = r.ownClient
	}
	old := r.opts.Swap(&o)
	if old != nil && old.IdleTTL != o.IdleTTL {
		select {
		case r.gcWake <- struct{}{}:
		default:
		}
	}
	return old != nil && old.PollInterval != o.PollInterval
}

func (r *Registry) options() *Options { return r.opts.Load() }

func (r *Registry) notify(dial string) {
	if f := r.options().OnUpdate; f != nil {
		f(dial)
	}
}

func (r *Registry) restarted(dial string) {
	if f := r.options().OnRestart; f != nil {
		f(dial)
	}
}

// Apply reconfigures the registry; it is idempotent and meant to be called at
// every config start. cfgs are the configured (static) engines: each is
// marked Static and gets its defaults filled; invalid ones are logged and
// skipped, duplicates after the first are ignored.
//
//   - New dial: the engine is created and started.
//   - Known dial: kept running with its state. If its config changed in a way
//     that affects polling or the worker (URLs, Header, Pool, Attrs), its
//     poller and worker are stopped and restarted with the new config (state
//     and accounting survive; the old gauges stay until the new poller's
//     first scrape, which also re-runs the self-check); MaxInflight is
//     updated in place.
//   - Static engine no longer configured: if it has requests in flight or
//     was used (Ensure, Reserve or Done) within IdleTTL, it is demoted to
//     dynamic — keeping its config, state and goroutines, since the new
//     config may still route to it — and later garbage-collected like any
//     dynamic engine; otherwise it is stopped and removed now.
//
// Options (except Worker) replace the previous ones. The first Apply starts
// pollers for engines Ensure'd before it, and the idle-engine GC loop. Apply
// after Close does nothing. Apply waits for stopped engines' goroutines.
func (r *Registry) Apply(cfgs []EngineConfig, opts Options) {
	r.lifeMu.Lock()
	defer r.lifeMu.Unlock()
	r.mu.RLock()
	closed := r.closed
	r.mu.RUnlock()
	if closed {
		return
	}
	if r.setOptions(opts) {
		r.kickAll()
	}
	o := r.options()

	want := make(map[string]EngineConfig, len(cfgs))
	order := make([]string, 0, len(cfgs))
	for _, c := range cfgs {
		if err := c.Validate(); err != nil {
			o.Logger.Error("ignoring invalid engine config", zap.Error(err))
			continue
		}
		if _, dup := want[c.Dial]; dup {
			o.Logger.Warn("duplicate engine config ignored", zap.String("engine", c.Dial))
			continue
		}
		c = c.clone().withDefaults()
		c.Static = true
		want[c.Dial] = c
		order = append(order, c.Dial)
	}

	type restart struct {
		e   *Engine
		cfg EngineConfig
		h   *runHandle
	}
	var restarts []restart
	var stops []*runHandle
	now := r.now()

	r.mu.Lock()
	for _, dial := range order {
		c := want[dial]
		e, ok := r.engines[dial]
		if !ok {
			e = newEngine(r, c)
			r.engines[dial] = e
			if r.running {
				e.run = e.start(r.worker)
			}
			continue
		}
		e.mu.Lock()
		if needsRestart(e.cfg, c) {
			e.mu.Unlock()
			restarts = append(restarts, restart{e: e, cfg: c, h: e.run})
			e.run = nil
			continue
		}
		e.cfg = c
		e.mu.Unlock()
	}
	for dial, e := range r.engines {
		if _, ok := want[dial]; ok {
			continue
		}
		e.mu.Lock()
		if !e.cfg.Static {
			e.mu.Unlock()
			continue
		}
		if e.inflight > 0 || now.Sub(time.Unix(0, e.lastUsed.Load())) < o.IdleTTL {
			e.cfg.Static = false
			e.mu.Unlock()
			continue
		}
		e.mu.Unlock()
		delete(r.engines, dial)
		stops = append(stops, e.run)
		e.run = nil
	}
	if !r.running {
		r.running = true
		for _, e := range r.engines {
			if e.run == nil && !slices.ContainsFunc(restarts, func(x restart) bool { return x.e == e }) {
				e.run = e.start(r.worker)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		r.gcCancel, r.gcDone = cancel, make(chan struct{})
		go r.gcLoop(ctx, r.gcDone)
	}
	r.mu.Unlock()

	for _, h := range stops {
		h.stop()
	}
	for _, rs := range restarts {
		rs.h.stop()
		rs.e.mu.Lock()
		if rs.e.cfg.MetricsURL != rs.cfg.MetricsURL {
			// Another metrics source may be another engine: neither its
			// counters nor its speed continue this one's. Other changes
			// (header, pool, attrs) keep measuring the same counters, and
			// an engine restart shows as counters going down.
			rs.e.prefill = prefillEstimator{}
			rs.e.prompts = promptMean{}
		}
		if rs.e.cfg.ModelsURL != rs.cfg.ModelsURL {
			// Likewise another model list may be another engine's: the
			// new poller learns it at its first successful scrape.
			rs.e.models = modelsState{}
		}
		rs.e.cfg = rs.cfg
		rs.e.checked = false // re-run the self-check against the new config
		rs.e.mu.Unlock()
		r.mu.Lock()
		if r.running && r.engines[rs.e.dial] == rs.e {
			rs.e.run = rs.e.start(r.worker)
		}
		r.mu.Unlock()
	}
}

// kickAll wakes every poller so a new PollInterval takes effect now.
func (r *Registry) kickAll() {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, e := range r.engines {
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
}

// Ensure returns the engine for dial, registering a dynamic engine with
// defaults derived from dial if it is unknown (its poller starts at once if
// the registry is running). It marks the engine as used (for the GC).
// After Close it returns a detached engine that is never polled.
func (r *Registry) Ensure(dial string) *Engine {
	r.mu.RLock()
	e, ok := r.engines[dial]
	if ok {
		// Touch under the lock so the GC (which holds the write lock) cannot
		// remove the engine between the lookup and the touch.
		e.touch()
	}
	r.mu.RUnlock()
	if ok {
		return e
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.engines[dial]; ok {
		e.touch()
		return e
	}
	e = newEngine(r, EngineConfig{Dial: dial}.withDefaults())
	if r.closed {
		return e
	}
	r.engines[dial] = e
	if r.running {
		e.run = e.start(r.worker)
	}
	return e
}

// Get returns the engine for dial, if registered. It does not mark it used.
func (r *Registry) Get(dial string) (*Engine, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.engines[dial]
	return e, ok
}

// Engines returns the registered engines sorted by dial address.
func (r *Registry) Engines() []*Engine {
	r.mu.RLock()
	out := make([]*Engine, 0, len(r.engines))
	for _, e := range r.engines {
		out = append(out, e)
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Engine) int { return strings.Compare(a.dial, b.dial) })
	return out
}

// Serving returns the engines that serve model — a base model's or a LoRA
// adapter's id — by what each engine's /v1/models last listed, else its
// configured names (see [Engine.Models]), sorted by dial address. It reads
// only: nothing is fetched, and an engine whose models are unknown is not
// included.
func (r *Registry) Serving(model string) []*Engine {
	var out []*Engine
	r.mu.RLock()
	for _, e := range r.engines {
		e.mu.Lock()
		ok := e.servesLocked(model)
		e.mu.Unlock()
		if ok {
			out = append(out, e)
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Engine) int { return strings.Compare(a.dial, b.dial) })
	return out
}

// AnyServes reports whether some engine serves model, as [Registry.Serving]
// counts them, without listing them: a request's metrics ask it for their
// model label.
func (r *Registry) AnyServes(model string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, e := range r.engines {
		e.mu.Lock()
		ok := e.servesLocked(model)
		e.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// StaleTransitions counts fresh→stale transitions over the registry's life:
// each time an engine's consecutive failures reach StaleAfter (counted once
// per episode; a successful scrape ends the episode).
func (r *Registry) StaleTransitions() uint64 { return r.staleTransitions.Load() }

// Degraded returns how many engines currently fail the startup self-check.
func (r *Registry) Degraded() int {
	n := 0
	for _, e := range r.Engines() {
		e.mu.Lock()
		if e.degraded {
			n++
		}
		e.mu.Unlock()
	}
	return n
}

// Close stops every poller, worker and the GC loop and waits for them; for
// when the last config using the registry is gone. Idempotent. Engines
// (and reservations) held by callers stay usable but are no longer polled.
func (r *Registry) Close() {
	r.lifeMu.Lock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.lifeMu.Unlock()
		return
	}
	r.closed, r.running = true, false
	var hs []*runHandle
	for _, e := range r.engines {
		hs = append(hs, e.run)
		e.run = nil
	}
	r.engines = make(map[string]*Engine)
	gcCancel, gcDone := r.gcCancel, r.gcDone
	r.mu.Unlock()
	r.lifeMu.Unlock()

	if gcCancel != nil {
		gcCancel()
		<-gcDone
	}
	for _, h := range hs {
		h.stop()
	}
	if r.ownClient != nil {
		r.ownClient.CloseIdleConnections()
	}
}

// gcLoop removes dynamic engines unused for IdleTTL with nothing in flight.
func (r *Registry) gcLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	for {
		iv := min(max(r.options().IdleTTL/4, 50*time.Millisecond), time.Minute)
		t := time.NewTimer(iv)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.gcWake:
			t.Stop()
		case <-t.C:
		}
		r.collect(ctx)
	}
}

func (r *Registry) collect(ctx context.Context) {
	r.lifeMu.Lock()
	defer r.lifeMu.Unlock()
	if ctx.Err() != nil {
		return
	}
	o := r.options()
	now := r.now()
	var stops []*runHandle
	r.mu.Lock()
	for dial, e := range r.engines {
		e.mu.Lock()
		idle := !e.cfg.Static && e.inflight == 0 && now.Sub(time.Unix(0, e.lastUsed.Load())) >= o.IdleTTL
		e.mu.Unlock()
		if idle {
			delete(r.engines, dial)
			stops = append(stops, e.run)
			e.run = nil
			o.Logger.Debug("removed idle dynamic engine", zap.String("engine", dial))
		}
	}
	r.mu.Unlock()
	for _, h := range stops {
		h.stop()
	}
}

// redactURL drops userinfo and query (which may carry credentials) for logs.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<unparsable URL>"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}
