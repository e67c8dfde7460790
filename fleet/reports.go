package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/localtok"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// EngineReport is one engine in GET /llm/engines.
type EngineReport struct {
	Dial string `json:"dial"`
	// Address and Rank are set for a data-parallel rank (Dial is then
	// "<address>#<rank>"): the address reverse_proxy dials and the rank
	// sent in the X-data-parallel-rank header.
	Address    string    `json:"address,omitempty"`
	Rank       *int      `json:"data_parallel_rank,omitempty"`
	Pool       string    `json:"pool"`
	Static     bool      `json:"configured"`
	Known      bool      `json:"gauges_known"`
	Stale      bool      `json:"stale"`
	Degraded   bool      `json:"degraded"`
	Running    float64   `json:"running"`
	Waiting    float64   `json:"waiting"`
	KVUsage    float64   `json:"kv_cache_usage"`
	BlockSize  int       `json:"block_size,omitempty"`
	GPUBlocks  int       `json:"num_gpu_blocks,omitempty"`
	ScrapedAt  time.Time `json:"scraped_at,omitzero"`
	AgeSeconds float64   `json:"gauges_age_seconds"`
	Failures   int       `json:"failed_polls"`
	LastError  string    `json:"last_error,omitempty"`
	Inflight   int64     `json:"local_inflight"`
	Dispatched int64     `json:"dispatched_since_scrape"`
	Finished   int64     `json:"finished_since_scrape"`
	MaxInfl    int       `json:"max_inflight"`
	DrainRate  float64   `json:"drain_rate"`
	// PrefillRate is the engine's prefill speed derived from its counters
	// (uncached prompt tokens/s; 0 until known); Occupied how much longer
	// a long prompt's prefill holds it (see Placement.Reserve).
	PrefillRate float64 `json:"prefill_rate"`
	Occupied    float64 `json:"occupied_seconds"`
	// StepSeconds is the engine's mean scheduler step (0 until known;
	// see upstreams.Load.StepTime); ScrapeLeadSeconds how long before
	// each scrape its accounting epoch begins (upstreams.Load.ScrapeLead).
	StepSeconds       float64 `json:"step_seconds"`
	ScrapeLeadSeconds float64 `json:"scrape_lead_seconds"`
	Drained           bool    `json:"drained"`
	// Asleep: the engine's vllm:engine_sleep_state shows it in vLLM's
	// sleep mode, at SleepLevel (1: weights offloaded, 2: discarded); it
	// takes no requests until a scrape finds it awake.
	Asleep     bool      `json:"asleep"`
	SleepLevel int       `json:"sleep_level,omitempty"`
	Breaker    string    `json:"breaker"`
	KV         *KVReport `json:"kv"`
	// Tokenizer is the local tokenizer of the model the engine's pool
	// serves (the model last seen in its requests), with its checks
	// against the engines; nil when that model is tokenized remotely.
	Tokenizer *localtok.Stats `json:"tokenizer,omitempty"`
	// Models is what the engine serves (upstreams.Engine.Models): its
	// /v1/models as last fetched ("discovered" ModelsSource), else its
	// configured names ("configured"); null while unknown, [] for an
	// engine that lists nothing. ModelsError is the last fetch's error,
	// the list then being the last good one; ModelsUnavailable says the
	// engine does not serve /v1/models.
	Models            []ModelReport `json:"models"`
	ModelsSource      string        `json:"models_source,omitempty"`
	ModelsLearnedAt   time.Time     `json:"models_learned_at,omitzero"`
	ModelsError       string        `json:"models_error,omitempty"`
	ModelsUnavailable bool          `json:"models_unavailable,omitempty"`
	// LoRA is the adapters with requests in flight on the engine, from
	// its vllm:lora_requests_info; nil when its last scrape had none (LoRA
	// off, or the gauges unknown).
	LoRA *LoRAReport `json:"lora,omitempty"`
}

// ModelReport is one model an engine serves: a base model (no parent) or
// a LoRA adapter on top of its parent.
type ModelReport struct {
	ID          string `json:"id"`
	Parent      string `json:"parent,omitempty"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
}

// LoRAReport is an engine's LoRA state as its metrics tell it: the
// adapters with running and waiting requests (not every loaded adapter)
// and its --max-loras (0 when not exported).
type LoRAReport struct {
	MaxLoRA   int      `json:"max_lora"`
	Running   []string `json:"running"`
	Waiting   []string `json:"waiting"`
	Truncated bool     `json:"truncated,omitempty"`
}

// KVReport is an engine's KV subscription and mirror.
type KVReport struct {
	Endpoint     string    `json:"endpoint"`
	Mode         string    `json:"mode"`
	Replay       string    `json:"replay,omitempty"`
	Subscribed   bool      `json:"subscribed"`
	Connected    bool      `json:"connected"`
	Sessions     uint64    `json:"sessions"`
	DialErrors   uint64    `json:"dial_errors"`
	Dropped      uint64    `json:"dropped_messages"`
	LastError    string    `json:"last_error,omitempty"`
	LastSeq      *uint64   `json:"last_seq"`
	LastMessage  time.Time `json:"last_message,omitzero"`
	Blocks       int       `json:"blocks"`
	Capacity     int       `json:"capacity"`
	Stored       uint64    `json:"stored_events"`
	Removed      uint64    `json:"removed_events"`
	Cleared      uint64    `json:"cleared_events"`
	Unknown      uint64    `json:"unknown_events"`
	DecodeErrors uint64    `json:"decode_errors"`
	// Unapplied counts events that changed nothing, by reason
	// (kvindex.MirrorStats.Unapplied); RemovedUnknown, removals of blocks
	// the mirror did not hold (normal for blocks stored before the
	// subscription).
	Unapplied      map[string]uint64 `json:"unapplied_events"`
	RemovedUnknown uint64            `json:"removed_unknown_blocks"`
	// OrphanBlocks are engine hashes kept from events whose parent the
	// gateway never saw, awaiting a prompt that recognises them;
	// OrphanEvents counts such events, RecognizedBlocks the blocks
	// prompts recognised (see hash_seed and hash_algo).
	// TierBlocks is how many blocks the engine's offload tiers hold, by
	// tier ("cpu", "storage"), from events whose medium names them; Blocks
	// counts its GPU cache.
	TierBlocks       map[string]int `json:"tier_blocks"`
	OrphanBlocks     int            `json:"orphan_blocks"`
	OrphanEvents     uint64         `json:"orphan_events"`
	RecognizedBlocks uint64         `json:"recognized_blocks"`
	// Backfilled is how many buffered messages the replay endpoint gave
	// the subscription when it started (FeedConfig.Backfill).
	Backfilled uint64 `json:"backfilled_messages"`
	// Trusted is false while most recent events could not be applied:
	// routing then weighs the engine on the approximate tier.
	Trusted          bool              `json:"trusted"`
	Resyncs          map[string]uint64 `json:"resyncs"`
	LastResync       time.Time         `json:"last_resync,omitzero"`
	LastResyncReason string            `json:"last_resync_reason,omitempty"`
	Verify           VerifyReport      `json:"hash_verification"`
}

// VerifyReport is the hash verification state of an engine's mirror.
type VerifyReport struct {
	Enabled        bool      `json:"enabled"`
	Checked        uint64    `json:"checked"`
	Verified       uint64    `json:"verified"`
	Mismatched     uint64    `json:"mismatched"`
	Skipped        uint64    `json:"skipped"`
	LastMismatch   string    `json:"last_mismatch,omitempty"`
	LastMismatchAt time.Time `json:"last_mismatch_at,omitzero"`
}

// EngineReports describes every engine the registry knows.
func (f *Fleet) EngineReports() []EngineReport {
	now := time.Now()
	b := f.Breaker()
	toks := f.tokenizerByPool()
	var out []EngineReport
	for _, e := range f.registry.Engines() {
		l, c := e.Load(), e.Config()
		r := EngineReport{
			Dial: e.Dial(), Pool: c.Pool, Static: c.Static,
			Known: l.Known, Stale: l.Stale, Degraded: l.Degraded,
			Running: l.Running, Waiting: l.Waiting, KVUsage: l.KVUsage,
			BlockSize: l.BlockSize, GPUBlocks: l.NumGPUBlocks,
			ScrapedAt: l.ScrapedAt, AgeSeconds: l.Age.Seconds(),
			Failures: l.Failures, LastError: l.LastError,
			Inflight: l.Inflight, Dispatched: l.Dispatched, Finished: l.Finished, MaxInfl: l.MaxInflight,
			DrainRate: l.DrainRate, Drained: f.IsDrained(e.Dial()),
			Asleep: l.Asleep, SleepLevel: l.SleepLevel,
			PrefillRate: l.PrefillRate, Occupied: l.Occupied.Seconds(),
			StepSeconds: l.StepTime.Seconds(), ScrapeLeadSeconds: l.ScrapeLead.Seconds(),
			Breaker: b.State(e.Dial(), now),
		}
		if r.Pool == "" {
			r.Pool = upstreams.DefaultPool
		}
		if rk, ok := f.RankOf(e.Dial()); ok {
			r.Address, r.Rank = rk.Dial, &rk.Index
		}
		r.KV = f.kvReport(e.Dial())
		r.Tokenizer = toks[r.Pool]
		servedReport(e, &r)
		out = append(out, r)
	}
	return out
}

// servedReport fills the engine's models and LoRA state into r.
func servedReport(e *upstreams.Engine, r *EngineReport) {
	m := e.Models()
	if m.List != nil {
		r.Models = make([]ModelReport, len(m.List))
		for i, sm := range m.List {
			r.Models[i] = ModelReport{ID: sm.ID, Parent: sm.Parent, MaxModelLen: sm.MaxModelLen}
		}
		r.ModelsSource = "discovered"
		if m.Configured {
			r.ModelsSource = "configured"
		}
	}
	r.ModelsLearnedAt, r.ModelsError, r.ModelsUnavailable = m.LearnedAt, m.Error, m.Unavailable
	if l := e.LoRA(); l.Known {
		r.LoRA = &LoRAReport{MaxLoRA: l.MaxLoRA, Running: orEmpty(l.Running), Waiting: orEmpty(l.Waiting), Truncated: l.Truncated}
	}
}

// orEmpty is s, or an empty list for nil, so JSON shows [] rather than null.
func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// tokenizerByPool maps each pool to the stats of the local tokenizer of
// the model it serves: the model's own, else the AnyModel entry's.
func (f *Fleet) tokenizerByPool() map[string]*localtok.Stats {
	stats := f.TokenizerStats()
	if len(stats) == 0 {
		return nil
	}
	byModel := make(map[string]*localtok.Stats, len(stats))
	for i := range stats {
		byModel[stats[i].Model] = &stats[i]
	}
	out := make(map[string]*localtok.Stats)
	f.mu.Lock()
	defer f.mu.Unlock()
	for pool, model := range f.poolModels {
		if s := byModel[model]; s != nil {
			out[pool] = s
		} else if s := byModel[localtok.AnyModel]; s != nil {
			out[pool] = s
		}
	}
	return out
}

func (f *Fleet) kvReport(dial string) *KVReport {
	f.mu.Lock()
	s := f.subs[dial]
	f.mu.Unlock()
	if s == nil {
		return nil
	}
	st := s.sub.Stats()
	r := &KVReport{
		Endpoint: s.cfg.Endpoint, Mode: "connect", Replay: s.cfg.Replay,
		Subscribed: true, Connected: st.Connected, Sessions: st.Sessions,
		DialErrors: st.DialErrors, Dropped: st.Dropped, LastError: st.LastError,
	}
	if s.cfg.Bind {
		r.Mode = "bind"
	}
	if m := f.index.Mirror(dial); m != nil {
		r.fillMirror(m.Stats())
	}
	return r
}

// fillMirror fills the report's mirror figures from ms.
func (r *KVReport) fillMirror(ms kvindex.MirrorStats) {
	// Live as routing sees it: the mirror follows the engine from the
	// Feed's Connected on, a moment after the subscriber's session
	// began.
	r.Connected = ms.Connected
	if ms.HasSeq {
		seq := ms.LastSeq
		r.LastSeq = &seq
	}
	r.LastMessage = ms.LastMessage
	r.Blocks, r.Capacity = ms.Blocks, ms.Capacity
	r.TierBlocks = map[string]int{kvindex.TierCPU.String(): ms.TierBlocks[kvindex.TierCPU],
		kvindex.TierStorage.String(): ms.TierBlocks[kvindex.TierStorage]}
	r.Stored, r.Removed, r.Cleared, r.Unknown = ms.Stored, ms.Removed, ms.Cleared, ms.Unknown
	r.DecodeErrors = ms.DecodeErrors
	r.Unapplied, r.RemovedUnknown = ms.Unapplied(), ms.RemovedUnknown
	r.OrphanBlocks, r.OrphanEvents, r.RecognizedBlocks = ms.Orphans, ms.OrphanEvents, ms.Recognized
	r.Backfilled = ms.Backfilled
	r.Trusted = ms.Trusted
	r.Resyncs, r.LastResync, r.LastResyncReason = ms.Resyncs, ms.LastResync, ms.LastResyncReason
	v := ms.Verify
	r.Verify = VerifyReport{Enabled: v.Enabled, Checked: v.Checked, Verified: v.Verified,
		Mismatched: v.Mismatched, Skipped: v.Skipped, LastMismatch: v.LastMismatch, LastMismatchAt: v.LastMismatchAt}
}

// BandReport is one band of a pool's admission queue in GET /llm/queue.
type BandReport struct {
	Depth      int     `json:"depth"`
	OldestWait float64 `json:"oldest_wait_seconds"`
	Admitted   uint64  `json:"admitted"`
	Parked     uint64  `json:"parked"`
	Aged       uint64  `json:"aged"`      // admitted through aging
	Preferred  uint64  `json:"preferred"` // admitted ahead of their turn: their prefix holder had room
}

// QueueReports describes every pool's admission queue, by band name.
func (f *Fleet) QueueReports() map[string]map[string]BandReport {
	out := map[string]map[string]BandReport{}
	for name, g := range f.Gates() {
		st := g.Stats()
		bands := map[string]BandReport{}
		for b := range admission.NumBands {
			bands[admission.Band(b).String()] = BandReport{
				Depth:      st.Depth[b],
				OldestWait: st.OldestWait[b].Seconds(),
				Admitted:   st.Admitted[b],
				Parked:     st.Parked[b],
				Aged:       st.Aged[b],
				Preferred:  st.Preferred[b],
			}
		}
		out[name] = bands
	}
	return out
}

// QueueDepth is the number of requests parked in every pool's gate, by
// band.
func (f *Fleet) QueueDepth() [admission.NumBands]int {
	var depth [admission.NumBands]int
	for _, g := range f.gateList() {
		st := g.Stats()
		for b := range depth {
			depth[b] += st.Depth[b]
		}
	}
	return depth
}

// Saturation is, per pool's model, the share of its engines without room
// under the default admission limits (an engine asleep has none).
func (f *Fleet) Saturation() map[string]float64 {
	f.mu.Lock()
	pools := make(map[string]string, len(f.poolModels))
	for p, m := range f.poolModels {
		pools[p] = m
	}
	f.mu.Unlock()
	out := make(map[string]float64, len(pools))
	for p, model := range pools {
		dials := f.PoolDials(p)
		if len(dials) == 0 {
			continue
		}
		full := 0
		for _, d := range dials {
			e, ok := f.registry.Get(d)
			if !ok {
				continue
			}
			if l := e.Load(); l.Known && (l.Asleep || engineFree(l, Limits{KV: 0.9}) <= 0) {
				full++
			}
		}
		out[model] = float64(full) / float64(len(dials))
	}
	return out
}

// BreakerOpen reports, for every registered engine, whether its circuit
// breaker is open.
func (f *Fleet) BreakerOpen() map[string]bool {
	now := time.Now()
	b := f.Breaker()
	out := make(map[string]bool)
	for _, e := range f.registry.Engines() {
		out[e.Dial()] = b.State(e.Dial(), now) == routing.StateOpen
	}
	return out
}

// ErrNoEngines is Explain's answer for a pool with no engines yet.
var ErrNoEngines = errors.New("pool has no engines yet")

// Explanation is a routing decision as POST /llm/explain shows it.
type Explanation struct {
	Pool          string           `json:"pool"`
	Candidates    []routing.Scored `json:"candidates"`
	Tier          routing.Tier     `json:"tier"`
	Outcome       routing.Outcome  `json:"outcome"`
	Share         float64          `json:"share"`
	Tokens        int              `json:"tokens"`
	BlockSize     int              `json:"block_size"`
	TookMs        float64          `json:"took_ms"`
	TokenizeError string           `json:"tokenize_error,omitempty"`
	// Tokenizer is where the prompt's token ids came from: "local" (the
	// model's tokenizer in the gateway), "remote" (an engine's /tokenize),
	// "remote_cached" (its answer, from the tokenize cache); "" when not
	// tokenized (token ids given, a cache_key request, tokenize off).
	Tokenizer string `json:"tokenizer,omitempty"`
	// Multimodal says whether the prompt's images entered its block keys
	// ("keyed: N images") or why the precise match stops at its first
	// media item; "" for a text prompt.
	Multimodal string  `json:"multimodal,omitempty"`
	Pick       *string `json:"pick"`
	// PredictedTTFT is the pick's predicted time to first token in
	// seconds (its candidate's prediction.ttft_seconds); 0 without a pick.
	PredictedTTFT float64 `json:"predicted_ttft_seconds"`
	// Admission is how cache-aware admission weighs the request now;
	// nil when the pool is not routed by lb_policy llm.
	Admission *PlacementReport `json:"admission,omitempty"`
	// Tokenize is how the prompt's tokens were had, for metrics.
	Tokenize TokenizeResult `json:"-"`
}

// Explain routes a request as the pool's policy would and scores every
// candidate, without proxying, reserving or learning anything.
func (f *Fleet) Explain(ctx context.Context, req *openai.Request, pool string) (Explanation, error) {
	dials := f.PoolDials(pool)
	if len(dials) == 0 {
		return Explanation{}, fmt.Errorf("pool %q: %w", pool, ErrNoEngines)
	}
	start := time.Now()
	d := f.Route(ctx, Query{Request: req, Dials: dials, Settings: f.PolicySettings(pool), Explain: true})
	out := Explanation{
		Pool: pool, Candidates: d.Scored, Tier: d.Tier, Outcome: d.Outcome, Share: d.Share,
		Tokens: d.Tokens, BlockSize: d.BlockSize, Tokenize: d.Tokenize, Multimodal: d.Multimodal,
		TookMs: float64(time.Since(start).Microseconds()) / 1000,
	}
	switch t := d.Tokenize; {
	case t.Local:
		out.Tokenizer = "local"
	case t.Called && t.Cached:
		out.Tokenizer = "remote_cached"
	case t.Called:
		out.Tokenizer = "remote"
	}
	if d.Tokenize.Err != nil {
		out.TokenizeError = d.Tokenize.Err.Error()
	}
	if d.Index >= 0 {
		out.Pick = &dials[d.Index]
		out.PredictedTTFT = d.Predicted
	}
	if s, ok := f.PolicyOf(pool); ok {
		out.Admission = f.explainPlacement(ctx, req, dials, s)
	}
	return out, nil
}

// PlacementReport is a request's placement as POST /llm/explain shows it:
// the prefix holder admission found, and for a full holder the expected
// wait there against the most it may be (see Placement.Reserve), with the
// default limits (kv_limit 0.9, each engine's own prefill rate, long_prefill 16384).
type PlacementReport struct {
	Holder       string       `json:"holder,omitempty"`
	CachedTokens int          `json:"cached_tokens"`
	Tier         routing.Tier `json:"tier"`
	HolderFull   bool         `json:"holder_full"`
	ExpectedWait float64      `json:"expected_wait_seconds"`
	WaitBound    float64      `json:"wait_bound_seconds"`
	WouldWait    bool         `json:"would_wait"`
	// ColdEvictedTokens is how many cached tokens a cold copy of the
	// prefix would evict on the roomiest other engine, its cache full by
	// its events; the bound counts them as it counts the prefix.
	ColdEvictedTokens int `json:"cold_evicted_tokens"`
	// LongPrefill is how long the request would occupy its engine as a
	// long prefill at the holder (any engine without one); 0 when its
	// uncached prompt is under the long_prefill threshold.
	LongPrefill float64 `json:"long_prefill_seconds"`
}

// explainPlacement places req and weighs it without reserving anything.
func (f *Fleet) explainPlacement(ctx context.Context, req *openai.Request, dials []string, s Settings) *PlacementReport {
	p := f.Place(ctx, Query{Request: req, Dials: dials, Settings: s})
	if p == nil {
		return nil
	}
	// The holder's figures, its breaker aside: the candidates show that.
	lim := Limits{KV: 0.9}
	loads := f.loads(dials, lim)
	p.weigh(loads, lim)
	out := &PlacementReport{Holder: p.Holder, CachedTokens: p.Cached, Tier: p.Tier,
		ExpectedWait: p.Wait.Seconds(), WaitBound: p.WaitBound.Seconds(), ColdEvictedTokens: p.Evicts}
	at := dialLoad{cached: p.Cached}
	for _, l := range loads {
		if l.e.Dial() == p.Holder {
			out.HolderFull = l.l.Known && l.free <= 0
			out.WouldWait = out.HolderFull && l.ok
			at.l = l.l
		}
	}
	out.LongPrefill = p.longPrefill(at, lim).Seconds()
	return out
}
