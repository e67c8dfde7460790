package caddymodule

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/fleet"
)

func init() {
	caddy.RegisterModule(new(App))
}

// pool holds the one fleet shared by every config generation of this process,
// so that a config reload keeps engine state, pollers, KV mirrors and parked
// requests. Reference-counted: acquired in App.Provision, released in
// App.Cleanup; the fleet's workers stop when the last config using it is gone.
var pool = caddy.NewUsagePool()

const fleetKey = "llmgw.fleet"

// current is the running llm app, set in Start and cleared in Stop, so the
// admin API (whose modules are provisioned before apps and never see them)
// reads the live generation at request time.
var current atomic.Pointer[App]

// App is the `llm` Caddy app. It owns the fleet state that the llm_admission
// handler and the llm selection policy share: one entry per vLLM engine keyed
// by its upstream dial address, with the engine's gauges polled from its
// /metrics, this gateway's local accounting, and the KV-cache mirror learned
// from the engine's KV events. The state survives config reloads: engines
// that stay keep their pollers and subscriptions; removed ones are stopped.
//
// reverse_proxy takes the engines listed here as its upstreams with the
// upstream source `dynamic llm` ([EngineUpstreams]), so each is listed once.
// Engines used by a handler or policy but not listed here (such as those of
// `dynamic a` or `dynamic srv`) are registered automatically with defaults
// derived from the dial address and garbage-collected when unused.
//
// EXPERIMENTAL: Subject to change.
type App struct {
	// How often each engine's /metrics is scraped. Default: 2s.
	PollInterval caddy.Duration `json:"poll_interval,omitempty"`

	// Deadline of one scrape. Default: the poll interval, at most 2s.
	PollTimeout caddy.Duration `json:"poll_timeout,omitempty"`

	// How often each engine's /v1/models is fetched to learn which models
	// it serves, so requests go only to engines serving their model. An
	// engine is also asked at its first scrape and after it restarts, so
	// this only bounds how late an adapter loaded at run time is seen.
	// Default: 30s.
	ModelsInterval caddy.Duration `json:"models_interval,omitempty"`

	// Consecutive failed scrapes after which an engine's gauges are stale
	// (admission then fails open, and routing ignores its load). Default: 3.
	StaleAfter int `json:"stale_after,omitempty"`

	// When set, every engine without an explicit kv_events endpoint gets a
	// KV-event subscription to tcp://<dial host>:<kv_events_port> (vLLM's
	// PUB bound on tcp://*:<port>). Default: 0 (only configured endpoints).
	KVEventsPort int `json:"kv_events_port,omitempty"`

	// Like kv_events_port, for the replay (ROUTER) endpoint used to fill
	// sequence gaps. Default: 0 (a gap resets the engine's mirror).
	KVReplayPort int `json:"kv_replay_port,omitempty"`

	// The engines' PYTHONHASHSEED (with vLLM's --prefix-caching-hash-algo
	// sha256_cbor), or llm-d's hash seed. When set, the gateway computes
	// the engines' own block hashes: a sample of BlockStored events is
	// re-hashed and mismatches are exposed, so a misconfigured seed or
	// block size is visible; and blocks announced with a parent the
	// gateway never saw (it started after the engines cached that prefix)
	// are recognised in the prompts that hold them. Default: unset (no
	// verification; such blocks are counted as unapplied and skipped).
	HashSeed *string `json:"hash_seed,omitempty"`

	// How the engines hash their blocks: "sha256_cbor" (vLLM with
	// --prefix-caching-hash-algo sha256_cbor; needs hash_seed) or
	// "llmd_fnv64a_cbor" (llm-d-kv-cache's hashing, as
	// llm-d-inference-sim publishes; hash_seed defaults to ""). Default:
	// sha256_cbor once hash_seed is set.
	HashAlgo string `json:"hash_algo,omitempty"`

	// How long a prompt routed to an engine with live KV events counts as
	// held there before its events confirm it; 0 disables. Default: 2s.
	SpeculativeTTL *caddy.Duration `json:"speculative_ttl,omitempty"`

	// How long the engine that stored a /v1/responses answer is
	// remembered for previous_response_id follow-ups (at most 100,000
	// ids, the oldest forgotten first); past it a follow-up is routed as
	// one this gateway never saw. Default: 1h.
	ResponsesTTL caddy.Duration `json:"responses_ttl,omitempty"`

	// Dynamic engines unused for this long are removed. Default: 10m.
	IdleTTL caddy.Duration `json:"idle_ttl,omitempty"`

	// Deadline of a /tokenize call made by the selection policy; on timeout
	// the request is routed on the approximate tier. Default: 500ms.
	TokenizeTimeout caddy.Duration `json:"tokenize_timeout,omitempty"`

	// At most this many /tokenize calls in flight; more fall back to the
	// approximate tier. Default: 64.
	TokenizeConcurrency int `json:"tokenize_concurrency,omitempty"`

	// Entries of the tokenize cache (keyed by a hash of the tokenize input),
	// holding at most 32 MiB of token ids. An answer of 512 ids or more is
	// kept when its request comes a second time: most never do. Negative:
	// no cache, and no recent answers kept to decode the next from where
	// it differs. Default: 4096.
	TokenizeCacheSize int `json:"tokenize_cache_size,omitempty"`

	// Local tokenizers by model name: requests for these models are
	// tokenized in the gateway from the model's Hugging Face tokenizer
	// directory, never by a /tokenize call on the request's path.
	// Default: none (every model asks the engines' /tokenize).
	Tokenizers []*fleet.TokenizerConfig `json:"tokenizers,omitempty"`

	// Share of local tokenizations checked against an engine's /tokenize
	// in the background, 0 to 1; 0 disables. Default: 0.01.
	TokenizerCheckSample *float64 `json:"tokenizer_check_sample,omitempty"`

	// Mismatches after which a model's local tokenizer is set aside and
	// its requests ask the engines' /tokenize again, until the next config
	// load; 0 never. Default: 5.
	TokenizerMismatchLimit *int `json:"tokenizer_mismatch_limit,omitempty"`

	// The engines this gateway knows in advance. Others are discovered.
	Engines []*fleet.EngineConfig `json:"engines,omitempty"`

	// Public model names mapped to the names the engines serve, for
	// renames and canaries: a request whose body's model is a key here is
	// rewritten to the value before admission, routing and the engine see
	// it, and the gateway's /v1/models (llm_models) lists the key beside
	// the served model. A key that engines also serve is shadowed. Names
	// must not be empty, an alias must not name itself, and a value must
	// not be another key (no chains). Without llm_admission, lb_policy llm
	// rewrites the body it reads; one it stops waiting for (a client
	// stalling its body) goes on as sent, and the engine answers 404 for
	// the alias. Default: none.
	Aliases map[string]string `json:"aliases,omitempty"`

	fleet  *fleet.Fleet
	gen    *fleet.Generation // this config generation's handle on the fleet
	logger *zap.Logger
}

// sharedFleet is the pool's value: the fleet, closed when the last config
// using it is unloaded.
type sharedFleet struct{ *fleet.Fleet }

// Destruct implements caddy.Destructor.
func (s sharedFleet) Destruct() error {
	s.Close()
	return nil
}

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "llm",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision validates the config and acquires the shared fleet. It starts no
// goroutines: validation-only runs provision apps and never start them.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	if a.StaleAfter == 0 {
		a.StaleAfter = 3
	}
	if a.PollInterval == 0 {
		a.PollInterval = caddy.Duration(2 * time.Second)
	}
	if a.PollTimeout == 0 {
		a.PollTimeout = caddy.Duration(min(time.Duration(a.PollInterval), 2*time.Second))
	}
	if a.IdleTTL == 0 {
		a.IdleTTL = caddy.Duration(10 * time.Minute)
	}
	if a.TokenizeTimeout == 0 {
		a.TokenizeTimeout = caddy.Duration(500 * time.Millisecond)
	}
	if a.TokenizeConcurrency == 0 {
		a.TokenizeConcurrency = 64
	}
	if a.TokenizeCacheSize == 0 {
		a.TokenizeCacheSize = 4096
	}
	if a.ResponsesTTL < 0 {
		return fmt.Errorf("responses_ttl must not be negative")
	}
	if a.ResponsesTTL == 0 {
		a.ResponsesTTL = caddy.Duration(fleet.DefaultResponseTTL)
	}
	cfg := a.fleetConfig()
	if err := cfg.Validate(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	for _, e := range a.Engines {
		e.APIKey = repl.ReplaceKnown(e.APIKey, "")
	}
	val, _, err := pool.LoadOrNew(fleetKey, func() (caddy.Destructor, error) {
		return sharedFleet{fleet.New(a.logger.Named("fleet"), fleet.Options{})}, nil
	})
	if err != nil {
		return fmt.Errorf("acquiring fleet state: %w", err)
	}
	a.fleet = val.(sharedFleet).Fleet
	if err := a.fleet.LoadTokenizers(&cfg); err != nil {
		return err
	}
	a.gen = a.fleet.NewGeneration(cfg, a.logger)
	registerMetrics(ctx.GetMetricsRegistry(), a.fleet, a.logger)
	return nil
}

// fleetConfig is the config the fleet follows while this generation runs.
func (a *App) fleetConfig() fleet.Config {
	return fleet.Config{
		PollInterval:           time.Duration(a.PollInterval),
		PollTimeout:            time.Duration(a.PollTimeout),
		StaleAfter:             a.StaleAfter,
		IdleTTL:                time.Duration(a.IdleTTL),
		ModelsInterval:         time.Duration(a.ModelsInterval),
		KVEventsPort:           a.KVEventsPort,
		KVReplayPort:           a.KVReplayPort,
		HashSeed:               a.HashSeed,
		HashAlgo:               a.HashAlgo,
		TokenizeTimeout:        time.Duration(a.TokenizeTimeout),
		TokenizeConcurrency:    a.TokenizeConcurrency,
		TokenizeCacheSize:      a.TokenizeCacheSize,
		SpeculativeTTL:         (*time.Duration)(a.SpeculativeTTL),
		Engines:                a.Engines,
		Tokenizers:             a.Tokenizers,
		TokenizerCheckSample:   a.TokenizerCheckSample,
		TokenizerMismatchLimit: a.TokenizerMismatchLimit,
		Aliases:                a.Aliases,
	}
}

// Start applies this config to the fleet: pollers and KV subscriptions start
// for new engines and stop for removed ones; engines that stay keep running.
func (a *App) Start() error {
	a.fleet.Start(a.gen)
	a.fleet.SetResponseTTL(time.Duration(a.ResponsesTTL))
	current.Store(a)
	return nil
}

// Stop leaves the fleet running: the next config generation (if any) has
// already applied itself, and the last Cleanup stops the workers. After a
// reload that failed once this generation started, the fleet goes back to
// the generation that keeps running.
func (a *App) Stop() error {
	current.CompareAndSwap(a, nil)
	if a.fleet != nil {
		a.fleet.Stop(a.gen)
	}
	return nil
}

// Cleanup releases this generation's reference on the fleet.
func (a *App) Cleanup() error {
	if a.fleet != nil {
		a.fleet.Cleanup(a.gen)
		_, err := pool.Delete(fleetKey)
		a.fleet = nil
		return err
	}
	return nil
}

// appFromContext returns the llm app of this config, provisioning it with
// defaults when the config has no `llm` block.
func appFromContext(ctx caddy.Context) (*App, error) {
	v, err := ctx.App("llm")
	if err != nil {
		return nil, fmt.Errorf("loading llm app: %w", err)
	}
	return v.(*App), nil
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
