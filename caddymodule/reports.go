package caddymodule

import (
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/caddy-llmgw/admission"
)

// engineReport is one engine in GET /llm/engines.
type engineReport struct {
	Dial       string    `json:"dial"`
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
	Drained    bool      `json:"drained"`
	Breaker    string    `json:"breaker"`
	KV         *kvReport `json:"kv"`
}

// kvReport is an engine's KV subscription and mirror.
type kvReport struct {
	Endpoint         string            `json:"endpoint"`
	Mode             string            `json:"mode"`
	Replay           string            `json:"replay,omitempty"`
	Subscribed       bool              `json:"subscribed"`
	Connected        bool              `json:"connected"`
	Sessions         uint64            `json:"sessions"`
	DialErrors       uint64            `json:"dial_errors"`
	Dropped          uint64            `json:"dropped_messages"`
	LastError        string            `json:"last_error,omitempty"`
	LastSeq          *uint64           `json:"last_seq"`
	LastMessage      time.Time         `json:"last_message,omitzero"`
	Blocks           int               `json:"blocks"`
	Capacity         int               `json:"capacity"`
	Stored           uint64            `json:"stored_events"`
	Removed          uint64            `json:"removed_events"`
	Cleared          uint64            `json:"cleared_events"`
	Unknown          uint64            `json:"unknown_events"`
	DecodeErrors     uint64            `json:"decode_errors"`
	Resyncs          map[string]uint64 `json:"resyncs"`
	LastResync       time.Time         `json:"last_resync,omitzero"`
	LastResyncReason string            `json:"last_resync_reason,omitempty"`
	Verify           verifyReport      `json:"hash_verification"`
}

// verifyReport is the hash verification state of an engine's mirror.
type verifyReport struct {
	Enabled        bool      `json:"enabled"`
	Checked        uint64    `json:"checked"`
	Verified       uint64    `json:"verified"`
	Mismatched     uint64    `json:"mismatched"`
	Skipped        uint64    `json:"skipped"`
	LastMismatch   string    `json:"last_mismatch,omitempty"`
	LastMismatchAt time.Time `json:"last_mismatch_at,omitzero"`
}

func (f *fleet) engineReports() []engineReport {
	now := time.Now()
	var out []engineReport
	for _, e := range f.registry.Engines() {
		l, c := e.Load(), e.Config()
		r := engineReport{
			Dial: e.Dial(), Pool: c.Pool, Static: c.Static,
			Known: l.Known, Stale: l.Stale, Degraded: l.Degraded,
			Running: l.Running, Waiting: l.Waiting, KVUsage: l.KVUsage,
			BlockSize: l.BlockSize, GPUBlocks: l.NumGPUBlocks,
			ScrapedAt: l.ScrapedAt, AgeSeconds: l.Age.Seconds(),
			Failures: l.Failures, LastError: l.LastError,
			Inflight: l.Inflight, Dispatched: l.Dispatched, Finished: l.Finished, MaxInfl: l.MaxInflight,
			DrainRate: l.DrainRate, Drained: f.isDrained(e.Dial()),
			Breaker: f.currentBreaker().State(e.Dial(), now),
		}
		if r.Pool == "" {
			r.Pool = "default"
		}
		r.KV = f.kvReport(e.Dial())
		out = append(out, r)
	}
	return out
}

func (f *fleet) kvReport(dial string) *kvReport {
	f.mu.Lock()
	live := f.kvLive[dial]
	f.mu.Unlock()
	if live == nil {
		return nil
	}
	st := live.sub.Stats()
	r := &kvReport{
		Endpoint: live.cfg.Endpoint, Mode: "connect", Replay: live.cfg.Replay,
		Subscribed: true, Connected: st.Connected, Sessions: st.Sessions,
		DialErrors: st.DialErrors, Dropped: st.Dropped, LastError: st.LastError,
	}
	if live.cfg.Bind {
		r.Mode = "bind"
	}
	if m := f.index.Mirror(dial); m != nil {
		ms := m.Stats()
		if ms.HasSeq {
			seq := ms.LastSeq
			r.LastSeq = &seq
		}
		r.LastMessage = ms.LastMessage
		r.Blocks, r.Capacity = ms.Blocks, ms.Capacity
		r.Stored, r.Removed, r.Cleared, r.Unknown = ms.Stored, ms.Removed, ms.Cleared, ms.Unknown
		r.DecodeErrors = ms.DecodeErrors
		r.Resyncs, r.LastResync, r.LastResyncReason = ms.Resyncs, ms.LastResync, ms.LastResyncReason
		v := ms.Verify
		r.Verify = verifyReport{Enabled: v.Enabled, Checked: v.Checked, Verified: v.Verified,
			Mismatched: v.Mismatched, Skipped: v.Skipped, LastMismatch: v.LastMismatch, LastMismatchAt: v.LastMismatchAt}
	}
	return r
}

func (f *fleet) gatesByPool() map[string]*admission.Gate {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]*admission.Gate, len(f.gates))
	for k, g := range f.gates {
		out[k] = g
	}
	return out
}

func (f *fleet) gateList() []*admission.Gate {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*admission.Gate, 0, len(f.gates))
	for _, g := range f.gates {
		out = append(out, g)
	}
	return out
}

// saturation is, per pool's model, the share of its engines without room
// under the default admission limits.
func (f *fleet) saturation() map[string]float64 {
	f.mu.Lock()
	pools := make(map[string]string, len(f.poolModels))
	for p, m := range f.poolModels {
		pools[p] = m
	}
	f.mu.Unlock()
	out := make(map[string]float64, len(pools))
	for p, model := range pools {
		dials := f.poolDials(p)
		if len(dials) == 0 {
			continue
		}
		full := 0
		for _, d := range dials {
			e, ok := f.registry.Get(d)
			if !ok {
				continue
			}
			if l := e.Load(); l.Known && engineFree(l, limits{kv: 0.9}) <= 0 {
				full++
			}
		}
		out[model] = float64(full) / float64(len(dials))
	}
	return out
}

type breakerState struct {
	dial string
	open bool
}

func (f *fleet) breakerStates() []breakerState {
	now := time.Now()
	b := f.currentBreaker()
	var out []breakerState
	for _, e := range f.registry.Engines() {
		out = append(out, breakerState{dial: e.Dial(), open: b.State(e.Dial(), now) == "open"})
	}
	return out
}

// collectKV emits the per-engine KV metrics.
func (f *fleet) collectKV(ch chan<- prometheus.Metric) {
	stats := f.index.Stats()
	sort.Slice(stats, func(i, j int) bool { return stats[i].Engine < stats[j].Engine })
	for _, s := range stats {
		e := s.Engine
		for typ, n := range map[string]uint64{"stored": s.Stored, "removed": s.Removed, "cleared": s.Cleared, "unknown": s.Unknown} {
			ch <- prometheus.MustNewConstMetric(descKVEvents, prometheus.CounterValue, float64(n), e, typ)
		}
		ch <- prometheus.MustNewConstMetric(descKVBlocks, prometheus.GaugeValue, float64(s.Blocks), e)
		for reason, n := range s.Resyncs {
			ch <- prometheus.MustNewConstMetric(descKVResyncs, prometheus.CounterValue, float64(n), e, reason)
		}
		ch <- prometheus.MustNewConstMetric(descKVMismatch, prometheus.CounterValue, float64(s.Verify.Mismatched), e)
	}
}
