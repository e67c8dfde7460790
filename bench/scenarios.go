package main

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"
)

// The scenarios section (issue 13): real Caddy in front of simulated
// engines where only the engines' own knowledge helps — KV pressure,
// several gateways sharing the fleet, traffic that bypasses the gateway
// after a cache warm-up, engine restarts, bursts of one new prefix — and
// engines serving different models and LoRA adapters (multimodel.go),
// chat prompts carrying images (images.go), and the ranks of one
// data-parallel server against as many separate engines (dpranks.go).
// It runs on the routing-quality machinery (runQuality); a plan's
// Scenario says how it departs from a plain quality run.

// ScenarioOptions are a plan's departures from a plain quality run.
type ScenarioOptions struct {
	Desc string `json:"desc"`
	// Why explains, under the scenario's table, what bounds the result
	// (stated from the workload's arithmetic, not from a run's numbers).
	Why string `json:"why,omitempty"`
	// Gateways is the number of Caddy instances sharing the fleet,
	// active-active, each subscribed to every engine; sessions are spread
	// across them in turn. 0 or 1: one.
	Gateways int `json:"gateways,omitempty"`
	// BypassShare of the sessions go straight to a random engine.
	BypassShare float64 `json:"bypass_share,omitempty"`
	// Warm sends, before the user traffic, every group's prefix to an
	// engine of the warmer's own (seeded random) choice, not through a
	// gateway.
	Warm bool `json:"warm,omitempty"`
	// RestartEvery restarts one engine every so many simulated seconds,
	// in turn (cache wiped, events reset, running requests fail).
	RestartEvery float64 `json:"restart_every_seconds,omitempty"`
	// BurstSize and BurstWindow: see LoadConfig (a "burst" workload).
	BurstSize   int     `json:"burst_size,omitempty"`
	BurstWindow float64 `json:"burst_window_seconds,omitempty"`
	// Engines, Rho, Model and TimeScale override the section's, when
	// set.
	Engines   int          `json:"engines,omitempty"`
	Rho       float64      `json:"rho,omitempty"`
	Model     *EngineModel `json:"model,omitempty"`
	TimeScale float64      `json:"time_scale,omitempty"`
	// Policies names the section's policies this plan runs; nil = all.
	Policies []string `json:"policies,omitempty"`
	// LateJoin makes the plan a late-join plan (issue 35, latejoin.go):
	// no rate ladder, but a warm-up through one gateway and requests
	// compared one at a time between a gateway started after it and one
	// subscribed all along.
	LateJoin *LateJoinOptions `json:"late_join,omitempty"`
	// Models makes the fleet serve several models (issue 37,
	// multimodel.go): it sets the number of engines and each one's
	// models, and the gateways take their upstreams from the llm app
	// (`dynamic llm`).
	Models *ModelFleet `json:"models,omitempty"`
}

// apply returns the section's parameters with the plan's overrides.
func (sc *ScenarioOptions) apply(p QualityParams) QualityParams {
	if sc == nil {
		return p
	}
	if sc.Engines > 0 {
		p.Engines = sc.Engines
	}
	if sc.Rho > 0 {
		p.Rho = sc.Rho
	}
	if sc.Model != nil {
		p.Model = *sc.Model
	}
	if sc.TimeScale > 0 {
		p.TimeScale = sc.TimeScale
	}
	if sc.Models != nil {
		p.Engines = sc.Models.engines()
	}
	return p
}

// models is the plan's model layout, nil for one model on every engine.
func (sc *ScenarioOptions) models() *ModelFleet {
	if sc == nil {
		return nil
	}
	return sc.Models
}

// runs reports whether the plan runs the policy.
func (sc *ScenarioOptions) runs(policy string) bool {
	if sc == nil || sc.Policies == nil {
		return true
	}
	for _, n := range sc.Policies {
		if n == policy {
			return true
		}
	}
	return false
}

// gateways is the number of Caddy instances, at least 1.
func (sc *ScenarioOptions) gateways() int {
	if sc == nil {
		return 1
	}
	return max(1, sc.Gateways)
}

// startGateways starts n Caddy instances with the same config in front
// of the fleet, each in its own directory under dir.
func startGateways(ctx context.Context, bin, dir string, g GatewayConfig, n int, wantKV bool) ([]*Gateway, error) {
	var gws []*Gateway
	for i := 0; i < n; i++ {
		d := dir
		if n > 1 {
			d = filepath.Join(dir, fmt.Sprintf("gateway-%d", i))
		}
		gw, err := startGateway(ctx, bin, d, g, wantKV)
		if err != nil {
			stopGateways(gws)
			return nil, fmt.Errorf("gateway %d of %d: %w", i+1, n, err)
		}
		gws = append(gws, gw)
	}
	return gws, nil
}

func stopGateways(gws []*Gateway) {
	for _, gw := range gws {
		gw.Stop()
	}
}

// pids lists the gateways' process ids.
func pids(gws []*Gateway) []int {
	out := make([]int, len(gws))
	for i, gw := range gws {
		out[i] = gw.Pid()
	}
	return out
}

// cpuOf sums the CPU time of the processes.
func cpuOf(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		d, err := procCPU(pid)
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// sessionTargets chooses each of n sessions' target: the gateways in
// turn, or with the plan's BypassShare (a seeded draw per session, made
// up front in session order, so a run's split does not depend on the
// order its sessions start in) a random engine directly.
func sessionTargets(sc *ScenarioOptions, gateways []Target, fleet *SimFleet, n int, seed uint64) func(int) Target {
	if sc == nil || (sc.gateways() == 1 && sc.BypassShare == 0) {
		return nil
	}
	picks := make([]Target, n)
	rng := rand.New(rand.NewPCG(seed, 0x627970617373))
	for i := range picks {
		picks[i] = gateways[i%len(gateways)]
		if sc.BypassShare > 0 && rng.Float64() < sc.BypassShare {
			e := fleet.Engines[rng.IntN(len(fleet.Engines))]
			picks[i] = Target{URL: e.URL() + "/v1/chat/completions", Model: gateways[0].Model, Client: gateways[0].Client, Direct: true}
		}
	}
	return func(session int) Target { return picks[session] }
}

// warmFleet sends every group's system prompt, with a short question of
// its own and one output token, straight to an engine of the warmer's
// choosing, at most 64 at a time, and waits for them all: the cache
// warmer of the bypass scenario, whose placements no gateway made.
func warmFleet(ctx context.Context, fleet *SimFleet, sessions []Session, client *http.Client, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x7761726d))
	seen := map[string]bool{}
	var warm []Session
	for _, s := range sessions {
		if s.System == "" || seen[s.Key] {
			continue
		}
		seen[s.Key] = true
		warm = append(warm, Session{Key: s.Key, System: s.System, Turns: []Turn{{User: "warm", MaxTokens: 1}}})
	}
	picks := make([]int, len(warm))
	for i := range picks {
		picks[i] = rng.IntN(len(fleet.Engines))
	}
	cfg := LoadConfig{Concurrency: 64, Stream: true, RequestTimeout: time.Minute, TargetFor: func(i int) Target {
		return Target{URL: fleet.Engines[picks[i]].URL() + "/v1/chat/completions", Model: "sim-model", Client: client, Direct: true}
	}}
	recs := Run(ctx, Target{}, warm, cfg)
	for _, r := range recs {
		if !r.OK() {
			return fmt.Errorf("warming the fleet: %s", r.Err)
		}
	}
	if len(recs) != len(warm) {
		return fmt.Errorf("warming the fleet: %d of %d requests ran", len(recs), len(warm))
	}
	return nil
}

// restartEngines restarts one engine of the fleet every `every` of wall
// time, in turn, until the returned stop is called; stop waits for the
// restarter and returns how many restarts it made.
func restartEngines(ctx context.Context, fleet *SimFleet, every time.Duration) (stop func() int) {
	if every <= 0 {
		return func() int { return 0 }
	}
	ctx, cancel := context.WithCancel(ctx)
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			e := fleet.Engines[i%len(fleet.Engines)]
			if err := e.Restart(); err != nil {
				log.Printf("restarting engine %s: %v", e.Addr(), err)
				continue
			}
			n.Add(1)
		}
	}()
	return func() int {
		cancel()
		<-done
		return int(n.Load())
	}
}

// BurstStats describes how a burst workload's bursts were placed.
type BurstStats struct {
	Bursts int `json:"bursts"`
	// EnginesP50 and EnginesMax: engines per burst, from the gateway's
	// X-LLM-Upstream header (lb_policy llm only; 0 without it).
	EnginesP50 float64 `json:"engines_p50"`
	EnginesMax int     `json:"engines_max"`
	// Spread is the number of bursts on more than 2 engines.
	Spread int `json:"spread"`
	// HitRate is the cache hit rate of every burst's requests after its
	// first (by start time).
	HitRate float64 `json:"hit_rate"`
}

// burstStats groups the records into bursts of size consecutive sessions.
func burstStats(recs []Record, size int) *BurstStats {
	type burst struct {
		first   *Record
		engines map[string]bool
		recs    []*Record
	}
	bursts := map[int]*burst{}
	for i := range recs {
		r := &recs[i]
		b := bursts[r.Session/size]
		if b == nil {
			b = &burst{engines: map[string]bool{}}
			bursts[r.Session/size] = b
		}
		b.recs = append(b.recs, r)
		if b.first == nil || r.Start < b.first.Start {
			b.first = r
		}
		if r.Upstream != "" {
			b.engines[r.Upstream] = true
		}
	}
	st := &BurstStats{Bursts: len(bursts)}
	var counts []float64
	var prompt, cached int
	for _, b := range bursts {
		n := len(b.engines)
		counts = append(counts, float64(n))
		st.EnginesMax = max(st.EnginesMax, n)
		if n > 2 {
			st.Spread++
		}
		for _, r := range b.recs {
			if r != b.first && r.OK() {
				prompt += r.PromptTokens
				cached += r.CachedTokens
			}
		}
	}
	st.EnginesP50 = percentiles(counts).P50
	if prompt > 0 {
		st.HitRate = float64(cached) / float64(prompt)
	}
	return st
}

// routed keeps the records of requests that went through a gateway.
func routed(recs []Record) []Record {
	out := make([]Record, 0, len(recs))
	for _, r := range recs {
		if !r.Direct {
			out = append(out, r)
		}
	}
	return out
}
