package caddymodule

import (
	"context"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/kvindex/zmqsub"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// kvConfig is one engine's KV-event subscription.
type kvConfig struct {
	Endpoint string
	Bind     bool
	Replay   string
	Topic    string
}

// kvLive is a running subscription, for the admin API and the routing tier.
type kvLive struct {
	cfg  kvConfig
	sub  *zmqsub.Subscriber
	feed *kvindex.Feed
}

// fleet is the process-wide state shared by every config generation (see
// pool). All methods are safe for concurrent use.
type fleet struct {
	logger    *zap.Logger                // writes through logBase's core
	logBase   atomic.Pointer[zap.Logger] // the running config's logger
	registry  *upstreams.Registry
	index     *kvindex.Index
	approx    *kvindex.ApproxTree
	tokenizer atomic.Pointer[upstreams.Tokenizer]
	tokOpts   upstreams.TokenizerOptions // guarded by mu
	breaker   *routing.Breaker           // guarded by mu; replaced when its config changes

	kick     chan struct{}
	stop     context.CancelFunc
	stopped  chan struct{}
	startOne sync.Once

	mu    sync.Mutex
	gates map[string]*admission.Gate
	pools map[string][]string // pool name -> dials, learned from the policy
	// running is the app generation whose config the fleet follows;
	// started holds the generations started and not yet cleaned up. Only
	// the running generation's policies may teach pools.
	running      *App
	started      map[*App]bool
	kvLive       map[string]*kvLive
	drained      map[string]bool
	kvEventsPort int
	kvReplayPort int
	verifySeed   *string
	poolModels   map[string]string // pool -> model last seen, for metrics
	policies     map[string]routeSettings
	breakerCfg   routing.BreakerConfig
}

func newFleet(logger *zap.Logger) *fleet {
	f := &fleet{
		index:   kvindex.NewIndex(kvindex.IndexConfig{}),
		approx:  kvindex.NewApproxTree(kvindex.ApproxConfig{}),
		breaker: routing.NewBreaker(routing.BreakerConfig{}),
		kick:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
		gates:   make(map[string]*admission.Gate),
		pools:   make(map[string][]string),
		kvLive:  make(map[string]*kvLive),
		drained: make(map[string]bool),
	}
	// The fleet outlives configs; its logs go where the running config
	// says (App.Start updates logBase), not to the first config's outputs.
	f.logBase.Store(logger)
	f.logger = zap.New(&liveCore{base: &f.logBase}).Named(logger.Name())
	f.registry = upstreams.NewRegistry(f.registryOptions(nil))
	f.tokenizer.Store(upstreams.NewTokenizer(upstreams.TokenizerOptions{}))
	return f
}

func (f *fleet) registryOptions(a *App) upstreams.Options {
	o := upstreams.Options{
		Logger:   f.logger.Named("poller"),
		OnUpdate: f.onUpdate,
		Worker:   f.kvWorker,
	}
	if a != nil {
		o.PollInterval = time.Duration(a.PollInterval)
		o.PollTimeout = time.Duration(a.PollTimeout)
		o.StaleAfter = a.StaleAfter
		o.IdleTTL = time.Duration(a.IdleTTL)
	}
	return o
}

// startGeneration makes a the running generation and applies its config; it
// returns the generation that ran before.
func (f *fleet) startGeneration(a *App) (prev *App) {
	f.mu.Lock()
	prev, f.running = f.running, a
	if f.started == nil {
		f.started = make(map[*App]bool)
	}
	f.started[a] = true
	f.mu.Unlock()
	f.apply(a)
	return prev
}

// stopGeneration is a's Stop. When a is still the running generation and
// prev, the one it replaced, is still started, the reload that started a
// failed and prev keeps serving: the fleet follows prev's config again.
// (At shutdown prev has been cleaned up already, and nothing is restored.)
func (f *fleet) stopGeneration(a, prev *App) {
	f.mu.Lock()
	if f.running != a {
		f.mu.Unlock()
		return
	}
	f.running = nil
	restore := prev != nil && f.started[prev]
	if restore {
		f.running = prev
	}
	f.mu.Unlock()
	if restore {
		f.apply(prev)
	}
}

// cleanupGeneration forgets generation a.
func (f *fleet) cleanupGeneration(a *App) {
	f.mu.Lock()
	delete(f.started, a)
	f.mu.Unlock()
}

// apply makes the fleet follow the config of a starting app generation.
func (f *fleet) apply(a *App) {
	f.startOne.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		f.stop = cancel
		go f.kicker(ctx)
	})
	tok := upstreams.TokenizerOptions{
		Timeout:       time.Duration(a.TokenizeTimeout),
		MaxConcurrent: a.TokenizeConcurrency,
		CacheEntries:  a.TokenizeCacheSize,
	}
	f.mu.Lock()
	f.kvEventsPort, f.kvReplayPort = a.KVEventsPort, a.KVReplayPort
	reverify := seedChanged(f.verifySeed, a.HashSeed)
	f.verifySeed = a.HashSeed
	if tok != f.tokOpts {
		// New limits take a new client; calls in flight finish on the old.
		f.tokOpts = tok
		f.tokenizer.Swap(upstreams.NewTokenizer(tok)).Close()
	}
	f.mu.Unlock()
	if reverify {
		f.applyVerify()
	}
	f.registry.Apply(a.engineConfigs(), f.registryOptions(a))
	// A new config may route a pool to other upstreams: forget what the
	// policies learned, or admission would gate (and fail open) on departed
	// engines until the first request of the pool reaches Select — which a
	// request parked on the stale list never does. Policies relearn on
	// their next Select; meanwhile poolDials falls back to the config.
	f.mu.Lock()
	clear(f.pools)
	f.mu.Unlock()
}

// kvWorker is the registry's per-engine worker: it keeps the engine's KV
// subscription running while the engine is registered. The registry
// restarts it when the engine's config (its KV attributes included) changes.
func (f *fleet) kvWorker(ctx context.Context, e *upstreams.Engine) {
	dial := e.Dial()
	cfg := kvFromAttrs(e.Config().Attrs)
	if cfg.Endpoint == "" {
		// A discovered engine: the app-wide ports, if any.
		f.mu.Lock()
		cfg.Endpoint = derivedEndpoint(dial, f.kvEventsPort)
		cfg.Replay = derivedEndpoint(dial, f.kvReplayPort)
		f.mu.Unlock()
	}
	if cfg.Endpoint == "" {
		return
	}
	f.runSubscription(ctx, dial, cfg)
}

// runSubscription mirrors one engine's KV events into the index until ctx
// ends; the engine's mirror lives exactly as long.
func (f *fleet) runSubscription(ctx context.Context, dial string, cfg kvConfig) {
	log := f.logger.Named("kv").With(zap.String("engine", dial))
	f.mu.Lock()
	var verify kvindex.VerifyConfig
	if f.verifySeed != nil {
		verify = kvindex.VerifyConfig{Seed: *f.verifySeed, Sample: 16}
	}
	f.mu.Unlock()
	f.index.RemoveEngine(dial) // a mirror left by an earlier subscription is stale
	mirror, err := f.index.AddEngine(dial, kvindex.MirrorConfig{Verify: verify})
	if err != nil {
		log.Error("cannot mirror engine's KV events", zap.Error(err))
		<-ctx.Done()
		return
	}
	defer f.index.RemoveEngine(dial)
	if l := f.registry.Ensure(dial).Load(); l.NumGPUBlocks > 0 {
		mirror.SetCapacity(l.NumGPUBlocks)
	}
	var replay kvindex.Replayer
	if cfg.Replay != "" {
		ep := cfg.Replay
		replay = func(ctx context.Context, start uint64, fn func(seq uint64, payload []byte) error) error {
			return zmqsub.Replay(ctx, ep, start, 0, fn)
		}
	}
	feed := kvindex.NewFeed(mirror, replay, kvindex.FeedConfig{})
	defer feed.Close()
	sub, err := zmqsub.NewSubscriber(zmqsub.Config{
		Endpoint: cfg.Endpoint,
		Bind:     cfg.Bind,
		Topic:    cfg.Topic,
		Logger:   log,
	})
	if err != nil {
		log.Error("bad KV events endpoint", zap.Error(err))
		<-ctx.Done()
		return
	}
	f.mu.Lock()
	f.kvLive[dial] = &kvLive{cfg: cfg, sub: sub, feed: feed}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.kvLive, dial)
		f.mu.Unlock()
	}()
	if err := sub.Run(ctx, feed); err != nil {
		log.Error("KV subscription ended", zap.Error(err))
	}
}

// preciseFresh reports whether dial's KV mirror is live: subscribed and
// connected, so its blocks can be trusted for routing.
func (f *fleet) preciseFresh(dial string) bool {
	f.mu.Lock()
	l := f.kvLive[dial]
	f.mu.Unlock()
	return l != nil && l.sub.Stats().Connected
}

func (f *fleet) onUpdate(dial string) {
	// Keep the mirror no larger than what the engine can hold.
	if m := f.index.Mirror(dial); m != nil {
		if e, ok := f.registry.Get(dial); ok {
			if n := e.Load().NumGPUBlocks; n > 0 {
				m.SetCapacity(n)
			}
		}
	}
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// kicker wakes every admission gate after poll results and completions.
// One goroutine coalesces bursts and keeps gate locks out of the pollers.
func (f *fleet) kicker(ctx context.Context) {
	defer close(f.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		}
		f.mu.Lock()
		gates := make([]*admission.Gate, 0, len(f.gates))
		for _, g := range f.gates {
			gates = append(gates, g)
		}
		f.mu.Unlock()
		for _, g := range gates {
			g.Kick()
		}
	}
}

// gate returns the admission gate of a pool, updating its tunables.
func (f *fleet) gate(name string, cfg admission.Config) *admission.Gate {
	f.mu.Lock()
	g, ok := f.gates[name]
	if !ok {
		g = admission.NewGate(cfg)
		f.gates[name] = g
	}
	f.mu.Unlock()
	if ok {
		// Outside f.mu: the lock order is gate, then fleet (a gate runs its
		// try functions, which read the fleet, under its own lock).
		g.SetConfig(cfg)
	}
	return g
}

// learnPool records the upstreams a selection policy of the app generation
// from saw for a pool, so the admission handler of the same route knows
// which engines serve it. During a reload, requests still in the old
// config's routes must not teach the new one their upstreams: only the
// running generation's policies count.
func (f *fleet) learnPool(from *App, name string, dials []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if from != f.running {
		return
	}
	if slices.Equal(f.pools[name], dials) {
		return
	}
	f.pools[name] = append([]string(nil), dials...)
}

// poolDials returns the engines serving a pool: learned from the policy
// under the running config, else the engines the llm app configures for the
// pool, else every engine the registry knows.
func (f *fleet) poolDials(name string) []string {
	f.mu.Lock()
	d, ok := f.pools[name]
	f.mu.Unlock()
	if ok {
		return d
	}
	// The engines configured for this pool in the llm app, else every
	// engine known (the discovered ones included).
	var static, all []string
	for _, e := range f.registry.Engines() {
		all = append(all, e.Dial())
		if c := e.Config(); c.Static && (c.Pool == name || c.Pool == "" && name == "default") {
			static = append(static, e.Dial())
		}
	}
	if len(static) > 0 {
		return static
	}
	return all
}

func (f *fleet) setDrained(dial string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.drained[dial] = true
	} else {
		delete(f.drained, dial)
	}
}

func (f *fleet) isDrained(dial string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drained[dial]
}

func (f *fleet) drainedList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.drained))
	for d := range f.drained {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Destruct stops every worker and closes the fleet's connections; called
// when the last config is unloaded. The registry closes its scrape client's;
// the tokenizer's keep-alive connections to the engines' /tokenize must go
// too, or each one idles for the transport's 90s after the fleet is gone
// (and a tokenize call still running in a leaving config's request closes
// its own when it ends).
func (f *fleet) Destruct() error {
	if f.stop != nil {
		f.stop()
		<-f.stopped
	}
	f.registry.Close()
	f.tokenizer.Load().Close()
	return nil
}

func (c kvConfig) attrs() map[string]string {
	if c.Endpoint == "" {
		return nil
	}
	m := map[string]string{"kv_events": c.Endpoint}
	if c.Bind {
		m["kv_bind"] = "true"
	}
	if c.Replay != "" {
		m["kv_replay"] = c.Replay
	}
	if c.Topic != "" {
		m["kv_topic"] = c.Topic
	}
	return m
}

func kvFromAttrs(m map[string]string) kvConfig {
	return kvConfig{Endpoint: m["kv_events"], Bind: m["kv_bind"] == "true", Replay: m["kv_replay"], Topic: m["kv_topic"]}
}

// liveCore is a zapcore.Core that writes through the core of the logger in
// base at the time of each entry, so loggers made once (pollers, KV
// subscriptions) follow the log outputs and levels of later configs.
type liveCore struct {
	base   *atomic.Pointer[zap.Logger]
	fields []zapcore.Field
}

func (c *liveCore) core() zapcore.Core {
	core := c.base.Load().Core()
	if len(c.fields) > 0 {
		core = core.With(c.fields)
	}
	return core
}

// Enabled implements zapcore.LevelEnabler.
func (c *liveCore) Enabled(l zapcore.Level) bool { return c.base.Load().Core().Enabled(l) }

// With implements zapcore.Core.
func (c *liveCore) With(fields []zapcore.Field) zapcore.Core {
	return &liveCore{base: c.base, fields: append(c.fields[:len(c.fields):len(c.fields)], fields...)}
}

// Check implements zapcore.Core: the current core decides (its level and
// its logger-name filters) and is the one that writes.
func (c *liveCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !c.Enabled(e.Level) {
		return ce
	}
	return c.core().Check(e, ce)
}

// Write implements zapcore.Core; entries normally reach the current core
// through Check.
func (c *liveCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.core().Write(e, fields)
}

// Sync implements zapcore.Core.
func (c *liveCore) Sync() error { return c.base.Load().Core().Sync() }
