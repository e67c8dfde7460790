package caddymodule

import (
	"errors"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/localtok"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Counters and histograms are package-level and re-registered into each
// config's registry (Caddy creates a registry per config context), so their
// values survive reloads — the pattern caddy-ratelimit and Caddy's own
// reverse_proxy use. Per-engine and per-queue gauges are read from the fleet
// at scrape time by fleetCollector, so removed engines disappear.
var (
	admittedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_admission_admitted_total",
		Help: "Requests admitted by llm_admission, by band and order: immediate (on arrival), fifo (after parking, in its band's turn), preferred (after parking, ahead of its turn: its prefix holder had room), aged (parked longer than aging, served first).",
	}, []string{"band", "order"})
	parkedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_admission_parked_total",
		Help: "Requests that had to park before admission, by band.",
	}, []string{"band"})
	parkSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "llmgw_admission_park_seconds",
		Help:    "Time parked requests waited in the admission queue, however parking ended, by band.",
		Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"band"})
	rejectedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_admission_rejected_total",
		Help: "Requests not admitted, by band and reason (queue_full, max_park, client_gone, state_unknown, model_not_found: no engine of the pool serves the model, answered 404; context_length: the prompt and its output budget exceed the model's max_model_len, answered 400).",
	}, []string{"band", "reason"})
	placedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_admission_placed_total",
		Help: "Requests admitted with a placement (pools routed by lb_policy llm), by reason: cache_hit (the prefix holder had room), cache_hit_wait (queued at the full holder), moved (a holder exists but another engine was cheaper: affinity broken), cold (no engine holds the prefix), fail_open.",
	}, []string{"reason"})
	failOpenTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "llmgw_admission_fail_open_total",
		Help: "Requests admitted because the engines' state was unknown or stale.",
	})
	ttftSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "llmgw_ttft_seconds",
		Help:    "Time to first token of streamed responses, from admission.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"model", "engine"})
	ttftErrorSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "llmgw_ttft_prediction_error_seconds",
		Help:    "Predicted minus observed time to first token of streamed responses routed by lb_policy llm, from dispatch to the engine: the routing cost model's calibration (negative: the engine was slower than predicted).",
		Buckets: []float64{-30, -10, -5, -2.5, -1, -.5, -.25, -.1, -.05, -.025, 0, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"engine"})
	itlSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "llmgw_itl_seconds",
		Help:    "Gaps between SSE data events of streamed responses.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"model", "engine"})
	tokensTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_tokens_total",
		Help: "Tokens reported in responses' usage, by kind (prompt, completion, cached).",
	}, []string{"kind"})
	responsesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_responses_total",
		Help: "Admitted requests by model, serving engine and outcome.",
	}, []string{"model", "engine", "outcome"})
	previousResponseTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_previous_response_total",
		Help: "Responses API requests with a previous_response_id, by outcome: pinned (sent to the engine that stored it), unknown (not recorded by this gateway: routed as any other), gone (its engine restarted or left: answered 404 as vLLM would).",
	}, []string{"outcome"})
	prefixDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_prefix_decisions_total",
		Help: "Routing decisions by tier (precise, approximate, cache_key, load_only) and outcome (hit, miss, overridden_by_load).",
	}, []string{"tier", "outcome"})
	prefixShare = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "llmgw_prefix_match_share",
		Help:    "Share of the prompt's blocks held by the chosen engine.",
		Buckets: []float64{0, .1, .25, .5, .75, .9, .99, 1},
	})
	tokenizeSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "llmgw_tokenize_duration_seconds",
		Help:    "Duration of /tokenize calls made for routing (cache hits excluded).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
	tokenizeCacheHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "llmgw_tokenize_cache_hits_total",
		Help: "Routing tokenizations answered from the cache.",
	})
	tokenizeFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "llmgw_tokenize_failures_total",
		Help: "Tokenizations that failed or timed out; those requests were routed on the approximate tier.",
	})
	tokenizeLocalSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "llmgw_tokenize_local_duration_seconds",
		Help:    "Duration of local tokenizations (chat template and tokenizer) made for routing.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
	})
	decisionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "llmgw_route_decision_duration_seconds",
		Help:    "Time lb_policy llm took to choose an upstream (tokenizing, index match, load), by tier.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5},
	}, []string{"tier"})
	multimodalPrompts = newMultimodalPrompts()
)

func collectors() []prometheus.Collector {
	return []prometheus.Collector{
		admittedTotal, parkedTotal, parkSeconds, rejectedTotal, placedTotal, failOpenTotal,
		ttftSeconds, ttftErrorSeconds, itlSeconds, tokensTotal, responsesTotal, previousResponseTotal,
		prefixDecisions, multimodalPrompts, prefixShare, tokenizeSeconds, tokenizeCacheHits, tokenizeFailures, tokenizeLocalSeconds, decisionSeconds,
	}
}

// observeTokenize counts a routing tokenization: a local one's duration,
// a failure, a cache hit, or the duration of a /tokenize call.
func observeTokenize(t fleet.TokenizeResult) {
	switch {
	case t.Local:
		tokenizeLocalSeconds.Observe(t.Took.Seconds())
	case !t.Called:
	case t.Err != nil:
		tokenizeFailures.Inc()
	case t.Cached:
		tokenizeCacheHits.Inc()
	default:
		tokenizeSeconds.Observe(t.Took.Seconds())
	}
}

// registerMetrics adds the llmgw collectors to a config's registry.
// Registering the same package-level collector twice into one registry (two
// apps cannot exist, but a retried provision can) is not an error.
func registerMetrics(reg *prometheus.Registry, f *fleet.Fleet, logger *zap.Logger) {
	if reg == nil {
		return
	}
	for _, c := range append(collectors(), &fleetCollector{f: f}) {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				logger.Error("registering metrics", zap.Error(err))
			}
		}
	}
}

var (
	descQueueDepth = prometheus.NewDesc("llmgw_admission_queue_depth",
		"Requests parked in admission queues, by band.", []string{"band"}, nil)
	descInflight = prometheus.NewDesc("llmgw_endpoint_inflight",
		"Requests in flight through this gateway per engine.", []string{"replica", "pool"}, nil)
	descWaiting = prometheus.NewDesc("llmgw_endpoint_waiting",
		"vllm:num_requests_waiting as last scraped.", []string{"replica", "pool"}, nil)
	descRunning = prometheus.NewDesc("llmgw_endpoint_running",
		"vllm:num_requests_running as last scraped.", []string{"replica", "pool"}, nil)
	descKVUsage = prometheus.NewDesc("llmgw_endpoint_kv_cache_usage",
		"vllm:kv_cache_usage_perc as last scraped (0-1).", []string{"replica", "pool"}, nil)
	descDrainRate = prometheus.NewDesc("llmgw_endpoint_drain_rate",
		"Observed completions per second per engine.", []string{"replica", "pool"}, nil)
	descStale = prometheus.NewDesc("llmgw_endpoint_metrics_stale",
		"1 when the engine's gauges are stale or unknown.", []string{"replica", "pool"}, nil)
	descAsleep = prometheus.NewDesc("llmgw_endpoint_asleep",
		"vLLM sleep level as last scraped from vllm:engine_sleep_state: 0 awake (or no such gauge), 1 weights offloaded, 2 discarded; an engine asleep gets no requests.", []string{"replica", "pool"}, nil)
	descSaturation = prometheus.NewDesc("llmgw_pool_saturation",
		"Share of a pool's engines with no free capacity, by the model the pool serves.", []string{"model"}, nil)
	descStaleTotal = prometheus.NewDesc("llmgw_engine_state_stale_total",
		"Transitions of engines from fresh to stale gauges.", nil, nil)
	descDegraded = prometheus.NewDesc("llmgw_observer_degraded",
		"Engines whose metrics could not be read or lack the expected series at start-up.", nil, nil)
	descBreaker = prometheus.NewDesc("llmgw_breaker_open",
		"1 while the replica's circuit breaker is open.", []string{"replica"}, nil)
	descKVEvents = prometheus.NewDesc("llmgw_kv_events_total",
		"KV-cache events received per engine, by type (llmgw_kv_events_unapplied_total counts those that changed nothing).", []string{"engine", "type"}, nil)
	descKVUnapplied = prometheus.NewDesc("llmgw_kv_events_unapplied_total",
		"KV-cache events per engine that changed nothing in the gateway's mirror, by reason: unknown_parent (the parent block was never seen and the engines' hashing is not configured), malformed, other_tier (a medium the gateway does not know), tier_unknown_block (an offload-tier block without token ids whose engine hash the mirror never saw), tier_overflow, unknown_type, decode_error (payloads), wrong_rank (batches of another data-parallel rank than the subscription's), remote (events of blocks in storage remote to the engine: locality REMOTE).", []string{"engine", "reason"}, nil)
	descKVOrphans = prometheus.NewDesc("llmgw_kv_orphan_blocks",
		"Engine block hashes kept from events whose parent the gateway never saw, awaiting a prompt that recognises them.", []string{"engine"}, nil)
	descKVRecognized = prometheus.NewDesc("llmgw_kv_recognized_blocks_total",
		"Blocks stored before the gateway saw their prefix, recognised in prompts by the engines' own hashes and taken into the mirror.", []string{"engine"}, nil)
	descKVTrusted = prometheus.NewDesc("llmgw_kv_trusted",
		"0 while most of the engine's recent KV events cannot be applied: routing weighs it on the approximate tier.", []string{"engine"}, nil)
	descKVBlocks = prometheus.NewDesc("llmgw_kv_index_blocks",
		"Blocks the gateway's mirror holds per engine.", []string{"engine"}, nil)
	descKVResyncs = prometheus.NewDesc("llmgw_kv_resyncs_total",
		"Mirror resets per engine, by reason.", []string{"engine", "reason"}, nil)
	descKVConnected = prometheus.NewDesc("llmgw_kv_connected",
		"1 while the gateway's KV-event subscription to the engine is connected.", []string{"engine"}, nil)
	descKVLag = prometheus.NewDesc("llmgw_kv_event_lag_seconds",
		"How late the engine's last KV-event batch was applied: its arrival minus the engine's timestamp on it.", []string{"engine"}, nil)
	descKVMismatch = prometheus.NewDesc("llmgw_kv_hash_mismatches_total",
		"BlockStored hashes that did not match the exact vLLM recomputation (wrong PYTHONHASHSEED or block size).", []string{"engine"}, nil)
	descTokLocal = prometheus.NewDesc("llmgw_tokenize_local_total",
		"Requests of models with a local tokenizer, by outcome: local (tokenized in the gateway), remote (only the engine can render it: own chat_template, images), failed (the local template or tokenizer failed), fallback (the model fell back after mismatches).", []string{"model", "outcome"}, nil)
	descTokChecks = prometheus.NewDesc("llmgw_tokenize_checks_total",
		"Local tokenizations checked against an engine's /tokenize, by result: checked (the engine answered), error (it did not), dropped (sampled while the checker was busy).", []string{"model", "result"}, nil)
	descTokMismatch = prometheus.NewDesc("llmgw_tokenize_mismatches_total",
		"Checked local tokenizations whose ids differed from the engine's.", []string{"model"}, nil)
	descTokFallback = prometheus.NewDesc("llmgw_tokenizer_fallback",
		"1 while a model's local tokenizer is set aside after mismatches (its requests ask the engines' /tokenize).", []string{"model"}, nil)
	descKVSpec = prometheus.NewDesc("llmgw_kv_speculative_blocks_total",
		"Speculative KV-index entries (engine, block) inserted, and ended by outcome: confirmed, expired, dropped.", []string{"outcome"}, nil)
)

// fleetCollector reads the fleet's live state at scrape time.
type fleetCollector struct{ f *fleet.Fleet }

// Describe implements prometheus.Collector.
func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueueDepth, descInflight, descWaiting, descRunning, descKVUsage,
		descDrainRate, descStale, descAsleep, descSaturation, descStaleTotal, descDegraded, descBreaker,
		descKVEvents, descKVUnapplied, descKVOrphans, descKVRecognized, descKVTrusted, descKVBlocks, descKVResyncs, descKVMismatch, descKVSpec, descKVConnected, descKVLag,
		descTokLocal, descTokChecks, descTokMismatch, descTokFallback} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.f
	for b, d := range f.QueueDepth() {
		ch <- prometheus.MustNewConstMetric(descQueueDepth, prometheus.GaugeValue, float64(d), admission.Band(b).String())
	}
	reg := f.Registry()
	for _, e := range reg.Engines() {
		collectEngine(ch, e)
	}
	for model, sat := range f.Saturation() {
		ch <- prometheus.MustNewConstMetric(descSaturation, prometheus.GaugeValue, sat, model)
	}
	ch <- prometheus.MustNewConstMetric(descStaleTotal, prometheus.CounterValue, float64(reg.StaleTransitions()))
	ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.GaugeValue, float64(reg.Degraded()))
	for dial, open := range f.BreakerOpen() {
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, boolGauge(open), dial)
	}
	collectKV(ch, f.Index().Stats())
	for outcome, n := range f.Index().PredictionStats().Outcomes() {
		ch <- prometheus.MustNewConstMetric(descKVSpec, prometheus.CounterValue, float64(n), outcome)
	}
	collectTokenizers(ch, f.TokenizerStats())
}

// collectTokenizers emits the local tokenizers' counters.
func collectTokenizers(ch chan<- prometheus.Metric, stats []localtok.Stats) {
	counter := func(d *prometheus.Desc, n uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(n), labels...)
	}
	for _, s := range stats {
		m := s.Model
		counter(descTokLocal, s.Local, m, "local")
		counter(descTokLocal, s.Remote, m, "remote")
		counter(descTokLocal, s.Failed, m, "failed")
		counter(descTokLocal, s.FellBackRequests, m, "fallback")
		counter(descTokChecks, s.Checked, m, "checked")
		counter(descTokChecks, s.CheckErrors, m, "error")
		counter(descTokChecks, s.Dropped, m, "dropped")
		counter(descTokMismatch, s.Mismatches, m)
		ch <- prometheus.MustNewConstMetric(descTokFallback, prometheus.GaugeValue, boolGauge(s.FellBack), m)
	}
}

// collectEngine emits one engine's gauges and accounting.
func collectEngine(ch chan<- prometheus.Metric, e *upstreams.Engine) {
	l := e.Load()
	dial, poolName := e.Dial(), e.Config().Pool
	if poolName == "" {
		poolName = upstreams.DefaultPool
	}
	ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(l.Inflight), dial, poolName)
	ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, l.Waiting, dial, poolName)
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, l.Running, dial, poolName)
	ch <- prometheus.MustNewConstMetric(descKVUsage, prometheus.GaugeValue, l.KVUsage, dial, poolName)
	ch <- prometheus.MustNewConstMetric(descDrainRate, prometheus.GaugeValue, l.DrainRate, dial, poolName)
	ch <- prometheus.MustNewConstMetric(descStale, prometheus.GaugeValue, boolGauge(!l.Known), dial, poolName)
	ch <- prometheus.MustNewConstMetric(descAsleep, prometheus.GaugeValue, float64(l.SleepLevel), dial, poolName)
}

// collectKV emits the per-engine KV metrics.
func collectKV(ch chan<- prometheus.Metric, stats []kvindex.MirrorStats) {
	sort.Slice(stats, func(i, j int) bool { return stats[i].Engine < stats[j].Engine })
	for _, s := range stats {
		e := s.Engine
		for typ, n := range map[string]uint64{"stored": s.Stored, "removed": s.Removed, "cleared": s.Cleared, "unknown": s.Unknown} {
			ch <- prometheus.MustNewConstMetric(descKVEvents, prometheus.CounterValue, float64(n), e, typ)
		}
		for reason, n := range s.Unapplied() {
			ch <- prometheus.MustNewConstMetric(descKVUnapplied, prometheus.CounterValue, float64(n), e, reason)
		}
		ch <- prometheus.MustNewConstMetric(descKVOrphans, prometheus.GaugeValue, float64(s.Orphans), e)
		ch <- prometheus.MustNewConstMetric(descKVRecognized, prometheus.CounterValue, float64(s.Recognized), e)
		ch <- prometheus.MustNewConstMetric(descKVTrusted, prometheus.GaugeValue, boolGauge(s.Trusted), e)
		ch <- prometheus.MustNewConstMetric(descKVBlocks, prometheus.GaugeValue, float64(s.Blocks), e)
		for reason, n := range s.Resyncs {
			ch <- prometheus.MustNewConstMetric(descKVResyncs, prometheus.CounterValue, float64(n), e, reason)
		}
		ch <- prometheus.MustNewConstMetric(descKVMismatch, prometheus.CounterValue, float64(s.Verify.Mismatched), e)
		ch <- prometheus.MustNewConstMetric(descKVConnected, prometheus.GaugeValue, boolGauge(s.Connected), e)
		if s.LastLag != 0 {
			ch <- prometheus.MustNewConstMetric(descKVLag, prometheus.GaugeValue, s.LastLag.Seconds(), e)
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// observeMultimodal counts a routed prompt with media by how its media
// were keyed (fleet.Decision.Multimodal: "" for a text prompt).
func observeMultimodal(how string) {
	switch {
	case how == "":
	case strings.HasPrefix(how, "keyed"):
		multimodalPrompts.WithLabelValues("keyed").Inc()
	default:
		multimodalPrompts.WithLabelValues("text").Inc()
	}
}

// newMultimodalPrompts is llmgw_multimodal_prompts_total with both of its
// series at 0, so that a gateway without image traffic shows them too.
func newMultimodalPrompts() *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmgw_multimodal_prompts_total",
		Help: "Routed prompts with media parts, by how their media entered the block keys: keyed (matched past them) or text (matched up to the first item: an http(s) image without uuid, no image_token_id, audio or video).",
	}, []string{"keys"})
	v.WithLabelValues("keyed")
	v.WithLabelValues("text")
	return v
}
