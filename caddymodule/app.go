package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/upstreams"
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
// Engines used by a handler or policy but not listed here (dynamic upstreams)
// are registered automatically with defaults derived from the dial address
// and garbage-collected when unused.
//
// EXPERIMENTAL: Subject to change.
type App struct {
	// How often each engine's /metrics is scraped. Default: 2s.
	PollInterval caddy.Duration `json:"poll_interval,omitempty"`

	// Deadline of one scrape. Default: the poll interval, at most 2s.
	PollTimeout caddy.Duration `json:"poll_timeout,omitempty"`

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

	// The engines' PYTHONHASHSEED. When set, a sample of BlockStored events is
	// re-hashed exactly as vLLM does (sha256_cbor) and mismatches are exposed,
	// so a misconfigured seed or block size is visible. Default: unset (no
	// verification; routing does not depend on the seed).
	HashSeed *string `json:"hash_seed,omitempty"`

	// Dynamic engines unused for this long are removed. Default: 10m.
	IdleTTL caddy.Duration `json:"idle_ttl,omitempty"`

	// Deadline of a /tokenize call made by the selection policy; on timeout
	// the request is routed on the approximate tier. Default: 500ms.
	TokenizeTimeout caddy.Duration `json:"tokenize_timeout,omitempty"`

	// At most this many /tokenize calls in flight; more fall back to the
	// approximate tier. Default: 64.
	TokenizeConcurrency int `json:"tokenize_concurrency,omitempty"`

	// Entries of the tokenize cache (keyed by a hash of the tokenize input).
	// Default: 4096.
	TokenizeCacheSize int `json:"tokenize_cache_size,omitempty"`

	// The engines this gateway knows in advance. Others are discovered.
	Engines []*EngineConfig `json:"engines,omitempty"`

	fleet   *fleet
	logger  *zap.Logger
	prevLog *zap.Logger // the fleet's logger before Start, restored by Stop
	prevApp *App        // the generation this one replaced, restored by Stop after a failed reload
}

// EngineConfig describes one vLLM engine (one data-parallel rank), keyed by
// the address reverse_proxy dials for it.
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

	// Pool name shown in metrics and the admin API. Default: "default".
	Pool string `json:"pool,omitempty"`
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
	if err := a.validate(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	for _, e := range a.Engines {
		e.APIKey = repl.ReplaceKnown(e.APIKey, "")
	}
	val, _, err := pool.LoadOrNew(fleetKey, func() (caddy.Destructor, error) {
		return newFleet(a.logger.Named("fleet")), nil
	})
	if err != nil {
		return fmt.Errorf("acquiring fleet state: %w", err)
	}
	a.fleet = val.(*fleet)
	registerMetrics(ctx.GetMetricsRegistry(), a.fleet, a.logger)
	return nil
}

func (a *App) validate() error {
	if a.StaleAfter < 0 {
		return fmt.Errorf("stale_after must be positive, got %d", a.StaleAfter)
	}
	if a.PollInterval < 0 || a.PollTimeout < 0 || a.IdleTTL < 0 || a.TokenizeTimeout < 0 {
		return fmt.Errorf("durations must be positive")
	}
	for _, p := range []int{a.KVEventsPort, a.KVReplayPort} {
		if p < 0 || p > 65535 {
			return fmt.Errorf("port %d out of range", p)
		}
	}
	seen := map[string]bool{}
	for i, e := range a.Engines {
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
		if e.MaxInflight < 0 {
			return fmt.Errorf("engine %q: max_inflight must not be negative", e.Dial)
		}
		for _, ep := range []string{e.KVEvents, e.KVReplay} {
			if ep != "" && !strings.HasPrefix(ep, "tcp://") {
				return fmt.Errorf("engine %q: ZeroMQ endpoint %q must be tcp://host:port", e.Dial, ep)
			}
		}
	}
	return nil
}

// Start applies this config to the fleet: pollers and KV subscriptions start
// for new engines and stop for removed ones; engines that stay keep running.
func (a *App) Start() error {
	a.prevLog = a.fleet.logBase.Swap(a.logger)
	a.prevApp = a.fleet.startGeneration(a)
	current.Store(a)
	return nil
}

// Stop leaves the fleet running: the next config generation (if any) has
// already applied itself, and the last Cleanup stops the workers.
func (a *App) Stop() error {
	current.CompareAndSwap(a, nil)
	// A reload that failed after this Start: the fleet logs through, and
	// follows the config of, the generation that keeps running again.
	if a.fleet != nil {
		if a.prevLog != nil {
			a.fleet.logBase.CompareAndSwap(a.logger, a.prevLog)
		}
		a.fleet.stopGeneration(a, a.prevApp)
	}
	return nil
}

// Cleanup releases this generation's reference on the fleet.
func (a *App) Cleanup() error {
	if a.fleet != nil {
		a.fleet.cleanupGeneration(a)
		_, err := pool.Delete(fleetKey)
		a.fleet = nil
		return err
	}
	return nil
}

// engineConfigs turns the app config into the registry's view; the KV
// subscription rides in Attrs so that changing it restarts the subscriber.
func (a *App) engineConfigs() []upstreams.EngineConfig {
	out := make([]upstreams.EngineConfig, 0, len(a.Engines))
	for _, e := range a.Engines {
		kc := kvConfig{Endpoint: e.KVEvents, Bind: e.KVEventsBind, Replay: e.KVReplay, Topic: e.KVTopic}
		if kc.Endpoint == "" {
			kc.Endpoint = derivedEndpoint(e.Dial, a.KVEventsPort)
		}
		if kc.Replay == "" {
			kc.Replay = derivedEndpoint(e.Dial, a.KVReplayPort)
		}
		out = append(out, upstreams.EngineConfig{
			Dial:        e.Dial,
			MetricsURL:  e.Metrics,
			TokenizeURL: e.Tokenize,
			MaxInflight: e.MaxInflight,
			Header:      bearer(e.APIKey),
			Pool:        e.Pool,
			Static:      true,
			Attrs:       kc.attrs(),
		})
	}
	return out
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
