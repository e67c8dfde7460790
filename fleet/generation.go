package fleet

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/localtok"
	"github.com/llmgw/caddy-llmgw/remotetok"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Config is what one config generation asks of the fleet. Zero durations
// and counts leave the registry's and tokenizer's defaults in place.
type Config struct {
	PollInterval time.Duration // between scrapes of one engine
	PollTimeout  time.Duration // deadline of one scrape
	StaleAfter   int           // failed scrapes after which gauges are stale
	IdleTTL      time.Duration // dynamic engines unused this long are removed
	// ModelsInterval is the time between fetches of one engine's
	// /v1/models (upstreams.Options.ModelsInterval); 0 = its default.
	ModelsInterval time.Duration
	// KVEventsPort and KVReplayPort derive the KV-event endpoints of
	// engines without explicit ones: tcp://<dial host>:<port>; 0 = none.
	KVEventsPort, KVReplayPort int
	// HashSeed is the engines' PYTHONHASHSEED (or llm-d's hash seed);
	// when set, a sample of BlockStored events is re-hashed as vLLM does
	// and mismatches counted, and blocks whose parent the gateway never
	// saw are recognised by the engines' own hashes (see HashAlgo).
	HashSeed *string
	// HashAlgo is how the engines hash their blocks: kvindex.HashSHA256CBOR
	// (the default once HashSeed is set) or kvindex.HashLLMDFNV64aCBOR.
	HashAlgo            string
	TokenizeTimeout     time.Duration // deadline of one /tokenize call
	TokenizeConcurrency int           // /tokenize calls in flight at most
	TokenizeCacheSize   int           // tokenize cache entries
	// SpeculativeTTL is how long a prompt routed to an engine with live
	// KV events counts as held there before its events confirm it (see
	// Pick.Commit), from the first time it was routed there: routing it
	// there again does not renew it. nil means DefaultSpeculativeTTL, 0
	// disables.
	SpeculativeTTL *time.Duration
	Engines        []*EngineConfig
	// Tokenizers are the models tokenized in the gateway (the rest ask
	// the engines' /tokenize); see TokenizerConfig.
	Tokenizers []*TokenizerConfig
	// TokenizerCheckSample is the share of local tokenizations checked
	// against an engine's /tokenize (nil: localtok.DefaultSample, 0
	// disables); TokenizerMismatchLimit the mismatches after which a model
	// falls back to remote tokenization (nil: the default, 0 never).
	TokenizerCheckSample   *float64
	TokenizerMismatchLimit *int
	// Aliases maps public model names to served ones (see
	// [Fleet.ResolveAlias]); checked by ValidateAliases.
	Aliases map[string]string
	// models are the loaded local tokenizers (LoadTokenizers).
	models map[string]*localtok.Model
}

// DefaultSpeculativeTTL is the speculative entries' TTL unless configured:
// a prefill of a long prompt and its events' way back take well under 2s,
// and a prediction that never comes true misleads routing for 2s at most.
const DefaultSpeculativeTTL = 2 * time.Second

// EngineConfig describes one vLLM API server, keyed by the address
// reverse_proxy dials for it: one engine, or with DataParallelSize the
// data-parallel ranks behind it, each a routing target keyed dial#r.
type EngineConfig struct {
	// The upstream dial address, exactly as reverse_proxy writes it
	// (host:port). Required.
	Dial string `json:"dial"`

	// URL of the engine's Prometheus metrics. Default: http://<dial>/metrics.
	Metrics string `json:"metrics,omitempty"`

	// URL of the engine's /tokenize. Default: http://<dial>/tokenize.
	Tokenize string `json:"tokenize,omitempty"`

	// Admission limit on running + waiting + dispatched requests. Default: 0,
	// which uses the handler's max_inflight, and without one treats an
	// engine with queued (waiting) requests as full.
	MaxInflight int `json:"max_inflight,omitempty"`

	// ZeroMQ endpoint of the engine's KV-cache events, e.g.
	// tcp://10.0.0.7:5557. Default: derived from kv_events_port, else none.
	KVEvents string `json:"kv_events,omitempty"`

	// Bind kv_events locally and let the engine connect (vLLM publishes in
	// connect mode when its endpoint has no `*`). Default: false (dial).
	KVEventsBind bool `json:"kv_events_bind,omitempty"`

	// ZeroMQ endpoint of the engine's replay ROUTER, used to fill sequence
	// gaps. Default: derived from kv_replay_port, else none.
	KVReplay string `json:"kv_replay,omitempty"`

	// Topic prefix the engine publishes under. Default: "" (all).
	KVTopic string `json:"kv_topic,omitempty"`

	// Bearer token sent to the engine's /metrics and /tokenize, for vLLM
	// started with --api-key. Placeholders such as {env.VLLM_API_KEY} are
	// expanded. Never logged.
	APIKey string `json:"api_key,omitempty"`

	// The pool the engine serves: reverse_proxy's `dynamic llm <pool>`
	// proxies to the engines of that pool, and the name is shown in
	// metrics and the admin API. Default: "default".
	Pool string `json:"pool,omitempty"`

	// URL of the engine's OpenAI model list, polled to learn which models
	// it serves. Default: /v1/models on the metrics URL's server (and path
	// prefix, when the metrics path ends in /metrics).
	ModelsURL string `json:"models_url,omitempty"`

	// The models the engine serves, for an engine that does not answer
	// /v1/models: used until a fetch of models_url succeeds, whose list
	// then wins. Default: none (the engine's models are unknown until
	// discovered, and it may be sent any model).
	Models []string `json:"models,omitempty"`

	// Number of data-parallel ranks behind the address: vLLM started with
	// --data-parallel-size N serves N engine ranks, each with its own KV
	// cache and scheduler, on one API server. Each rank is a routing
	// target of its own, keyed dial#r in the admin API and metrics: its
	// gauges are the series of the shared /metrics page whose `engine`
	// label is r, its KV events are read from the kv_events (and
	// kv_replay) port + r, as vLLM publishes them, and max_inflight
	// applies per rank. The rank a request is routed to is sent to the
	// engine in the X-data-parallel-rank header (vLLM's internal load
	// balancer then leaves it there). Default: 1 (one engine).
	DataParallelSize int `json:"data_parallel_size,omitempty"`
}

// Validate checks a config before any of it is applied.
func (c *Config) Validate() error {
	if c.StaleAfter < 0 {
		return fmt.Errorf("stale_after must be positive, got %d", c.StaleAfter)
	}
	if c.PollInterval < 0 || c.PollTimeout < 0 || c.IdleTTL < 0 || c.TokenizeTimeout < 0 ||
		c.SpeculativeTTL != nil && *c.SpeculativeTTL < 0 {
		return fmt.Errorf("durations must be positive")
	}
	if c.ModelsInterval < 0 {
		return fmt.Errorf("models_interval must not be negative, got %v", c.ModelsInterval)
	}
	if err := c.validateTokenizers(); err != nil {
		return err
	}
	if err := ValidateAliases(c.Aliases); err != nil {
		return err
	}
	if err := (kvindex.EngineHash{Algo: c.HashAlgo}).Validate(); err != nil {
		return fmt.Errorf("hash_algo: %w", err)
	}
	if c.HashAlgo == kvindex.HashSHA256CBOR && c.HashSeed == nil {
		return fmt.Errorf("hash_algo %s needs hash_seed: the engines' PYTHONHASHSEED", c.HashAlgo)
	}
	for _, p := range []int{c.KVEventsPort, c.KVReplayPort} {
		if p < 0 || p > 65535 {
			return fmt.Errorf("port %d out of range", p)
		}
	}
	seen := map[string]bool{}
	for i, e := range c.Engines {
		if e == nil || e.Dial == "" {
			return fmt.Errorf("engine %d: dial address is required", i)
		}
		if _, _, err := net.SplitHostPort(e.Dial); err != nil {
			return fmt.Errorf("engine %q: dial address must be host:port: %w", e.Dial, err)
		}
		if seen[e.Dial] {
			return fmt.Errorf("engine %q listed twice", e.Dial)
		}
		seen[e.Dial] = true
		if err := c.validateEngine(e); err != nil {
			return err
		}
	}
	return nil
}

// validateEngine checks one engine's own settings.
func (c *Config) validateEngine(e *EngineConfig) error {
	if e.MaxInflight < 0 {
		return fmt.Errorf("engine %q: max_inflight must not be negative", e.Dial)
	}
	if e.DataParallelSize < 0 || e.DataParallelSize > MaxDataParallelSize {
		return fmt.Errorf("engine %q: data_parallel_size must be between 1 and %d, got %d", e.Dial, MaxDataParallelSize, e.DataParallelSize)
	}
	if strings.Contains(e.Dial, "#") {
		return fmt.Errorf("engine %q: dial address must not contain '#' (it names data-parallel ranks)", e.Dial)
	}
	for _, ep := range []string{e.KVEvents, e.KVReplay} {
		if ep != "" && !strings.HasPrefix(ep, "tcp://") {
			return fmt.Errorf("engine %q: ZeroMQ endpoint %q must be tcp://host:port", e.Dial, ep)
		}
	}
	// The registry's own check covers the URLs (models_url included)
	// and the model names; run it here so a bad one fails the config
	// instead of the engine being skipped at run time.
	rs, err := c.registryEngines(e)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Generation is one config generation's handle on the fleet: made when the
// config is provisioned, started when it runs, stopped and cleaned up when
// it goes. Its selection policies pass it to [Fleet.LearnPool].
type Generation struct {
	cfg    Config
	logger *zap.Logger
	// Set by Start, for Stop after a failed reload: the generation this one
	// replaced and the fleet's logger before.
	prev    *Generation
	prevLog *zap.Logger
}

// NewGeneration returns the handle of a config generation that logs to
// logger. Nothing is applied before [Fleet.Start].
func (f *Fleet) NewGeneration(cfg Config, logger *zap.Logger) *Generation {
	return &Generation{cfg: cfg, logger: logger}
}

// Start makes g the running generation: the fleet logs through g's logger
// and follows its config (pollers and KV subscriptions start for new
// engines and stop for removed ones; engines that stay keep running).
func (f *Fleet) Start(g *Generation) {
	g.prevLog = f.logBase.Swap(g.logger)
	f.mu.Lock()
	g.prev, f.running = f.running, g
	if f.started == nil {
		f.started = make(map[*Generation]bool)
	}
	f.started[g] = true
	f.mu.Unlock()
	f.apply(g.cfg)
}

// Stop is g's stop. When g is still the running generation and the one it
// replaced is still started, the reload that started g failed and that one
// keeps serving: the fleet logs through and follows its config again. (At
// shutdown the previous generation has been cleaned up already, and nothing
// is restored.)
func (f *Fleet) Stop(g *Generation) {
	if g.prevLog != nil {
		f.logBase.CompareAndSwap(g.logger, g.prevLog)
	}
	f.mu.Lock()
	if f.running != g {
		f.mu.Unlock()
		return
	}
	f.running = nil
	restore := g.prev != nil && f.started[g.prev]
	if restore {
		f.running = g.prev
	}
	f.mu.Unlock()
	if restore {
		f.apply(g.prev.cfg)
	}
}

// Cleanup forgets generation g.
func (f *Fleet) Cleanup(g *Generation) {
	f.mu.Lock()
	delete(f.started, g)
	f.mu.Unlock()
}

func (f *Fleet) registryOptions(c *Config) upstreams.Options {
	o := upstreams.Options{
		Logger:    f.logger.Named("poller"),
		OnUpdate:  f.onUpdate,
		OnRestart: f.onRestart,
		OnSleep:   f.onSleep,
		Worker:    f.kvWorker,
	}
	if c != nil {
		o.PollInterval, o.PollTimeout = c.PollInterval, c.PollTimeout
		o.StaleAfter, o.IdleTTL = c.StaleAfter, c.IdleTTL
		o.ModelsInterval = c.ModelsInterval
	}
	return o
}

// apply makes the fleet follow a starting generation's config.
func (f *Fleet) apply(c Config) {
	f.startOne.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		f.stop = cancel
		go f.kicker(ctx)
	})
	tok := remotetok.TokenizerOptions{
		Timeout:       c.TokenizeTimeout,
		MaxConcurrent: c.TokenizeConcurrency,
		CacheEntries:  c.TokenizeCacheSize,
	}
	f.mu.Lock()
	f.kvEventsPort, f.kvReplayPort = c.KVEventsPort, c.KVReplayPort
	reverify := seedChanged(f.verifySeed, c.HashSeed) || f.hashAlgo != c.HashAlgo
	f.verifySeed, f.hashAlgo = c.HashSeed, c.HashAlgo
	if tok != f.tokOpts {
		// New limits take a new client; calls in flight finish on the old.
		f.tokOpts = tok
		f.tokenizer.Swap(remotetok.NewTokenizer(tok)).Close()
	}
	f.mu.Unlock()
	if reverify {
		f.applyVerify()
	}
	f.applyTokenizers(c)
	ttl := DefaultSpeculativeTTL
	if c.SpeculativeTTL != nil {
		ttl = *c.SpeculativeTTL
	}
	if ttl != f.index.PredictTTL() {
		f.index.SetPredictTTL(ttl)
	}
	aliases := maps.Clone(c.Aliases) // read per request: not shared with the caller's config
	f.aliases.Store(&aliases)
	f.ranks.Store(newRankTable(c.Engines))
	f.registry.Apply(c.engineConfigs(), f.registryOptions(&c))
	// A new config may route a pool to other upstreams: forget what the
	// policies learned, or admission would gate (and fail open) on departed
	// engines until the first request of the pool reaches the policy —
	// which a request parked on the stale list never does. Policies relearn
	// on their next request; meanwhile PoolDials falls back to the config.
	f.mu.Lock()
	clear(f.pools)
	f.mu.Unlock()
}

// engineConfigs turns the config into the registry's view: an engine
// with data-parallel ranks is one registry engine per rank. Configs that
// Validate refuses are left out.
func (c *Config) engineConfigs() []upstreams.EngineConfig {
	out := make([]upstreams.EngineConfig, 0, len(c.Engines))
	for _, e := range c.Engines {
		rs, err := c.registryEngines(e)
		if err == nil {
			out = append(out, rs...)
		}
	}
	return out
}

// registryEngines is e as the registry takes it, one config per rank; the
// KV subscription rides in Attrs so that changing it restarts the
// subscriber.
func (c *Config) registryEngines(e *EngineConfig) ([]upstreams.EngineConfig, error) {
	kc := kvConfig{Endpoint: e.KVEvents, Bind: e.KVEventsBind, Replay: e.KVReplay, Topic: e.KVTopic}
	if kc.Endpoint == "" {
		kc.Endpoint = derivedEndpoint(e.Dial, c.KVEventsPort)
	}
	if kc.Replay == "" {
		kc.Replay = derivedEndpoint(e.Dial, c.KVReplayPort)
	}
	base := upstreams.EngineConfig{
		Dial:        e.Dial,
		MetricsURL:  e.Metrics,
		TokenizeURL: e.Tokenize,
		ModelsURL:   e.ModelsURL,
		Models:      e.Models,
		MaxInflight: e.MaxInflight,
		Header:      bearer(e.APIKey),
		Pool:        e.Pool,
		Static:      true,
		Attrs:       kc.attrs(),
	}
	if e.DataParallelSize <= 1 {
		return []upstreams.EngineConfig{base}, nil
	}
	// The ranks share the address's endpoints: fill them from it before
	// the rank keys replace the dial.
	if base.MetricsURL == "" {
		base.MetricsURL = "http://" + e.Dial + "/metrics"
	}
	if base.TokenizeURL == "" {
		base.TokenizeURL = "http://" + e.Dial + "/tokenize"
	}
	out := make([]upstreams.EngineConfig, 0, e.DataParallelSize)
	for r := range e.DataParallelSize {
		rk, err := kc.rank(r)
		if err != nil {
			return nil, fmt.Errorf("engine %q: %w", e.Dial, err)
		}
		rc := base
		rc.Dial, rc.EngineLabel, rc.Attrs = RankKey(e.Dial, r), strconv.Itoa(r), rk.attrs()
		out = append(out, rc)
	}
	return out, nil
}

// derivedEndpoint is tcp://<host of dial>:<port>, or "" when port is 0.
func derivedEndpoint(dial string, port int) string {
	if port == 0 {
		return ""
	}
	host, _, err := net.SplitHostPort(dial)
	if err != nil {
		return ""
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

func bearer(key string) http.Header {
	if key == "" {
		return nil
	}
	return http.Header{"Authorization": []string{"Bearer " + key}}
}

// seedChanged reports whether a new hash_seed differs from the old one.
func seedChanged(old, new *string) bool {
	if old == nil || new == nil {
		return old != new
	}
	return *old != *new
}

// engineHashLocked is how the engines hash their blocks, as configured:
// known once hash_seed is set (sha256_cbor unless hash_algo says
// otherwise) or hash_algo names llm-d's hashing, whose seed defaults to
// the empty string as llm-d's does. f.mu held.
func (f *Fleet) engineHashLocked() kvindex.EngineHash {
	algo := f.hashAlgo
	if algo == "" && f.verifySeed != nil {
		algo = kvindex.HashSHA256CBOR
	}
	if algo == "" || (algo == kvindex.HashSHA256CBOR && f.verifySeed == nil) {
		return kvindex.EngineHash{}
	}
	h := kvindex.EngineHash{Algo: algo}
	if f.verifySeed != nil {
		h.Seed = *f.verifySeed
	}
	return h
}

// verifyConfig is the mirrors' hash verification under the current seed.
// Only vLLM's sha256_cbor is verified: llm-d's root hash includes the
// request's model name, which events do not carry. f.mu held.
func (f *Fleet) verifyConfigLocked() kvindex.VerifyConfig {
	if h := f.engineHashLocked(); h.Algo == kvindex.HashSHA256CBOR {
		return kvindex.VerifyConfig{Seed: h.Seed, Sample: 16}
	}
	return kvindex.VerifyConfig{}
}

// applyVerify brings the running mirrors in line with a changed hash_seed
// or hash_algo: subscriptions read them only when they start, and a reload
// that changes them keeps them running. Counters restart with the new
// seed, and orphans kept under the old hashing are dropped.
func (f *Fleet) applyVerify() {
	f.mu.Lock()
	cfg, h := f.verifyConfigLocked(), f.engineHashLocked()
	f.mu.Unlock()
	for _, st := range f.index.Stats() {
		if m := f.index.Mirror(st.Engine); m != nil {
			m.SetVerify(cfg)
			m.SetHash(h)
		}
	}
}
