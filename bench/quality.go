package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/localtok"
)

// The routing-quality section: the same workload and arrival rates through
// real Caddy processes that differ only in the load-balancing policy, in
// front of a fresh simulated fleet per run (cold caches for everyone).

// PolicySpec is one gateway configuration under test.
type PolicySpec struct {
	Name string `json:"name"`
	// Policy and Body are the lb_policy argument and block.
	Policy string `json:"policy"`
	Body   string `json:"body,omitempty"`
	// KV subscribes the gateway to the engines' KV events.
	KV bool `json:"kv"`
	// KeyHeader makes the load generator send the session key in this
	// header.
	KeyHeader string `json:"key_header,omitempty"`
	// InflightX sets every engine's max_inflight to this multiple of
	// max_num_seqs (0 = 1: admission never lets an engine queue).
	InflightX float64 `json:"inflight_x,omitempty"`
	// AppBody holds extra lines inside the llm app's block.
	AppBody string `json:"app_body,omitempty"`
	// LocalTokenizer gives the gateway the engines' real tokenizer
	// (QualityParams.Tokenizer) as its local tokenizer.
	LocalTokenizer bool `json:"local_tokenizer,omitempty"`
	// TextKeys leaves the model's image placeholder id out of the
	// gateway's config in an images scenario, so that it keys prompts
	// with images as text (matched up to the first image).
	TextKeys bool `json:"text_keys,omitempty"`
	// DataParallel runs the fleet as the ranks of one simulated
	// data-parallel server (`vllm serve --data-parallel-size`, the
	// fleet's engine count its ranks) behind one port, declared to the
	// gateway with data_parallel_size: each rank a routing target named
	// to the server in the X-data-parallel-rank header.
	DataParallel bool   `json:"data_parallel,omitempty"`
	Desc         string `json:"desc"`
}

// qualityPolicies are the five configurations compared.
func qualityPolicies() []PolicySpec {
	return []PolicySpec{
		{Name: "llm", Policy: "llm", Body: "debug_headers", KV: true, Desc: "lb_policy llm, KV events (precise)"},
		{Name: "llm-local", Policy: "llm", Body: "debug_headers", KV: true, LocalTokenizer: true, Desc: "lb_policy llm, KV events, the engines' tokenizer files read by the gateway (no /tokenize)"},
		{Name: "llm-approx", Policy: "llm", Body: "debug_headers", Desc: "lb_policy llm, no kv_events (approximate prefix tree)"},
		{Name: "llm-queue2x", Policy: "llm", Body: "debug_headers", KV: true, InflightX: 2, Desc: "lb_policy llm, KV events, max_inflight 2 × max_num_seqs (engines may queue)"},
		{Name: "llm-cachekey", Policy: "llm", Body: "cache_key_header X-Session-ID\ndebug_headers", KV: true, KeyHeader: "X-Session-ID", Desc: "lb_policy llm with cache_key_header (client key per group/session)"},
		{Name: "least_conn", Policy: "least_conn", Desc: "Caddy's least_conn"},
		{Name: "round_robin", Policy: "round_robin", Desc: "Caddy's round_robin"},
	}
}

// QualityPlan is one workload's ladder.
type QualityPlan struct {
	Workload WorkloadSpec `json:"workload"`
	// Rates are open-loop arrival rates, as multiples of the fleet's
	// estimated capacity without cache hits (CapMiss).
	Rates []float64 `json:"rates"`
	// Scenario, when set, is how the plan departs from a plain quality
	// run (the scenarios section).
	Scenario *ScenarioOptions `json:"scenario,omitempty"`
}

// QualityParams are the section's settings.
type QualityParams struct {
	Engines   int         `json:"engines"`
	Model     EngineModel `json:"model"`
	Rho       float64     `json:"rho"`
	TimeScale float64     `json:"time_scale"`
	MaxPark   float64     `json:"max_park_sim_seconds"`
	// PollInterval is the gateway's poll_interval (wall time).
	PollInterval time.Duration `json:"poll_interval_ns"`
	// LagThreshold and MaxRetries: a run whose SimLag exceeds the
	// threshold is run again, at most MaxRetries times over the section,
	// keeping the attempt that lagged least.
	LagThreshold float64 `json:"lag_threshold"`
	MaxRetries   int     `json:"max_retries"`
	// RetryWindow: no run is repeated once the section has been running
	// this long (seconds), to keep the whole run bounded.
	RetryWindow float64       `json:"retry_window_seconds"`
	Plans       []QualityPlan `json:"plans"`
	Policies    []PolicySpec  `json:"policies"`
	// Tokenizer names a real tokenizer (realTokenizer) the engines
	// tokenize with, which llm-local's gateway reads too; "" = the
	// simulator's word tokenizer, on which the workloads' token counts
	// are exact, and no llm-local.
	Tokenizer string `json:"tokenizer,omitempty"`

	tokDir string          // Tokenizer's directory, once resolved
	tok    *localtok.Model // and loaded
}

// QualityRun is one (workload, policy, rate) result.
type QualityRun struct {
	Workload string  `json:"workload"`
	Policy   string  `json:"policy"`
	RateX    float64 `json:"rate_x"` // multiple of CapMiss
	Rate     float64 `json:"rate"`   // requests per simulated second
	Summary  Summary `json:"summary"`
	// Engine-side truth: cached/prompt tokens as the engines counted them,
	// and preemptions.
	EngineHitRate float64 `json:"engine_hit_rate"`
	Preemptions   uint64  `json:"preemptions"`
	// PerEngine is how many requests each engine served.
	PerEngine []uint64 `json:"per_engine"`
	// Gateway cost during the run.
	CaddyCPU   float64 `json:"caddy_cpu_seconds"`
	HarnessCPU float64 `json:"harness_cpu_seconds"`
	Wall       float64 `json:"wall_seconds"`
	// HostWait is how many seconds per wall second the harness's and
	// Caddy's threads were runnable but waiting for a CPU: the host's
	// contention during the run. The simulated engines lose capacity when
	// they cannot run on time, so runs with a high HostWait understate
	// every policy.
	HostWait float64 `json:"host_wait"`
	CaddyRSS int64   `json:"caddy_rss_bytes"`
	// Stalled: no request finished for 60 s while some were in flight;
	// the run was cut (see the log for the engines' and gateway's state).
	Stalled bool `json:"stalled,omitempty"`
	// SimLag is how much slower than scheduled the simulated engines ran
	// (1 = on time): the mean decode pace (gap between streamed tokens ÷
	// decode step), corrected for the prefill steps the engines were
	// expected to interleave; 0 when it cannot be estimated (uneven load
	// or preemptions). Above LagThreshold the host, not the routing,
	// slowed the run, and it is run again (Attempts).
	SimLag   float64 `json:"sim_lag"`
	Attempts int     `json:"attempts"`
	// Decisions counts llmgw_prefix_decisions_total by "tier/outcome",
	// summed over the gateways.
	Decisions map[string]float64 `json:"decisions,omitempty"`
	// Scenario runs: requests sent straight to engines (left out of
	// Summary, which is of the gateways' requests), engine restarts made,
	// and the bursts' placement.
	Bypassed int         `json:"bypassed,omitempty"`
	Restarts int         `json:"restarts,omitempty"`
	Bursts   *BurstStats `json:"bursts,omitempty"`
	// Models holds a multimodel run's figures: requests sent to engines
	// that do not serve their model, and adapter placement.
	Models *ModelStats `json:"models,omitempty"`
	// Images holds an images run's figures: the blocks past the image
	// that hit, and how the gateway keyed the prompts.
	Images *ImageStats `json:"images,omitempty"`
	// Ranks holds a data-parallel run's figures: how the requests named
	// their rank at the server, and whether the rank that served each is
	// the gateway's pick.
	Ranks *RankStats `json:"ranks,omitempty"`
}

// QualityWorkload is one workload's derived fleet settings.
type QualityWorkload struct {
	Spec WorkloadSpec `json:"spec"`
	// Engines is the fleet's size for this workload (0 in results saved
	// before it was recorded: the section's).
	Engines  int     `json:"engines,omitempty"`
	KVBlocks int     `json:"kv_blocks"`
	Rho      float64 `json:"rho"`
	CapMiss  float64 `json:"cap_miss"` // fleet req/s, no cache hits
	CapHit   float64 `json:"cap_hit"`  // fleet req/s, every shared prefix cached
	// Model and TimeScale are the engines' for this workload.
	Model     EngineModel      `json:"model"`
	TimeScale float64          `json:"time_scale"`
	Scenario  *ScenarioOptions `json:"scenario,omitempty"`
}

// QualityResult is the section's output.
type QualityResult struct {
	Params    QualityParams     `json:"params"`
	Workloads []QualityWorkload `json:"workloads"`
	Runs      []QualityRun      `json:"runs"`
	// LateJoin holds the late-join plans' results, which are no runs of
	// a rate ladder.
	LateJoin []LateJoinResult `json:"late_join,omitempty"`
}

// derive computes a workload's fleet settings.
func (p QualityParams) derive(w WorkloadSpec) QualityWorkload {
	blocks, rho := p.Model.KVBlocks(w, p.Engines, p.Rho)
	prompt := w.PromptTokens()
	if w.Kind == "multiturn" {
		prompt = w.SystemTokens + (w.Turns+1)/2*(w.QuestionTokens+w.OutputTokens) // the mean turn
	}
	shared := min(w.SharedTokens(), prompt)
	if w.Kind == "multiturn" {
		shared = prompt - w.QuestionTokens
	}
	n := float64(p.Engines)
	return QualityWorkload{
		Spec: w, Engines: p.Engines, KVBlocks: blocks, Rho: rho, Model: p.Model, TimeScale: p.TimeScale,
		CapMiss: n * p.Model.Capacity(prompt, 0, w.OutputTokens),
		CapHit:  n * p.Model.Capacity(prompt, shared, w.OutputTokens),
	}
}

// runQuality runs every plan × policy × rate.
func runQuality(ctx context.Context, env *Env, p QualityParams) (*QualityResult, error) {
	res := &QualityResult{Params: p}
	retries := 0
	sectionStart := time.Now()
	section := p
	if p.Tokenizer != "" {
		var err error
		if section.tokDir, section.tok, err = realTokenizer(ctx, env.Root, p.Tokenizer); err != nil {
			return nil, err
		}
	}
	for _, plan := range section.Plans {
		p := plan.Scenario.apply(section)
		qw := p.derive(plan.Workload)
		qw.Scenario = plan.Scenario
		res.Workloads = append(res.Workloads, qw)
		sessions, err := plan.Workload.Build(p.Model.tokenScale())
		if err != nil {
			return nil, err
		}
		if plan.Scenario.lateJoin() {
			lj, err := runLateJoin(ctx, env, p, qw, sessions)
			if lj != nil {
				res.LateJoin = append(res.LateJoin, *lj)
			}
			if err != nil {
				return res, fmt.Errorf("%s: %w", plan.Workload.Name, err)
			}
			continue
		}
		for _, x := range plan.Rates {
			for _, pol := range p.Policies {
				if !plan.Scenario.runs(pol.Name) {
					continue
				}
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				run, err := runQualityOne(ctx, env, p, qw, sessions, pol, x)
				if err != nil {
					return res, fmt.Errorf("%s/%s/%.2fx: %w", plan.Workload.Name, pol.Name, x, err)
				}
				run.Attempts = 1
				for run.SimLag > p.LagThreshold && retries < p.MaxRetries && time.Since(sectionStart).Seconds() < p.RetryWindow && ctx.Err() == nil {
					retries++
					log.Printf("quality %s %s %.2fx: the simulation ran %.0f%% slow (host contention), running it again", plan.Workload.Name, pol.Name, x, (run.SimLag-1)*100)
					again, err := runQualityOne(ctx, env, p, qw, sessions, pol, x)
					if err != nil {
						return res, fmt.Errorf("%s/%s/%.2fx: %w", plan.Workload.Name, pol.Name, x, err)
					}
					again.Attempts = run.Attempts + 1
					if again.SimLag < run.SimLag {
						run = again
					} else {
						run.Attempts = again.Attempts
					}
				}
				s := run.Summary
				log.Printf("quality %-14s %-12s %.2fx (%5.1f req/s): ok %d/%d rej %d err %d hit %.3f ttft p50 %.2fs p90 %.2fs p99 %.2fs itl p50 %.0fms tok/s %.0f caddy cpu %.1fs harness %.1fs wall %.1fs lag %.2f",
					plan.Workload.Name, pol.Name, x, run.Rate, s.OK, s.Requests, s.Rejected, s.Errors+s.Timeouts, s.HitRate,
					s.TTFT.P50, s.TTFT.P90, s.TTFT.P99, s.ITL.P50*1000, s.OutputTPS, run.CaddyCPU, run.HarnessCPU, run.Wall, run.SimLag)
				if s.FirstErr != "" {
					log.Printf("  first error: %s", s.FirstErr)
				}
				if c := s.Calibration; c != nil {
					log.Printf("  TTFT prediction: |predicted − observed| ÷ observed p50 %.0f%% p90 %.0f%%, signed p50 %+.0f%% (%d requests)",
						c.AbsP50*100, c.AbsP90*100, c.BiasP50*100, c.N)
				}
				if m := run.Models; m != nil {
					log.Printf("  models: %d sent to an engine not serving them, %d answered 404; adapter arrivals %d, %d joining their adapter in flight (%.1f%%), %d LoRA loads",
						m.Unserved, m.NotFound, m.AdapterArrivals, m.AdapterInFlight, m.InFlightShare()*100, m.LoRALoads)
				}
				res.Runs = append(res.Runs, run)
			}
		}
	}
	return res, nil
}

func runQualityOne(ctx context.Context, env *Env, p QualityParams, qw QualityWorkload, sessions []Session, pol PolicySpec, x float64) (QualityRun, error) {
	run := QualityRun{Workload: qw.Spec.Name, Policy: pol.Name, RateX: x, Rate: x * qw.CapMiss}
	sc := qw.Scenario
	fleet, err := startRunFleet(ctx, p, qw, pol)
	if err != nil {
		return run, err
	}
	defer fleet.Close()
	dir := filepath.Join(env.Out, "runs", fmt.Sprintf("%s-%s-%.2f", qw.Spec.Name, pol.Name, x))
	gcfg := p.gatewayConfig(fleet, pol)
	gcfg.Dynamic = sc.models() != nil
	if qw.Spec.ImageTokens > 0 && !pol.TextKeys {
		gcfg.AppBody += fmt.Sprintf("\ntokenizer * remote %d", imagePadID)
	}
	gws, err := startGateways(ctx, env.Caddy, dir, gcfg, sc.gateways(), pol.KV)
	if err != nil {
		return run, err
	}
	defer stopGateways(gws)

	tr := &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	targets := make([]Target, len(gws))
	for i, gw := range gws {
		targets[i] = Target{URL: gw.URL, Model: "sim-model", KeyHeader: pol.KeyHeader, Client: client}
	}
	if sc != nil && sc.Warm {
		if err := warmFleet(ctx, fleet, sessions, client, qw.Spec.Seed+13); err != nil {
			return run, err
		}
	}
	var offsets map[string]int
	if qw.Spec.ImageTokens > 0 {
		if offsets, err = imageOffsets(ctx, engineTokenize{url: fleet.Engines[0].URL(), model: "sim-model", client: client}, sessions); err != nil {
			return run, err
		}
	}
	recs, err := p.measure(ctx, env, &run, measured{fleet: fleet, gws: gws, dir: dir, targets: targets, sessions: sessions, seed: qw.Spec.Seed, sc: sc})
	if err != nil {
		return run, err
	}
	run.Summary = Summarize(routed(recs), p.TimeScale, p.Model.tokenScale())
	run.Bypassed = len(recs) - run.Summary.Requests
	p.scenarioFigures(&run, ranRun{fleet: fleet, sc: sc, recs: recs, sessions: sessions, offsets: offsets})
	t := fleet.Totals()
	if t.PromptTokens > 0 {
		run.EngineHitRate = float64(t.CachedTokens) / float64(t.PromptTokens)
	}
	run.Preemptions = t.Preemptions
	for _, e := range fleet.Engines {
		run.PerEngine = append(run.PerEngine, e.Stats().RequestsServed)
	}
	if lagApplies(&run) {
		run.SimLag = simLag(recs, p)
	}
	if err := saveRecords(filepath.Join(dir, "records.jsonl"), recs); err != nil {
		log.Printf("saving records: %v", err)
	}
	gatewayMetrics(ctx, gws, &run)
	return run, nil
}

// ranRun is what a finished run's scenario figures are read from: its
// fleet and plan, every request's record, the sessions sent and, in an
// images run, where each prompt's image starts.
type ranRun struct {
	fleet    *SimFleet
	sc       *ScenarioOptions
	recs     []Record
	sessions []Session
	offsets  map[string]int
}

// scenarioFigures adds to run the figures of its scenario: how bursts
// were placed, models served, images matched, data-parallel ranks named.
func (p QualityParams) scenarioFigures(run *QualityRun, r ranRun) {
	if r.sc != nil && r.sc.BurstSize > 1 {
		run.Bursts = burstStats(r.recs, r.sc.BurstSize)
	}
	if mf := r.sc.models(); mf != nil {
		run.Models = modelStats(engineModels(r.fleet), r.recs, r.sessions, mf.adapters(), p.TimeScale)
	}
	if r.offsets != nil {
		run.Images = imageStats(routed(r.recs), r.sessions, r.offsets, p.Model.BlockSize)
	}
	if r.fleet.DP != nil {
		run.Ranks = serverRankStats(r.fleet.DP)
		run.Ranks.compare(routed(r.recs), r.fleet.DP.Addr())
	}
}

// startRunFleet starts a run's fleet: p.Engines engines, or for a
// DataParallel policy one data-parallel server of as many ranks, each
// configured as one of those engines.
func startRunFleet(ctx context.Context, p QualityParams, qw QualityWorkload, pol PolicySpec) (*SimFleet, error) {
	configure := engineConfig(qw)
	if !pol.DataParallel {
		return startSimFleetWith(ctx, p.Engines, p.Model, qw.KVBlocks, p.TimeScale, p.tok, configure)
	}
	if configure != nil {
		return nil, fmt.Errorf("policy %s: a data-parallel fleet serves one model, without images", pol.Name)
	}
	return startDPFleet(ctx, p.Engines, simConfig(p.Model, qw.KVBlocks, p.TimeScale, p.tok))
}

// gatewayMetrics adds the gateways' routing decisions to run, and in an
// images run how they keyed the prompts; a gateway whose metrics cannot
// be read adds nothing.
func gatewayMetrics(ctx context.Context, gws []*Gateway, run *QualityRun) {
	for _, gw := range gws {
		if run.Images != nil {
			if m, err := gw.Metrics(ctx, "llmgw_multimodal_prompts_total"); err == nil {
				run.Images.addMultimodalMetric(m)
			}
		}
		m, err := gw.Metrics(ctx, "llmgw_prefix_decisions_total")
		if err != nil {
			continue
		}
		if run.Decisions == nil {
			run.Decisions = map[string]float64{}
		}
		for k, v := range m {
			run.Decisions[labelsKey(k)] += v
		}
	}
}

// engineConfig adjusts each engine of a workload's fleet: its models
// (a multimodel scenario) and its image placeholder count (an images
// workload); nil when there is nothing to adjust.
func engineConfig(qw QualityWorkload) func(int, *vllmsim.Config) {
	mf, images := qw.Scenario.models(), qw.Spec.ImageTokens
	if mf == nil && images == 0 {
		return nil
	}
	return func(i int, c *vllmsim.Config) {
		if mf != nil {
			mf.configure(i, c)
		}
		c.ImageTokens = images
	}
}

// gatewayConfig is the Caddyfile of a run with policy pol.
func (p QualityParams) gatewayConfig(fleet *SimFleet, pol PolicySpec) GatewayConfig {
	maxPark := time.Duration(p.MaxPark / p.TimeScale * float64(time.Second))
	refs := fleet.Refs(pol.KV)
	if pol.InflightX > 0 {
		for i := range refs {
			refs[i].MaxInflight = int(pol.InflightX * float64(refs[i].MaxInflight))
		}
	}
	appBody := pol.AppBody
	if pol.LocalTokenizer {
		appBody += fmt.Sprintf("\ntokenizer sim-model %q\n", p.tokDir)
	}
	return GatewayConfig{
		Engines:    refs,
		Policy:     pol.Policy,
		PolicyBody: pol.Body,
		AppBody:    appBody,
		Admission:  true,
		// engine_queue 1, as the README advises beside max_inflight =
		// max_num_seqs: a full engine refills a freed slot from its own
		// queue at once. It is admission's, so every policy has it.
		AdmissionBody: fmt.Sprintf("max_park %s\nheartbeat 5s\nqueue_size 4096\nengine_queue 1", maxPark.Round(time.Millisecond)),
		PollInterval:  p.PollInterval,
	}
}

// measured is what one run's load goes through.
type measured struct {
	fleet    *SimFleet
	gws      []*Gateway
	dir      string
	targets  []Target
	sessions []Session
	seed     uint64
	sc       *ScenarioOptions
}

// measure runs the load against the gateways and records the gateways'
// and the harness's CPU, the host's contention and Caddy's memory into
// run; it returns every request's record.
func (p QualityParams) measure(ctx context.Context, env *Env, run *QualityRun, m measured) ([]Record, error) {
	gwPids := pids(m.gws)
	cpu0, err := cpuOf(gwPids)
	if err != nil {
		return nil, err
	}
	self0, _ := procCPU(os.Getpid())
	wait0 := runqueueWait(append([]int{os.Getpid()}, gwPids...)...)
	start := time.Now()
	prog := &Progress{}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	runCtx, abort := context.WithCancel(ctx)
	defer abort()
	var stalled atomic.Bool
	go watchStalls(wctx, prog, m.fleet, m.gws[0], m.dir, func() { stalled.Store(true); abort() })
	cfg := LoadConfig{
		Progress:       prog,
		Rate:           run.Rate / float64(max(1, len(m.sessions[0].Turns))),
		Concurrency:    4096,
		TimeScale:      p.TimeScale,
		Deadline:       env.RunDeadline,
		RequestTimeout: env.RunDeadline,
		Stream:         true,
		Seed:           m.seed + 7,
		TargetFor:      sessionTargets(m.sc, m.targets, m.fleet, len(m.sessions), m.seed+11),
	}
	var restartEvery time.Duration
	if sc := m.sc; sc != nil {
		cfg.BurstSize, cfg.BurstWindow = sc.BurstSize, sc.BurstWindow
		restartEvery = time.Duration(sc.RestartEvery / p.TimeScale * float64(time.Second))
	}
	stopRestarts := restartEngines(runCtx, m.fleet, restartEvery)
	recs := Run(runCtx, m.targets[0], m.sessions, cfg)
	run.Restarts = stopRestarts()
	run.Wall = time.Since(start).Seconds()
	run.Stalled = stalled.Load()
	cpu1, err := cpuOf(gwPids)
	if err != nil {
		return nil, err
	}
	self1, _ := procCPU(os.Getpid())
	run.HostWait = (runqueueWait(append([]int{os.Getpid()}, gwPids...)...) - wait0).Seconds() / run.Wall
	run.CaddyCPU, run.HarnessCPU = (cpu1 - cpu0).Seconds(), (self1 - self0).Seconds()
	for _, pid := range gwPids {
		rss, _, _ := procRSS(pid)
		run.CaddyRSS += rss
	}
	return recs, nil
}

// labelsKey turns `name{outcome="hit",tier="precise"}` into
// "precise/hit".
func labelsKey(sample string) string {
	get := func(label string) string {
		i := strings.Index(sample, label+`="`)
		if i < 0 {
			return ""
		}
		rest := sample[i+len(label)+2:]
		if j := strings.IndexByte(rest, '"'); j >= 0 {
			return rest[:j]
		}
		return rest
	}
	return get("tier") + "/" + get("outcome")
}

// watchStalls logs the fleet's and the gateway's state when requests are
// in flight but none has finished for 20 s, so a hang is diagnosable from
// the log, and calls abort after 60 s without progress. It returns when ctx
// ends.
func watchStalls(ctx context.Context, prog *Progress, fleet *SimFleet, gw *Gateway, dir string, abort func()) {
	last, since := int64(-1), time.Now()
	reported := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		fin := prog.Finished.Load()
		if fin != last {
			last, since, reported = fin, time.Now(), false
			continue
		}
		inflight := prog.Started.Load() - fin
		if inflight == 0 || time.Since(since) < 20*time.Second {
			continue
		}
		if time.Since(since) > 60*time.Second {
			log.Printf("STALL: aborting the run (%s)", dir)
			abort()
			return
		}
		if reported {
			continue
		}
		reported = true
		var b strings.Builder
		fmt.Fprintf(&b, "STALL: %d requests in flight, none finished for %s (%s)\n", inflight, time.Since(since).Round(time.Second), dir)
		for _, e := range fleet.Engines {
			st := e.Stats()
			fmt.Fprintf(&b, "  engine %s: running %d waiting %d kv %.3f cached_blocks %d served %d preemptions %d\n",
				e.Addr(), st.Running, st.Waiting, st.KVCacheUsage, st.CachedBlocks, st.RequestsServed, st.Preemptions)
		}
		log.Print(b.String())
		b.Reset()
		// The admin API may be stuck too (that is how the gateway's lock
		// bugs show): bounded calls, and say so.
		c := &http.Client{Timeout: 3 * time.Second}
		var states []map[string]any
		if err := getJSON(ctx, c, gw.AdminBase+"/llm/engines", &states); err != nil {
			fmt.Fprintf(&b, "  gateway /llm/engines: %v\n", err)
		}
		for _, s := range states {
			fmt.Fprintf(&b, "  gateway view %v: running %v waiting %v kv %v inflight %v dispatched %v breaker %v\n",
				s["dial"], s["running"], s["waiting"], s["kv_cache_usage"], s["local_inflight"], s["dispatched_since_scrape"], s["breaker"])
		}
		var queue any
		if err := getJSON(ctx, c, gw.AdminBase+"/llm/queue", &queue); err != nil {
			fmt.Fprintf(&b, "  gateway /llm/queue: %v\n", err)
		} else {
			fmt.Fprintf(&b, "  queue: %v\n", queue)
		}
		if err := saveGoroutines(ctx, c, gw, filepath.Join(dir, "goroutines.txt")); err != nil {
			fmt.Fprintf(&b, "  goroutine dump: %v\n", err)
		} else {
			fmt.Fprintf(&b, "  goroutine dump: %s\n", filepath.Join(dir, "goroutines.txt"))
		}
		log.Print(b.String())
	}
}

// saveGoroutines writes Caddy's goroutine dump (admin /debug/pprof).
func saveGoroutines(ctx context.Context, c *http.Client, gw *Gateway, path string) error {
	return saveGet(ctx, c, gw.AdminBase+"/debug/pprof/goroutine?debug=2", path)
}

// saveRecords writes one JSON record per line, for digging into a run.
func saveRecords(path string, recs []Record) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// runqueueWait sums the run-queue wait of the given processes.
func runqueueWait(pids ...int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		if w, err := procRunqueueWait(pid); err == nil {
			total += w
		}
	}
	return total
}

// simLag estimates how much slower than scheduled the engines ran. A
// decoding request gets one token per engine step; a step lasts the decode
// step plus whatever prefill it carries, so on time the mean gap between
// a request's tokens is step ÷ (1 − f), f being the share of the engines'
// busy time spent prefilling. f comes from the run's uncached prompt
// tokens over the engines' busy time (an engine counts as busy while the
// fleet has at least as many requests in flight as engines); the measured
// mean gap × (1 − f) ÷ step is then 1 when the simulation kept time and
// grows when the host could not run it. The estimate assumes the load was
// spread evenly and nothing was preempted (recomputed prompts are prefill
// it does not count); callers check that (lagApplies).
func simLag(recs []Record, p QualityParams) float64 {
	step := p.Model.DecodeStepSeconds * float64(p.Model.tokenScale())
	var rs []*Record
	for i := range recs {
		if r := &recs[i]; r.OK() && r.Chunks >= 2 {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return 0
	}
	f := prefillShare(rs, p.Engines, p)
	var paceSum float64
	for _, r := range rs {
		gap := (r.E2E - r.TTFT).Seconds() * p.TimeScale / float64(r.Chunks-1)
		paceSum += gap / step
	}
	return paceSum / float64(len(rs)) * (1 - f)
}

// lagApplies reports whether simLag's assumptions held for a run: no
// preemption, and no engine served more than 1.3 times the mean.
func lagApplies(run *QualityRun) bool {
	if run.Preemptions > 0 || len(run.PerEngine) == 0 {
		return false
	}
	var sum, most uint64
	for _, n := range run.PerEngine {
		sum += n
		most = max(most, n)
	}
	return float64(most)*float64(len(run.PerEngine)) <= 1.3*float64(sum)
}

// prefillShare is the share of busy engine time the requests' uncached
// prompt tokens took to prefill, with busy time counted as min(engines,
// requests in flight).
func prefillShare(rs []*Record, engines int, p QualityParams) float64 {
	type edge struct {
		t time.Duration
		d int
	}
	var prefill float64
	edges := make([]edge, 0, 2*len(rs))
	for _, r := range rs {
		prefill += float64(r.PromptTokens-r.CachedTokens) / p.Model.PrefillTokensPerSec
		edges = append(edges, edge{r.Start, 1}, edge{r.Start + r.E2E, -1})
	}
	sort.Slice(edges, func(i, j int) bool { return edges[i].t < edges[j].t })
	var busy float64
	inFlight := 0
	last := edges[0].t
	for _, e := range edges {
		busy += float64(min(engines, inFlight)) * (e.t - last).Seconds() * p.TimeScale
		inFlight += e.d
		last = e.t
	}
	if busy <= 0 {
		return 0
	}
	return min(prefill/busy, 0.95)
}
