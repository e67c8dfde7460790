package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/localtok"
)

// SimFleet is the simulated vLLM fleet of a routing-quality run: N
// engines in this process, with KV events on OS-assigned loopback ports.
type SimFleet struct {
	Engines []*vllmsim.Engine
	Config  vllmsim.Config
	// DP, when set, is the one data-parallel server whose ranks are
	// Engines (startDPFleet): the gateway knows it as one engine declared
	// with data_parallel_size.
	DP *vllmsim.DPServer
}

// EngineModel is the simulated engine shared by the routing-quality runs
// and the fleet simulation: its scheduler limits and speeds.
type EngineModel struct {
	MaxNumSeqs          int     `json:"max_num_seqs"`
	BlockSize           int     `json:"block_size"`
	PrefillTokensPerSec float64 `json:"prefill_tokens_per_sec"`
	DecodeStepSeconds   float64 `json:"decode_step_seconds"`
	MaxBatchedTokens    int     `json:"max_batched_tokens"`
	// TokenScale: in the routing-quality runs every streamed token stands
	// for TokenScale tokens — requests ask for OutputTokens/TokenScale
	// tokens and the simulator's decode step is DecodeStepSeconds ×
	// TokenScale — so each request decodes for as long as its nominal
	// length would, with TokenScale times fewer SSE chunks for the
	// simulators, Caddy and the load generator to push through the 2-core
	// host. 1 (or 0) streams every token.
	TokenScale int `json:"token_scale,omitempty"`
}

// tokenScale is TokenScale, at least 1.
func (m EngineModel) tokenScale() int { return max(1, m.TokenScale) }

// simModel is vllmsim's defaults: 16 sequences, 16-token blocks, 10k
// prompt tokens/s of prefill, 20 ms decode steps, 8192-token steps.
func simModel() EngineModel {
	return EngineModel{MaxNumSeqs: 16, BlockSize: 16, PrefillTokensPerSec: 10000, DecodeStepSeconds: 0.020, MaxBatchedTokens: 8192}
}

// Capacity estimates one engine's sustainable request rate for prompts of
// prompt tokens of which cached are prefix-cache hits, with output
// tokens each: a request needs output decode steps shared by MaxNumSeqs
// sequences, and its uncached prefill adds to the steps it rides in.
func (m EngineModel) Capacity(prompt, cached, output int) float64 {
	perReq := float64(output)*m.DecodeStepSeconds/float64(m.MaxNumSeqs) + float64(prompt-cached)/m.PrefillTokensPerSec
	return 1 / perReq
}

// RequestBlocks is the KV blocks one request of the workload occupies at
// its end (prompt plus output).
func (m EngineModel) RequestBlocks(w WorkloadSpec) int {
	return (w.PromptTokens() + w.OutputTokens + 16 + m.BlockSize - 1) / m.BlockSize
}

// workingSetHeadroom: a full batch of max_num_seqs requests fills 80% of
// an engine's KV cache at most, below admission's default kv_limit (0.9),
// so the cache's size decides what stays cached rather than whether
// requests are admitted.
const workingSetHeadroom = 1.25

// KVBlocks applies the capacity rule: an engine's KV cache is sized so
// that the workload's resident set — the distinct shared tokens (every
// group's system prompt, every session's full history) — fills rho of the
// fleet's total KV cache, but never below 1.25 × the working set of
// MaxNumSeqs requests running at once. rho < 1/n means one engine could
// hold every shared prefix; with rho = 0.5 a router that spreads every
// group over every engine asks each engine to hold n/2 times its
// capacity, while a router that keeps each group on one engine needs half
// of each.
func (m EngineModel) KVBlocks(w WorkloadSpec, engines int, rho float64) (blocks int, actualRho float64) {
	resident := float64(w.Groups) * math.Ceil(float64(w.SharedTokens())/float64(m.BlockSize))
	working := int(math.Ceil(workingSetHeadroom * float64(m.MaxNumSeqs*m.RequestBlocks(w))))
	blocks = max(working, int(math.Ceil(resident/(rho*float64(engines)))))
	if resident == 0 {
		return blocks, 0
	}
	return blocks, resident / float64(blocks*engines)
}

// startSimFleet starts n engines of the model with the given KV cache
// size and time scale, tokenizing with tok (nil: the word tokenizer).
func startSimFleet(ctx context.Context, n int, m EngineModel, kvBlocks int, timeScale float64, tok *localtok.Model) (*SimFleet, error) {
	return startSimFleetWith(ctx, n, m, kvBlocks, timeScale, tok, nil)
}

// startSimFleetWith is startSimFleet where configure, when set, adjusts
// engine i's config (its models) before it starts.
func startSimFleetWith(ctx context.Context, n int, m EngineModel, kvBlocks int, timeScale float64, tok *localtok.Model, configure func(i int, c *vllmsim.Config)) (*SimFleet, error) {
	cfg := simConfig(m, kvBlocks, timeScale, tok)
	f := &SimFleet{Config: cfg}
	for i := 0; i < n; i++ {
		c := cfg
		kv := *cfg.KVEvents
		c.KVEvents = &kv
		if configure != nil {
			configure(i, &c)
		}
		e, err := vllmsim.Start(ctx, c)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("starting engine %d: %w", i, err)
		}
		f.Engines = append(f.Engines, e)
	}
	return f, nil
}

// simConfig is the config of every engine of a fleet of the model, with
// the given KV cache size and time scale, tokenizing with tok (nil: the
// word tokenizer), its KV events and replay on OS-assigned loopback
// ports.
func simConfig(m EngineModel, kvBlocks int, timeScale float64, tok *localtok.Model) vllmsim.Config {
	return vllmsim.Config{
		MaxNumSeqs:          m.MaxNumSeqs,
		NumGPUBlocks:        kvBlocks + 1, // block 0 is vLLM's null block
		BlockSize:           m.BlockSize,
		MaxNumBatchedTokens: m.MaxBatchedTokens,
		PrefillTokensPerSec: m.PrefillTokensPerSec,
		DecodeStepTime:      time.Duration(m.DecodeStepSeconds * float64(m.tokenScale()) * float64(time.Second)),
		TimeScale:           timeScale,
		// The gateway in front times the engines on its wall clock and
		// derives their prefill rates from these histograms: both must be
		// on one clock, or at TimeScale 2 every prefill looks twice as slow
		// as the gateway then sees it run.
		WallClockMetrics: true,
		KVEvents:         &vllmsim.KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"},
		Tokenizer:        tok,
	}
}

// startDPFleet starts one simulated data-parallel server of n ranks, each
// rank configured as cfg (an engine of startSimFleet's), behind one HTTP
// port: rank r publishes its KV events and serves replay on base ports +
// r, as vLLM's ranks do, the bases free loopback ports (tried again, up to
// 10 times, when a rank's port is taken). The fleet's Engines are the
// ranks.
func startDPFleet(ctx context.Context, n int, cfg vllmsim.Config) (*SimFleet, error) {
	var last error
	for range 10 {
		events, err := freePort()
		if err != nil {
			return nil, err
		}
		replay, err := freePort()
		if err != nil {
			return nil, err
		}
		c := cfg
		c.DataParallelSize = n
		// A `*` binds (vLLM's rule), on the ranks' host, 127.0.0.1.
		c.KVEvents = &vllmsim.KVEventsConfig{Endpoint: fmt.Sprintf("tcp://*:%d", events), ReplayEndpoint: fmt.Sprintf("tcp://*:%d", replay)}
		d, err := vllmsim.StartDataParallel(ctx, c)
		if err == nil {
			return &SimFleet{Engines: d.Ranks(), Config: cfg, DP: d}, nil
		}
		if last = err; ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("starting a data-parallel server of %d ranks: %w", n, last)
}

// Refs describes the engines for a Caddyfile; kv says whether the
// gateway subscribes to their events. A data-parallel fleet is one
// engine with its ranks' count, rank 0's endpoints the bases the gateway
// offsets by rank.
func (f *SimFleet) Refs(kv bool) []EngineRef {
	if f.DP != nil {
		ref := EngineRef{Dial: f.DP.Addr(), MaxInflight: f.Config.MaxNumSeqs, DataParallelSize: len(f.Engines)}
		if kv {
			ref.KVEvents, ref.KVReplay = f.Engines[0].KVEndpoint(), f.Engines[0].ReplayEndpoint()
		}
		return []EngineRef{ref}
	}
	refs := make([]EngineRef, len(f.Engines))
	for i, e := range f.Engines {
		refs[i] = EngineRef{Dial: e.Addr(), MaxInflight: f.Config.MaxNumSeqs}
		if kv {
			refs[i].KVEvents, refs[i].KVReplay = e.KVEndpoint(), e.ReplayEndpoint()
		}
	}
	return refs
}

// Totals sums the engines' counters.
func (f *SimFleet) Totals() vllmsim.Stats {
	var t vllmsim.Stats
	for _, e := range f.Engines {
		s := e.Stats()
		t.RequestsServed += s.RequestsServed
		t.PromptTokens += s.PromptTokens
		t.CachedTokens += s.CachedTokens
		t.GenerationTokens += s.GenerationTokens
		t.Preemptions += s.Preemptions
		t.KVMessagesDropped += s.KVMessagesDropped
	}
	return t
}

// Close stops every engine (a data-parallel server with its ranks).
func (f *SimFleet) Close() error {
	if f.DP != nil {
		err := f.DP.Close()
		f.DP, f.Engines = nil, nil
		return err
	}
	var errs []error
	for _, e := range f.Engines {
		errs = append(errs, e.Close())
	}
	f.Engines = nil
	return errors.Join(errs...)
}
