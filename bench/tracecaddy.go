package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	gwfleet "github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
	"github.com/llmgw/caddy-llmgw/internal/sim/simwords"
	"github.com/llmgw/caddy-llmgw/routing"
)

// The real-Caddy replay of a trace: a Caddy process built from this
// checkout in front of simulated vLLM engines (vllmsim), the load
// generator sending the trace's requests at its compressed timestamps.
// Two cores cannot push a trace's full prompts (12,000 tokens on average)
// through Caddy, the engines' tokenizer and the load generator at the
// trace's rate, so the prompts are scaled down by TraceCaddyPlan.Scale:
// each 512-token block of the trace becomes 512 ÷ Scale words (one
// simulator token each), equal hash ids giving equal words, and the
// engines' prefill rate, chunk budget and KV cache shrink by the same
// factor, so that a prompt still takes as long to prefill and a cache the
// same share of the trace. Outputs keep their full length (streamed in
// chunks of the model's TokenScale tokens, as section 2 does), so decoding
// takes as long as at full scale. An engine block of 16 words then stands
// for 16 × Scale trace tokens. The gateway's settings counted in tokens
// shrink by the same factor (scaledGateway), so that it decides as it
// would at full scale.

// TraceCaddyPlan is the real-Caddy replay.
type TraceCaddyPlan struct {
	Engines int `json:"engines"`
	// Requests replays the trace's first Requests requests.
	Requests int `json:"requests"`
	// Scale divides prompt lengths: trace tokens per simulated word. It
	// must divide 512.
	Scale int `json:"scale"`
	// TimeScale runs the engines' clocks this many times faster than
	// wall time.
	TimeScale float64   `json:"time_scale"`
	Speedups  []float64 `json:"speedups"`
}

// scaledModel is the cost model of the scaled replay's engines: m with
// its prefill rate and chunk budget divided by Scale, streaming outputs in
// chunks of section 2's TokenScale tokens.
func (c TraceCaddyPlan) scaledModel(m EngineModel) EngineModel {
	m.TokenScale = model32B().TokenScale
	m.PrefillTokensPerSec /= float64(c.Scale)
	m.MaxBatchedTokens = max(m.BlockSize, m.MaxBatchedTokens/c.Scale)
	return m
}

// traceSessions turns trace requests into one-turn sessions whose prompt
// is their blocks' words, asking for their output ÷ tokenScale tokens.
func traceSessions(reqs []fleetsim.TraceRequest, scale, tokenScale int, seed uint64) []Session {
	perBlock := fleetsim.TraceBlockTokens / scale
	out := make([]Session, len(reqs))
	for i, r := range reqs {
		words := (r.InputLength + scale - 1) / scale
		var sb strings.Builder
		for _, id := range r.HashIDs {
			n := min(perBlock, words)
			words -= n
			if sb.Len() > 0 {
				sb.WriteByte(' ')
			}
			// The block's words depend on the id alone.
			sb.WriteString(simwords.Words(rand.New(rand.NewPCG(seed, id)), fmt.Sprintf("b%d", id), n))
		}
		out[i] = Session{Key: fmt.Sprintf("trace-%d", i),
			Turns: []Turn{{User: sb.String(), MaxTokens: max(1, (r.OutputLength+tokenScale-1)/tokenScale)}}}
	}
	return out
}

// runCaddy runs the real-Caddy replay's ladder (res.Params.Caddy) into res.
func (res *TraceResult) runCaddy(ctx context.Context, env *Env, reqs []fleetsim.TraceRequest) error {
	p := res.Params
	c := *p.Caddy
	if c.Scale <= 0 || fleetsim.TraceBlockTokens%c.Scale != 0 || c.Engines <= 0 || c.TimeScale <= 0 {
		return fmt.Errorf("trace caddy: scale %d must divide %d; engines and time scale must be positive", c.Scale, fleetsim.TraceBlockTokens)
	}
	if c.Requests > 0 && c.Requests < len(reqs) {
		reqs = reqs[:c.Requests]
	}
	ceil := fleetsim.Ceiling(reqs)
	res.CaddyCeiling = &ceil
	m := c.scaledModel(p.Model)
	res.CaddyKVBlocks = traceKVBlocks(reqs, m, c.Scale, m.tokenScale())
	sessions := traceSessions(reqs, c.Scale, m.tokenScale(), p.Seed)
	pols := slices.DeleteFunc(qualityPolicies(), func(s PolicySpec) bool { return !slices.Contains(p.Policies, s.Name) })
	for _, x := range c.Speedups {
		at := make([]float64, len(reqs))
		for i, r := range reqs {
			at[i] = float64(r.Timestamp-reqs[0].Timestamp) / 1000 / x
		}
		for _, pol := range pols {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			run, err := replayCaddy(ctx, env, p, replayRun{m: m, kv: res.CaddyKVBlocks, sessions: sessions, at: at, pol: pol})
			if err != nil {
				return fmt.Errorf("trace caddy %.2fx %s: %w", x, pol.Name, err)
			}
			run.Speedup, run.Rate = x, traceRate(reqs, x)
			logTraceRun(run)
			res.Runs = append(res.Runs, run)
		}
	}
	return nil
}

// scaledGateway is g with the gateway's settings that count tokens at
// their defaults divided by scale, as the prompts are: llm_admission's
// long_prefill, and lb_policy llm's token weights with the reference
// prefill rate that turns them into seconds. At full size a prompt over
// long_prefill (16,384 tokens) occupies its engine for its prefill; left
// unscaled, no scaled prompt (at most a few thousand words) would reach
// it, and a few long prompts queued on one engine made every request sent
// there wait for all of them (lb_policy llm's TTFT p99 69 to 105 s in
// three runs at 1.5×, least_conn's 43 and 44 s). The weights and the rate
// shrink together, so every cost in seconds stays what it is at full
// size.
func scaledGateway(g GatewayConfig, scale int) GatewayConfig {
	if scale <= 1 {
		return g
	}
	f := float64(scale)
	g.AdmissionBody += fmt.Sprintf("\nlong_prefill %d", scaledLongPrefill(scale))
	if g.Policy != "llm" {
		return g
	}
	for _, kv := range []struct {
		name string
		v    float64
	}{
		{"prefill_rate", routing.DefaultPrefillRate}, {"queue_weight", routing.DefaultQueueWeight},
		{"running_weight", routing.DefaultRunningWeight}, {"kv_weight", routing.DefaultKVWeight},
		{"tie_tokens", routing.DefaultTieTokens}, {"adapter_weight", routing.DefaultAdapterWeight},
	} {
		g.PolicyBody += fmt.Sprintf("\n%s %g", kv.name, kv.v/f)
	}
	return g
}

// scaledLongPrefill is llm_admission's default long_prefill at the
// prompts' scale: what scaledGateway sets and the report states.
func scaledLongPrefill(scale int) int { return max(1, gwfleet.DefaultLongPrefill/max(1, scale)) }

// replayRun is one real-Caddy replay: the scaled engines' model and KV
// cache, the sessions, their arrivals in simulated seconds, the policy.
type replayRun struct {
	m        EngineModel
	kv       int
	sessions []Session
	at       []float64
	pol      PolicySpec
}

// replayCaddy starts fresh engines and a gateway with rr.pol, sends the
// sessions at their arrivals and summarizes the records.
func replayCaddy(ctx context.Context, env *Env, p TraceParams, rr replayRun) (TraceRun, error) {
	c := p.Caddy
	run := TraceRun{Replay: "caddy", Engines: c.Engines, Policy: rr.pol.Name}
	fleet, err := startSimFleet(ctx, c.Engines, rr.m, rr.kv, c.TimeScale, nil)
	if err != nil {
		return run, err
	}
	defer fleet.Close()
	qp := QualityParams{MaxPark: p.MaxPark, TimeScale: c.TimeScale, PollInterval: 250 * time.Millisecond}
	dir := filepath.Join(env.Out, "runs", fmt.Sprintf("trace-%s-%.2f", rr.pol.Name, rr.at[len(rr.at)-1]))
	gws, err := startGateways(ctx, env.Caddy, dir, scaledGateway(qp.gatewayConfig(fleet, rr.pol), c.Scale), 1, rr.pol.KV)
	if err != nil {
		return run, err
	}
	defer stopGateways(gws)
	tr := &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}
	defer tr.CloseIdleConnections()
	start := time.Now()
	recs := Run(ctx, Target{URL: gws[0].URL, Model: "sim-model", Client: &http.Client{Transport: tr}}, rr.sessions, LoadConfig{
		Arrivals: rr.at, Concurrency: 4096, TimeScale: c.TimeScale, Deadline: env.RunDeadline, RequestTimeout: env.RunDeadline, Stream: true,
	})
	run.WallSeconds = time.Since(start).Seconds()
	s := Summarize(recs, c.TimeScale, rr.m.tokenScale())
	run.HitRate, run.TTFT, run.Completed, run.Rejected, run.Errors = s.HitRate, s.TTFT, s.OK, s.Rejected, s.Errors+s.Timeouts
	run.Errors += len(rr.sessions) - s.Requests // never sent: the run's deadline cut it
	return run, nil
}
