package fleet

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/localtok"
	"github.com/llmgw/caddy-llmgw/remotetok"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Fleet is the process-wide state shared by every config generation. All
// methods are safe for concurrent use.
type Fleet struct {
	logger   *zap.Logger                // writes through logBase's core
	logBase  atomic.Pointer[zap.Logger] // the running generation's logger
	registry *upstreams.Registry
	index    *kvindex.Index
	approx   *kvindex.ApproxTree
	// approxMatches counts the decisions that walked approx: the ones
	// with a candidate on the approximate tier. Only tests read it (they
	// pin that a fleet whose events are all live skips the walk); it is
	// not exported as a metric.
	approxMatches atomic.Uint64
	// keys keeps recent prompts' block keys, so that a prompt sharing
	// their first blocks hashes only the rest (keys.go).
	keys      *keyKeep
	tokenizer atomic.Pointer[remotetok.Tokenizer]
	tokOpts   remotetok.TokenizerOptions // guarded by mu
	// local is the running config's local tokenizers, nil without any;
	// tokNames the models with a local tokenizer of their own;
	// tokModels keeps loaded tokenizer directories across reloads.
	local     atomic.Pointer[localtok.Set]
	tokNames  atomic.Pointer[map[string]struct{}]
	tokModels localtok.Cache
	// imageTokens is the running config's image keying by model: the
	// placeholder id and image hash settings of TokenizerConfig (mmkeys.go).
	imageTokens atomic.Pointer[map[string]imageKeying]
	breaker     *routing.Breaker // guarded by mu; replaced when its config changes
	// aliases is the running config's public model names (models.go).
	aliases atomic.Pointer[map[string]string]
	// responses maps stored Responses ids to their engines (responses.go).
	responses *responseStore
	// ranks is the running config's data-parallel ranks (ranks.go).
	ranks atomic.Pointer[rankTable]

	now      func() time.Time // Options.Now
	kick     chan struct{}
	stop     context.CancelFunc
	stopped  chan struct{}
	startOne sync.Once

	mu    sync.Mutex
	gates map[string]*admission.Gate
	pools map[string][]string // pool name -> dials, learned from the policy

	// modelGates counts, by pool, the gates split off it for requests
	// only some of its engines serve (ModelGate); made lazily.
	modelGates map[string]int

	// running is the generation whose config the fleet follows; started
	// holds the generations started and not yet cleaned up. Only the
	// running generation's policies may teach pools.
	running      *Generation
	started      map[*Generation]bool
	subs         map[string]*subscription
	drained      map[string]bool
	kvEventsPort int
	kvReplayPort int
	verifySeed   *string
	hashAlgo     string
	poolModels   map[string]string // pool -> model last seen, for metrics
	policies     map[string]Settings
	breakerCfg   routing.BreakerConfig
}

// Options are what a Fleet is built with, fixed for its life.
type Options struct {
	// ManualScrape runs no gauge pollers: the caller scrapes engines itself
	// through [upstreams.Engine.StartScrape] (the fleet simulation, which
	// keeps its own clock).
	ManualScrape bool
	// IndexConfig bounds the prefix index. Default: kvindex's defaults.
	Index kvindex.IndexConfig
	// Now is the clock of the admission gates, of the engines' drain
	// rates and of the speculative entries' TTL (the fleet simulation's
	// own); default time.Now. Index.Now, when set, is the TTL's instead.
	Now func() time.Time
}

// New returns a fleet that logs to logger until a generation starts. No
// goroutine runs before the first [Fleet.Start].
func New(logger *zap.Logger, o Options) *Fleet {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Index.Now == nil {
		o.Index.Now = o.Now
	}
	f := &Fleet{
		index:   kvindex.NewIndex(o.Index),
		approx:  kvindex.NewApproxTree(kvindex.ApproxConfig{}),
		keys:    newKeyKeep(),
		breaker: routing.NewBreaker(routing.BreakerConfig{}),
		kick:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
		gates:   make(map[string]*admission.Gate),
		pools:   make(map[string][]string),
		subs:    make(map[string]*subscription),
		drained: make(map[string]bool),
		now:     o.Now,
	}
	f.responses = newResponseStore(DefaultMaxResponses, DefaultResponseTTL, o.Now)
	f.index.SetPredictTTL(DefaultSpeculativeTTL)
	f.logBase.Store(logger)
	// The fleet outlives configs; its logs go where the running
	// generation says, not to the first config's outputs.
	f.logger = zap.New(&liveCore{base: &f.logBase}).Named(logger.Name())
	ro := f.registryOptions(nil)
	ro.ManualScrape, ro.Now = o.ManualScrape, f.now
	f.registry = upstreams.NewRegistry(ro)
	f.tokenizer.Store(remotetok.NewTokenizer(remotetok.TokenizerOptions{}))
	return f
}

// Registry is the fleet's engine registry: gauges and local accounting.
func (f *Fleet) Registry() *upstreams.Registry { return f.registry }

// Index is the fleet's prefix index of the engines' KV caches.
func (f *Fleet) Index() *kvindex.Index { return f.index }

// Close stops every worker and closes the fleet's connections; called when
// the last config is unloaded. The registry closes its scrape client's; the
// tokenizer's keep-alive connections to the engines' /tokenize must go too,
// or each one idles for the transport's 90s after the fleet is gone (and a
// tokenize call still running in a leaving config's request closes its own
// when it ends).
func (f *Fleet) Close() {
	if f.stop != nil {
		f.stop()
		<-f.stopped
	}
	f.registry.Close()
	f.tokenizer.Load().Close()
	if s := f.local.Swap(nil); s != nil {
		s.Close()
	}
}

func (f *Fleet) onUpdate(dial string) {
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
func (f *Fleet) kicker(ctx context.Context) {
	defer close(f.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		}
		for _, g := range f.gateList() {
			g.Kick()
		}
	}
}

// Gate returns the admission gate of a pool, updating its tunables.
func (f *Fleet) Gate(pool string, cfg admission.Config) *admission.Gate {
	f.mu.Lock()
	g, ok := f.gates[pool]
	if !ok {
		g = admission.NewGateClock(cfg, f.now)
		f.gates[pool] = g
	}
	f.mu.Unlock()
	if ok {
		// Outside f.mu: the lock order is gate, then fleet (a gate runs its
		// try functions, which read the fleet, under its own lock).
		g.SetConfig(cfg)
	}
	return g
}

// Gates returns the admission gates by pool.
func (f *Fleet) Gates() map[string]*admission.Gate {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]*admission.Gate, len(f.gates))
	for k, g := range f.gates {
		out[k] = g
	}
	return out
}

func (f *Fleet) gateList() []*admission.Gate {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*admission.Gate, 0, len(f.gates))
	for _, g := range f.gates {
		out = append(out, g)
	}
	return out
}

// LearnPool records the upstreams (sorted) that a selection policy of
// generation from saw for a pool, so the admission handler of the same
// route knows which engines serve it. During a reload, requests still in
// the old config's routes must not teach the new one their upstreams: only
// the running generation's policies count.
func (f *Fleet) LearnPool(from *Generation, pool string, dials []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if from != f.running || slices.Equal(f.pools[pool], dials) {
		return
	}
	f.pools[pool] = append([]string(nil), dials...)
}

// PoolDials returns the engines serving a pool: learned from the policy
// under the running config, else the engines configured for the pool, else
// every engine the registry knows (the discovered ones included).
func (f *Fleet) PoolDials(pool string) []string {
	f.mu.Lock()
	d, ok := f.pools[pool]
	f.mu.Unlock()
	if ok {
		return d
	}
	var static, all []string
	for _, e := range f.registry.Engines() {
		all = append(all, e.Dial())
		if c := e.Config(); c.Static && (c.Pool == pool || c.Pool == "" && pool == upstreams.DefaultPool) {
			static = append(static, e.Dial())
		}
	}
	if len(static) > 0 {
		return static
	}
	return all
}

// SetDrained drains an engine (no new requests; in-flight ones finish) or
// undrains it.
func (f *Fleet) SetDrained(dial string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.drained[dial] = true
	} else {
		delete(f.drained, dial)
	}
}

// IsDrained reports whether an engine is drained.
func (f *Fleet) IsDrained(dial string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drained[dial]
}

// NotePoolModel remembers the model a pool serves, for the saturation
// metric.
func (f *Fleet) NotePoolModel(pool, model string) {
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
