package routing

import (
	"fmt"
	"math"
)

// Defaults for Config. Weights are in token-equivalents (one unit is the
// work of prefilling one prompt token), which Pick turns into seconds at
// the engine's prefill rate (the request's wait) or at PrefillRate (the
// other terms); see the package documentation.
const (
	DefaultPrefixWeight       = 1.0
	DefaultApproximateWeight  = 0.7
	DefaultQueueWeight        = 512.0
	DefaultRunningWeight      = 64.0
	DefaultKVWeight           = 1024.0
	DefaultKVLimit            = 0.95
	DefaultEpsilon            = 1.5
	DefaultBoundedLoadMin     = 8.0
	DefaultImbalanceThreshold = 32.0
	DefaultTieTokens          = 8.0
	DefaultAdapterWeight      = 8192.0
	DefaultPrefillRate        = 10000.0
	DefaultStepSeconds        = 0.025
	DefaultSlotSteps          = 32.0
	DefaultWorkWeight         = 1.0
	DefaultCPUTierWeight      = 0.75
	DefaultStorageTierWeight  = 0.25
)

// Config holds the weights and thresholds of Pick. The zero value of every
// field means "use the default"; SetDefaults fills them in. For the rules
// that can be switched off (KVLimit, Epsilon, ImbalanceThreshold) a
// negative value disables the rule. The cost model is described in the
// package documentation.
type Config struct {
	// PrefixWeight is the cost of one prompt token the candidate still has
	// to prefill (prompt tokens minus the cached prefix). Default 1: it
	// defines the unit of cost.
	PrefixWeight float64 `json:"prefix_weight,omitempty"`
	// ApproximateWeight is the fraction of an approximate-tier match that
	// is credited as cached, because the prefix tree cannot see evictions.
	// Default 0.7; must be in (0, 1].
	ApproximateWeight float64 `json:"approximate_weight,omitempty"`
	// QueueWeight is the uncached prefill, in tokens, of one waiting
	// request this gateway did not send, while the engine's own mean
	// (Work.MeanUncached, from its counters) is unknown. Default 512.
	QueueWeight float64 `json:"queue_weight,omitempty"`
	// RunningWeight is the decode footprint of one decoding sequence, in
	// tokens, added to the cost but not to the predicted TTFT: it holds a
	// batch slot until it ends. Default 64: on the fleet simulation (3
	// seeds) 32 and 64 are within noise of each other, 64 a little better
	// past saturation; with 2 (one seed) random traffic's TTFT p90 was
	// 1.6 times round_robin's.
	RunningWeight float64 `json:"running_weight,omitempty"`
	// WorkWeight weighs, beside the predicted time to first token, the
	// prefill the request adds to the fleet: Pick compares TTFT +
	// WorkWeight × (uncached prompt ÷ prefill rate). A request sent past a
	// busy holder of its prefix is faster by at most its wait there, but
	// the fleet computes the prefix again, which every later request
	// waits for; without the term a burst of one long prefix spreads over
	// every engine. Default 1: a saved token counts once for the request's
	// wait and once for the fleet's. Negative means 0 (pure TTFT).
	WorkWeight float64 `json:"work_weight,omitempty"`
	// PrefillRate is the prefill speed, in uncached tokens per second,
	// of an engine whose own (Work.PrefillRate, from its counters) is not
	// known yet; it also converts the token-valued terms (KVWeight,
	// AdapterWeight, TieTokens) into seconds. Default 10000, an 8B model
	// on one modern GPU.
	PrefillRate float64 `json:"prefill_rate,omitempty"`
	// StepSeconds is the scheduler step, in seconds, of an engine whose
	// own (Work.StepSeconds) is not known yet: the first token comes at
	// least one step after the prefill. Default 0.025.
	StepSeconds float64 `json:"step_seconds,omitempty"`
	// SlotSteps is how many steps one batch slot takes to free while the
	// engine's drain rate (Work.DrainRate) is not known yet: a request
	// arriving at an engine whose batch (MaxInflight) is full waits this
	// many steps per request ahead of it beyond the batch. Default 32.
	SlotSteps float64 `json:"slot_steps,omitempty"`
	// KVWeight is the cost at full KV-cache usage; the term is
	// KVWeight × KVUsage², negligible at low usage and steep near the
	// point where the engine starts preempting. Default 1024.
	KVWeight float64 `json:"kv_weight,omitempty"`
	// KVLimit is the KV-cache usage at or above which a candidate (with
	// known load) is excluded as "kv_full". Default 0.95; negative
	// disables the rule; at most 1.
	KVLimit float64 `json:"kv_limit,omitempty"`
	// Epsilon is the bounded-load slack: a candidate whose load would
	// exceed max((1+Epsilon) × mean load, BoundedLoadMin) with this
	// request is excluded as "bounded_load", so a replica holding a popular
	// prefix cannot take all traffic. Default 1.5 (2.5 times the mean): a
	// safety net against hot spots, not a balancer (the cost's load terms
	// do the fine balancing), so it only bites well above the mean.
	// Negative disables the rule.
	Epsilon float64 `json:"epsilon,omitempty"`
	// BoundedLoadMin is the smallest load cap, in requests: below it
	// affinity is never broken for balance, since a replica running a
	// handful of requests is no hot spot. Default 8; at least 1.
	BoundedLoadMin float64 `json:"bounded_load_min,omitempty"`
	// ImbalanceThreshold, in requests: when the most and least loaded
	// usable candidates differ by more than this, the prefix term is
	// dropped and the request goes by load alone. Default 32; negative
	// disables the rule.
	ImbalanceThreshold float64 `json:"imbalance_threshold,omitempty"`
	// TieTokens: candidates whose costs are within this many
	// token-equivalents (÷ PrefillRate, in seconds) of the cheapest are
	// tied, and the tie is broken by
	// rendezvous hashing of Request.Key over their dials (spreading cold
	// prefixes). Default 8; negative means exact ties only.
	TieTokens float64 `json:"tie_tokens,omitempty"`
	// AdapterWeight is the cost of sending a LoRA adapter's request to a
	// candidate whose adapter slots are all taken by other adapters: vLLM
	// skips it until one of them has no request left, which under steady
	// traffic takes long, and then loads it. A free slot costs 0.4 of it
	// (a load, and one more engine the adapter spreads to), joining the
	// adapter's waiting requests 0.2, joining its running ones nothing
	// (see Adapter). Default 8192: sixteen queued requests. Measured on
	// the simulated fleet (6 adapters, 2 slots per engine, 3 engines, a 1×
	// load), 2048 and 4096 let load swings scatter the adapters over
	// every engine, each then loading and waiting for slots in turn.
	AdapterWeight float64 `json:"adapter_weight,omitempty"`
	// CPUTierWeight is the share of a block an engine keeps in its CPU
	// offload tier (vLLM's OffloadingConnector, LMCache's host cache),
	// continuing its GPU prefix, that is credited as cached: loading it
	// back over PCIe costs far less than recomputing it, but not nothing.
	// Default 0.75, NVIDIA Dynamo's host-tier default; at most 1; negative
	// credits nothing.
	CPUTierWeight float64 `json:"cpu_tier_weight,omitempty"`
	// StorageTierWeight is CPUTierWeight for blocks in the storage tier
	// (local disk, object stores), past the CPU ones. Default 0.25,
	// Dynamo's disk-tier default; at most 1; negative credits nothing.
	StorageTierWeight float64 `json:"storage_tier_weight,omitempty"`
}

// SetDefaults replaces every zero field with its default.
func (c *Config) SetDefaults() {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.PrefixWeight, DefaultPrefixWeight)
	def(&c.ApproximateWeight, DefaultApproximateWeight)
	def(&c.QueueWeight, DefaultQueueWeight)
	def(&c.RunningWeight, DefaultRunningWeight)
	def(&c.KVWeight, DefaultKVWeight)
	def(&c.KVLimit, DefaultKVLimit)
	def(&c.Epsilon, DefaultEpsilon)
	def(&c.BoundedLoadMin, DefaultBoundedLoadMin)
	def(&c.ImbalanceThreshold, DefaultImbalanceThreshold)
	def(&c.TieTokens, DefaultTieTokens)
	def(&c.AdapterWeight, DefaultAdapterWeight)
	def(&c.PrefillRate, DefaultPrefillRate)
	def(&c.StepSeconds, DefaultStepSeconds)
	def(&c.SlotSteps, DefaultSlotSteps)
	def(&c.WorkWeight, DefaultWorkWeight)
	def(&c.CPUTierWeight, DefaultCPUTierWeight)
	def(&c.StorageTierWeight, DefaultStorageTierWeight)
}

// Validate reports the first field that is out of range. Zero fields are
// valid (they mean "default"), so Validate may run before or after
// SetDefaults.
func (c Config) Validate() error {
	fields := []struct {
		name string
		v    float64
		// canDisable: negative values are meaningful (rule off).
		canDisable bool
	}{
		{"prefix_weight", c.PrefixWeight, false},
		{"approximate_weight", c.ApproximateWeight, false},
		{"queue_weight", c.QueueWeight, false},
		{"running_weight", c.RunningWeight, false},
		{"kv_weight", c.KVWeight, false},
		{"kv_limit", c.KVLimit, true},
		{"epsilon", c.Epsilon, true},
		{"bounded_load_min", c.BoundedLoadMin, false},
		{"imbalance_threshold", c.ImbalanceThreshold, true},
		{"tie_tokens", c.TieTokens, true},
		{"adapter_weight", c.AdapterWeight, false},
		{"prefill_rate", c.PrefillRate, false},
		{"step_seconds", c.StepSeconds, false},
		{"slot_steps", c.SlotSteps, false},
		{"work_weight", c.WorkWeight, true},
		{"cpu_tier_weight", c.CPUTierWeight, true},
		{"storage_tier_weight", c.StorageTierWeight, true},
	}
	for _, f := range fields {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return fmt.Errorf("routing: %s must be a finite number, got %v", f.name, f.v)
		}
		if f.v < 0 && !f.canDisable {
			return fmt.Errorf("routing: %s must not be negative, got %v", f.name, f.v)
		}
	}
	if c.ApproximateWeight > 1 {
		return fmt.Errorf("routing: approximate_weight must be at most 1, got %v", c.ApproximateWeight)
	}
	if c.CPUTierWeight > 1 || c.StorageTierWeight > 1 {
		return fmt.Errorf("routing: cpu_tier_weight and storage_tier_weight must be at most 1, got %v and %v", c.CPUTierWeight, c.StorageTierWeight)
	}
	if c.KVLimit > 1 {
		return fmt.Errorf("routing: kv_limit must be at most 1 (negative disables), got %v", c.KVLimit)
	}
	if c.BoundedLoadMin != 0 && c.BoundedLoadMin < 1 {
		return fmt.Errorf("routing: bounded_load_min must be at least 1, got %v", c.BoundedLoadMin)
	}
	return nil
}

// normalized returns the config Pick works with: defaults filled in and any
// out-of-range value replaced by its default, so a bad Config can skew
// decisions but never break them.
func (c Config) normalized() Config {
	c.SetDefaults()
	fix := func(v *float64, d float64, canDisable bool, max float64) {
		switch {
		case math.IsNaN(*v) || math.IsInf(*v, 0):
			*v = d
		case *v < 0 && !canDisable:
			*v = d
		case *v > max:
			*v = d
		}
	}
	inf := math.Inf(1)
	fix(&c.PrefixWeight, DefaultPrefixWeight, false, inf)
	fix(&c.ApproximateWeight, DefaultApproximateWeight, false, 1)
	fix(&c.QueueWeight, DefaultQueueWeight, false, inf)
	fix(&c.RunningWeight, DefaultRunningWeight, false, inf)
	fix(&c.KVWeight, DefaultKVWeight, false, inf)
	fix(&c.KVLimit, DefaultKVLimit, true, 1)
	fix(&c.Epsilon, DefaultEpsilon, true, inf)
	fix(&c.BoundedLoadMin, DefaultBoundedLoadMin, false, inf)
	if c.BoundedLoadMin < 1 {
		c.BoundedLoadMin = DefaultBoundedLoadMin
	}
	fix(&c.ImbalanceThreshold, DefaultImbalanceThreshold, true, inf)
	fix(&c.TieTokens, DefaultTieTokens, true, inf)
	fix(&c.AdapterWeight, DefaultAdapterWeight, false, inf)
	fix(&c.PrefillRate, DefaultPrefillRate, false, inf)
	fix(&c.StepSeconds, DefaultStepSeconds, false, inf)
	fix(&c.SlotSteps, DefaultSlotSteps, false, inf)
	fix(&c.WorkWeight, DefaultWorkWeight, true, inf)
	fix(&c.CPUTierWeight, DefaultCPUTierWeight, true, 1)
	fix(&c.StorageTierWeight, DefaultStorageTierWeight, true, 1)
	for _, w := range []*float64{&c.WorkWeight, &c.CPUTierWeight, &c.StorageTierWeight} {
		*w = max(*w, 0) // negative: the term is off
	}
	return c
}
