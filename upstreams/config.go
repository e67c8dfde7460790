package upstreams

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
)

// EngineConfig describes one engine (one upstream dial address). Zero fields
// take the defaults documented per field.
type EngineConfig struct {
	// Dial is the upstream dial address "host:port" (as reverse_proxy dials it);
	// it is the registry key and is used verbatim (no DNS or case folding).
	Dial string
	// MetricsURL is the Prometheus endpoint; default "http://<Dial>/metrics".
	MetricsURL string
	// TokenizeURL is the engine's /tokenize endpoint; default
	// "http://<Dial>/tokenize". This package does not call it itself; it is
	// carried for the policy, which passes it to [Tokenizer.Tokenize].
	TokenizeURL string
	// ModelsURL is the engine's OpenAI model list, fetched every
	// [Options.ModelsInterval] to learn what it serves ([Engine.Models]).
	// Default: /v1/models on the MetricsURL's scheme, host and path prefix
	// (the path before a trailing "/metrics"), without its query; it is
	// fetched with Header, like the metrics.
	ModelsURL string
	// Models are the model names the engine serves, for when it does not
	// tell: they are used while no fetch of ModelsURL has succeeded (the
	// engine answers it 404, or has not answered yet). Names the engine
	// lists win, being what it actually answers to. A change applies in
	// place. Default: none.
	Models []string
	// MaxInflight is the admission limit on running+waiting+dispatched
	// requests. 0 means "unknown": [Engine.Free] then imposes no request-count
	// limit and admission relies on the KV-usage limit only.
	MaxInflight int
	// Header holds extra headers for metrics (and, via the caller, tokenize)
	// calls, e.g. "Authorization: Bearer <engine API key>". Never logged.
	Header http.Header
	// Pool is the pool name shown in metrics and the admin API; "" = "default".
	Pool string
	// Static is true for configured engines and false for engines discovered
	// at run time through [Registry.Ensure], which are garbage-collected when
	// unused. [Registry.Apply] sets it to true for every config it is given.
	Static bool
	// EngineLabel, when set, makes this engine one data-parallel rank of
	// the server at MetricsURL: its gauges are read from the series whose
	// `engine` label has this value (vLLM labels each rank's series with
	// its index), and from those without the label. Default: "", every
	// series (the ranks behind one address summed, as [Load] describes).
	EngineLabel string
	// Attrs are opaque attributes for [Options.Worker] (for example the
	// engine's KV-event endpoint). This package does not interpret them, but a
	// change restarts the engine's poller and worker like any other change.
	Attrs map[string]string
}

// DefaultPool is the pool name used when [EngineConfig.Pool] is empty.
const DefaultPool = "default"

// withDefaults fills the derived defaults.
func (c EngineConfig) withDefaults() EngineConfig {
	if c.MetricsURL == "" {
		c.MetricsURL = "http://" + c.Dial + "/metrics"
	}
	if c.TokenizeURL == "" {
		c.TokenizeURL = "http://" + c.Dial + "/tokenize"
	}
	if c.ModelsURL == "" {
		c.ModelsURL = defaultModelsURL(c.MetricsURL)
	}
	if c.Pool == "" {
		c.Pool = DefaultPool
	}
	if c.MaxInflight < 0 {
		c.MaxInflight = 0
	}
	return c
}

// Validate reports whether the config is usable: a non-empty dial address and
// http(s) URLs. [Registry.Apply] skips (and logs) configs that fail it, so
// callers should validate at provisioning time to report errors early.
func (c EngineConfig) Validate() error {
	if strings.TrimSpace(c.Dial) == "" {
		return errors.New("engine: empty dial address")
	}
	if c.MaxInflight < 0 {
		return fmt.Errorf("engine %s: negative max_inflight %d", c.Dial, c.MaxInflight)
	}
	if err := validateModelNames(c.Models); err != nil {
		return fmt.Errorf("engine %s: %w", c.Dial, err)
	}
	d := c.withDefaults()
	for _, u := range []string{d.MetricsURL, d.TokenizeURL, d.ModelsURL} {
		pu, err := url.Parse(u)
		if err != nil {
			return fmt.Errorf("engine %s: bad URL: %w", c.Dial, err)
		}
		if (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("engine %s: URL %q must be absolute http(s)", c.Dial, u)
		}
	}
	return nil
}

// validateModelNames checks configured model names: non-empty, without
// surrounding blanks, each once, within the bounds of a discovered list.
func validateModelNames(names []string) error {
	if len(names) > maxServedModels {
		return fmt.Errorf("%d models, at most %d", len(names), maxServedModels)
	}
	for i, n := range names {
		switch {
		case n == "" || strings.TrimSpace(n) != n:
			return fmt.Errorf("model name %q is empty or has surrounding blanks", n)
		case len(n) > maxModelIDLength:
			return fmt.Errorf("model name of %d bytes, at most %d", len(n), maxModelIDLength)
		case slices.Contains(names[:i], n):
			return fmt.Errorf("model %q is listed twice", n)
		}
	}
	return nil
}

// clone deep-copies the reference fields so callers cannot mutate our copy.
func (c EngineConfig) clone() EngineConfig {
	c.Header = c.Header.Clone()
	c.Models = slices.Clone(c.Models)
	if c.Attrs != nil {
		c.Attrs = maps.Clone(c.Attrs)
	}
	return c
}

// needsRestart reports whether moving from a to b must restart the engine's
// poller and worker. MaxInflight, Models and Static are read live and need
// no restart.
func needsRestart(a, b EngineConfig) bool {
	return a.MetricsURL != b.MetricsURL || a.EngineLabel != b.EngineLabel || a.TokenizeURL != b.TokenizeURL || a.ModelsURL != b.ModelsURL ||
		a.Pool != b.Pool || !headersEqual(a.Header, b.Header) || !maps.Equal(a.Attrs, b.Attrs)
}

func headersEqual(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb, ok := b[k]
		if !ok || !slices.Equal(va, vb) {
			return false
		}
	}
	return true
}

// Options tunes a [Registry]. Zero fields take the documented defaults.
// Everything except Worker can be changed by [Registry.Apply].
type Options struct {
	// PollInterval is the time between scrapes of one engine; default 2s.
	// Each poller adds up to 10% random jitter so pollers do not synchronise.
	PollInterval time.Duration
	// PollTimeout bounds one scrape (connect, headers and body); default
	// PollInterval clamped to [1s, 10s].
	PollTimeout time.Duration
	// ModelsInterval is the time between fetches of one engine's
	// /v1/models ([EngineConfig.ModelsURL]). What an engine serves changes
	// only when it restarts or loads an adapter, so this is much slower
	// than PollInterval; a poller also fetches at its first successful
	// scrape, after a scrape shows the engine restarted or recovered from
	// staleness, and, after a failed fetch, sooner (from PollInterval,
	// doubling). Fetches follow successful scrapes only: an engine whose
	// metrics cannot be read is not asked. A negative value turns
	// discovery off (the configured [EngineConfig.Models] only). A change
	// applies from each engine's next fetch. Default: 30s.
	ModelsInterval time.Duration
	// StaleAfter is the number of consecutive failed polls after which an
	// engine's gauges are considered stale (unknown); default 3.
	StaleAfter int
	// MaxMetricsBytes limits the (decompressed) /metrics response; a larger
	// page fails the scrape. Default 4 MiB.
	MaxMetricsBytes int64
	// IdleTTL is how long a dynamic engine may go unused (no Ensure, no
	// Reserve, nothing in flight) before it is removed; default 10m.
	IdleTTL time.Duration
	// Client makes the scrapes; default a dedicated client with dial and
	// header timeouts (its idle connections are closed by [Registry.Close]).
	Client *http.Client
	// Logger receives poll diagnostics; default a no-op logger.
	Logger *zap.Logger
	// OnUpdate, if set, is called (without locks held) with the engine's dial
	// after every poll result, success or failure, and after every
	// [Reservation.Done] or [Reservation.Move]: the admission gate uses it to
	// wake parked requests. It must not block.
	OnUpdate func(dial string)
	// OnRestart, if set, is called (without locks held, before that
	// scrape's OnUpdate) with the engine's dial after a successful scrape
	// whose cumulative prefill counters are lower than the previous
	// one's: the engine restarted (or lost a rank) in between, so what
	// its requests then in flight met was the previous process. It must
	// not block.
	OnRestart func(dial string)
	// OnSleep, if set, is called (without locks held, before that
	// scrape's OnUpdate) with the engine's dial when a successful scrape
	// finds it gone to sleep (asleep true: vllm:engine_sleep_state shows
	// no rank awake) or woken from it (asleep false). An engine asleep has
	// discarded its KV cache, possibly without an AllBlocksCleared event.
	// It must not block.
	OnSleep func(dial string, asleep bool)
	// Worker, if set, is an extra per-engine goroutine (the KV-event
	// subscriber). It is started with the engine's poller and stopped — its
	// context cancelled and its return awaited — when the engine is removed,
	// when its config changes (then restarted with the new config) and on
	// [Registry.Close]. It must return promptly once ctx is done; if it
	// returns early it is not restarted until the next config change. It must
	// not call [Registry.Apply] or [Registry.Close]. Only the value given to
	// [NewRegistry] is used: Apply ignores this field.
	Worker func(ctx context.Context, e *Engine)
	// ManualScrape runs no pollers: the caller scrapes each engine itself
	// through [Engine.StartScrape]. The fleet simulation uses it, which
	// keeps its own clock and whose engines have no /metrics to fetch.
	// Only the value given to [NewRegistry] is used.
	ManualScrape bool
	// Now is the clock of the engines' drain rates, scrape times and idle
	// times, so a simulation on its own clock sees rates in its time and a
	// test can age a dynamic engine without sleeping; default
	// time.Now. The registry's own goroutines call it too (the idle
	// collection), so it must be safe for concurrent use. Only the value
	// given to [NewRegistry] is used.
	Now func() time.Time
}

// Option defaults.
const (
	DefaultPollInterval    = 2 * time.Second
	DefaultModelsInterval  = 30 * time.Second
	DefaultStaleAfter      = 3
	DefaultMaxMetricsBytes = 4 << 20
	DefaultIdleTTL         = 10 * time.Minute
)

func (o Options) withDefaults() Options {
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.PollTimeout <= 0 {
		o.PollTimeout = min(max(o.PollInterval, time.Second), 10*time.Second)
	}
	if o.ModelsInterval == 0 {
		o.ModelsInterval = DefaultModelsInterval
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	if o.MaxMetricsBytes <= 0 {
		o.MaxMetricsBytes = DefaultMaxMetricsBytes
	}
	if o.IdleTTL <= 0 {
		o.IdleTTL = DefaultIdleTTL
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}
