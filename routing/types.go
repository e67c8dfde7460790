package routing

// Tier names the kind of information a routing decision (or one candidate's
// prefix estimate) rests on, most to least precise.
type Tier int

const (
	// Precise: the candidate's matched blocks come from its own KV-cache
	// events, so the match is known, not guessed.
	Precise Tier = iota
	// Approximate: the match comes from the gateway's own prefix tree of
	// what it routed where (no or stale events, or tokenize failed); the
	// blocks may have been evicted since, so they are credited at
	// Config.ApproximateWeight.
	Approximate
	// CacheKey: nobody held the prefix and a client-supplied cache key
	// (Request.CacheKey) chose among the equally good candidates.
	CacheKey
	// LoadOnly: load alone decided (no prefix information, nobody matched,
	// or the fleet was too imbalanced to honour affinity).
	LoadOnly
)

// String returns the label used in metrics and the admin API.
func (t Tier) String() string {
	switch t {
	case Precise:
		return "precise"
	case Approximate:
		return "approximate"
	case CacheKey:
		return "cache_key"
	case LoadOnly:
		return "load_only"
	}
	return "unknown"
}

// MarshalText encodes the tier as its label, so JSON explain output is readable.
func (t Tier) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Outcome classifies a decision for metrics.
type Outcome int

const (
	// Hit: the picked candidate holds the best prefix on offer and it is
	// longer than zero blocks.
	Hit Outcome = iota
	// Miss: no usable candidate held any of the prompt.
	Miss
	// OverriddenByLoad: some candidate held a longer prefix than the one
	// picked, but load, saturation or hot-spot rules sent the request
	// elsewhere (or to the caller's fallback, when Index is -1).
	OverriddenByLoad
)

// String returns the label used in metrics and the admin API.
func (o Outcome) String() string {
	switch o {
	case Hit:
		return "hit"
	case Miss:
		return "miss"
	case OverriddenByLoad:
		return "overridden_by_load"
	}
	return "unknown"
}

// MarshalText encodes the outcome as its label.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// ReasonKVUnapplied is the TierReason of a candidate whose KV events are
// connected but mostly not being applied (their parents unknown, or
// malformed): its mirror would say it holds nothing, so it is weighed on
// the approximate tier instead.
const ReasonKVUnapplied = "kv_events_unapplied"

// Adapter is where a candidate stands for the LoRA adapter a request asks
// for, best first: vLLM batches requests of the adapters it runs, queues
// an adapter's requests behind its adapter slots (--max-loras) when they
// are all taken, and loads an adapter that is not resident before its
// first step. Pick adds Config.AdapterWeight times the state's share to
// the candidate's cost (see the package documentation).
type Adapter int

const (
	// AdapterNone: the request is for a base model, or nothing is known
	// of the candidate's adapters; no cost.
	AdapterNone Adapter = iota
	// AdapterRunning: requests for the adapter run there (or this gateway
	// sent one since the engine's last scrape); it joins them.
	AdapterRunning
	// AdapterWaiting: requests for the adapter wait there for a slot.
	AdapterWaiting
	// AdapterFreeSlot: the adapter is not in flight there, but fewer
	// adapters than max_lora are: it gets a slot at once, after loading.
	AdapterFreeSlot
	// AdapterNoSlot: the adapter is not in flight there and every slot
	// is taken by others: it waits for one, then loads.
	AdapterNoSlot
)

// String returns the label used in the admin API.
func (a Adapter) String() string {
	switch a {
	case AdapterNone:
		return "none"
	case AdapterRunning:
		return "running"
	case AdapterWaiting:
		return "waiting"
	case AdapterFreeSlot:
		return "free_slot"
	case AdapterNoSlot:
		return "no_slot"
	}
	return "unknown"
}

// MarshalText encodes the state as its label.
func (a Adapter) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// Share is the fraction of Config.AdapterWeight the state costs. The
// steps follow llm-d's LoRA affinity scorer (1, 0.8, 0.6, 0 for running,
// waiting, free slot, other), as costs: 0, 0.2, 0.4, 1. Out-of-range
// values cost nothing.
func (a Adapter) Share() float64 {
	switch a {
	case AdapterWaiting:
		return 0.2
	case AdapterFreeSlot:
		return 0.4
	case AdapterNoSlot:
		return 1
	}
	return 0
}

// Candidate is one upstream the request could go to, with what the caller
// knows about its cache and its load. Values from outside (engine gauges)
// are sanitised by Pick: NaN and negatives count as 0.
type Candidate struct {
	// Dial is the upstream's address, as Caddy spells it; it keys the
	// deterministic tie-break.
	Dial string
	// Tier says where MatchedBlocks comes from: Precise (fresh KV events)
	// or Approximate (prefix tree). Any other tier means "no prefix
	// information" and MatchedBlocks is ignored.
	Tier Tier
	// TierReason, when set, is why the candidate is on its tier although
	// a better one was expected; see ReasonKVUnapplied.
	TierReason string
	// MatchedBlocks is how many leading full blocks of the prompt the
	// candidate holds. For the approximate tier the caller converts its
	// matched share to the same unit (share × Request.TotalBlocks).
	MatchedBlocks int
	// Speculative is how many of MatchedBlocks the caller only predicts
	// the candidate holds (the prompt was just sent there and its KV
	// events have not confirmed it yet). They weigh as the others; the
	// count is shown in Scored.
	Speculative int
	// CPUBlocks and StorageBlocks are the blocks past MatchedBlocks the
	// candidate holds in its CPU offload tier, then past those in its
	// storage tier (Precise tier only): loading them back is far cheaper
	// than recomputing them, and Pick credits them at
	// Config.CPUTierWeight and Config.StorageTierWeight.
	CPUBlocks, StorageBlocks int

	// Running and Waiting are the engine's own gauges
	// (vllm:num_requests_running / _waiting) from the last scrape, less
	// the requests the caller has seen finish there since (taken off
	// Waiting first: the scheduler refills a freed slot from its queue).
	Running, Waiting float64
	// Inflight counts requests this gateway has in flight there now;
	// Dispatched counts those sent since the last scrape (not yet in the
	// gauges).
	Inflight, Dispatched int64
	// KVUsage is the engine's KV-cache usage, 0..1.
	KVUsage float64
	// MaxInflight is the most requests the candidate should hold (0 =
	// unknown, no limit); at or above it the candidate is "saturated".
	MaxInflight int
	// Adapter is where the candidate stands for the request's LoRA
	// adapter; AdapterNone for a base model's request.
	Adapter Adapter
	// LoadKnown says Running, Waiting, Dispatched and KVUsage are valid
	// (a recent scrape). When false only Inflight is used.
	LoadKnown bool

	// Work is what the candidate has to do before the request's first
	// token, as far as the caller knows it; the zero value means nothing
	// of this gateway's and every rate unknown (Config's cold-start
	// defaults apply).
	Work Work

	// Unavailable, when non-empty, is why the caller already knows this
	// candidate cannot take the request (e.g. "breaker_open",
	// "unhealthy"). Pick never picks it and reports the reason in
	// Scored.Excluded; callers may equally leave such upstreams out.
	Unavailable string
}

// Work is a candidate's outstanding work in tokens and its speeds, from
// which Pick predicts the request's time to first token there. Values
// from outside are sanitised: NaN and negatives count as 0 (unknown for
// the rates).
type Work struct {
	// OwnPrefill is the uncached prompt tokens this gateway's requests
	// there have still to prefill (each counted from dispatch to its first
	// token); OwnPending is how many requests they are.
	OwnPrefill float64
	OwnPending int64
	// OwnDueSeconds is how long until the last of the OwnPending requests
	// is predicted to reach its first token (upstreams.Load.OwnDue): the
	// engine is busy with this gateway's prefills until then, so that is
	// the wait they put ahead of a new request, a prefill about to end
	// weighing less than one just sent. 0 = unknown: OwnPrefill ÷ rate.
	OwnDueSeconds float64
	// OwnDecoding counts this gateway's requests there past their first
	// token: they hold a batch slot and a decode step each until they end.
	OwnDecoding int64
	// MeanUncached is the engine's observed mean uncached prompt per
	// request, in tokens; it prices the waiting requests that are not this
	// gateway's. 0 = unknown (Config.QueueWeight).
	MeanUncached float64
	// PrefillRate is the engine's observed prefill speed in uncached
	// tokens per second; 0 = unknown (Config.PrefillRate).
	PrefillRate float64
	// StepSeconds is the engine's observed scheduler step; 0 = unknown
	// (Config.StepSeconds).
	StepSeconds float64
	// SpeedAge is how long, in seconds, the engine has gone without a
	// fresh sample of PrefillRate and StepSeconds (upstreams.Load.SpeedAge):
	// the older, the more they are taken from its peers' instead (see
	// the package documentation). 0 = fresh.
	SpeedAge float64
	// DrainRate is the engine's observed completions per second, for the
	// wait for a batch slot; 0 = unknown (one slot per
	// Config.SlotSteps steps).
	DrainRate float64
}

// Request describes the prompt being routed.
type Request struct {
	// PromptTokens is the prompt length in tokens (an estimate such as
	// bytes/4 when tokenizing failed). When 0 it is taken as
	// TotalBlocks × BlockSize.
	PromptTokens int
	// BlockSize is the engines' KV block size in tokens (vLLM default 16).
	BlockSize int
	// TotalBlocks is the number of full blocks in the prompt.
	TotalBlocks int
	// Key spreads requests that no candidate can serve better than another
	// (cold prefixes, equal loads) over the candidates, rendezvous-style:
	// the same key goes to the same candidate while the fleet is unchanged.
	// Callers should derive it from the prompt's first block hash (or a
	// client cache key) so that requests sharing a prefix agree.
	Key uint64
	// CacheKey says Key came from a client-supplied cache key (e.g. the
	// OpenAI prompt_cache_key field) rather than from the prompt. A Miss
	// is then reported under Tier CacheKey.
	CacheKey bool
}

// Scored is one candidate as Pick saw it, for the admin explain endpoint.
type Scored struct {
	Dial string `json:"dial"`
	Tier Tier   `json:"tier"`
	// TierReason is Candidate.TierReason.
	TierReason string `json:"tier_reason,omitempty"`
	// MatchedBlocks is the match after clamping to the prompt.
	MatchedBlocks int `json:"matched_blocks"`
	// SpeculativeBlocks is how many of MatchedBlocks are speculative
	// (Candidate.Speculative).
	SpeculativeBlocks int `json:"speculative_blocks,omitempty"`
	// CPUBlocks and StorageBlocks are the offloaded blocks past
	// MatchedBlocks credited to the candidate, after clamping to the
	// prompt.
	CPUBlocks     int `json:"cpu_blocks,omitempty"`
	StorageBlocks int `json:"storage_blocks,omitempty"`
	// Share is MatchedBlocks as a share of the prompt's blocks, 0..1.
	Share float64 `json:"share"`
	// Load is the candidate's load in requests (see the package doc).
	Load float64 `json:"load"`
	// Adapter is the candidate's standing for the request's LoRA adapter
	// (Candidate.Adapter); left out for a base model's request.
	Adapter Adapter `json:"adapter,omitzero"`
	// AdapterCost is the part of Cost the adapter term adds, in seconds.
	AdapterCost float64 `json:"adapter_cost,omitempty"`
	// Prediction is the predicted time to first token and its parts.
	Prediction Prediction `json:"prediction"`
	// Cost is what Pick compared, in seconds (lower is better): the
	// prediction, less the request's own prefill while the fleet is too
	// imbalanced to honour prefixes.
	Cost float64 `json:"cost"`
	// Excluded is why the candidate could not be picked; empty if it could.
	Excluded string `json:"excluded,omitempty"`
}

// Prediction is one candidate's predicted time to first token and the
// parts it is the sum of (see the package documentation).
type Prediction struct {
	// OwnAhead and ForeignAhead are the prefill tokens ahead of the
	// request: this gateway's pending prefill and the other waiting
	// requests priced at the engine's mean uncached prompt. DecodeAhead is
	// the decoding sequences' footprint (Config.RunningWeight each): Pick
	// adds it to the cost, not to the TTFT (see the package doc).
	OwnAhead     float64 `json:"own_ahead_tokens"`
	ForeignAhead float64 `json:"foreign_ahead_tokens"`
	DecodeAhead  float64 `json:"decode_ahead_tokens"`
	// Prefill is the request's own uncached prompt there, in tokens.
	Prefill float64 `json:"prefill_tokens"`
	// Rate is the prefill speed used, tokens per second.
	Rate float64 `json:"prefill_rate"`
	// OwnDueSeconds is how long until the last of this gateway's pending
	// prefills there is predicted to end (Work.OwnDueSeconds; 0: none
	// predicted). AheadSeconds is it plus ForeignAhead over Rate, or
	// without it the tokens ahead over Rate; PrefillSeconds is the
	// request's own prefill over Rate; SlotSeconds the wait for a batch
	// slot; StepSeconds one scheduler step (less, with the engine's own
	// rate, what of it that rate already holds: see stepless);
	// PenaltySeconds the KV and
	// adapter terms over Rate.
	OwnDueSeconds  float64 `json:"own_due_seconds,omitempty"`
	AheadSeconds   float64 `json:"ahead_seconds"`
	PrefillSeconds float64 `json:"prefill_seconds"`
	SlotSeconds    float64 `json:"slot_seconds"`
	StepSeconds    float64 `json:"step_seconds"`
	PenaltySeconds float64 `json:"penalty_seconds,omitempty"`
	// TTFT is the sum: the predicted time to first token, in seconds.
	TTFT float64 `json:"ttft_seconds"`
}

// Decision is the result of Pick.
type Decision struct {
	// Index is the picked candidate, or -1 when no candidate may take the
	// request: the caller then falls back (LeastLoaded, or Caddy's
	// least_conn among available upstreams).
	Index int `json:"index"`
	// Tier is the information the decision rested on: the picked
	// candidate's tier when it matched part of the prompt; CacheKey for a
	// miss with Request.CacheKey; LoadOnly otherwise.
	Tier Tier `json:"tier"`
	// Outcome classifies the decision (see Outcome).
	Outcome Outcome `json:"outcome"`
	// Share is the picked candidate's matched share of the prompt, 0..1.
	Share float64 `json:"share"`
	// Prefill is the picked candidate's uncached prompt in tokens (what
	// the caller records as the request's work there) and Predicted its
	// predicted time to first token in seconds; both 0 when Index is -1.
	Prefill   float64 `json:"prefill_tokens"`
	Predicted float64 `json:"predicted_ttft_seconds"`
	// Ahead is the part of Predicted spent behind the work ahead of the
	// request there (its Prediction.AheadSeconds).
	Ahead float64 `json:"ahead_seconds"`
	// Scored holds one entry per candidate, in input order, when Pick was
	// asked to explain; nil otherwise.
	Scored []Scored `json:"scored,omitempty"`
}
