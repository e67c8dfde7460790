package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestQuickSmoke runs every section of the harness end to end on a tiny
// plan — a real Caddy process built from this checkout in front of two
// simulated engines, the fleet simulation on four engines, the overhead
// phases — and checks that each produced numbers, a report and plots. It
// asserts nothing about speed.
// smokeDeadline bounds each end-to-end smoke test, Caddy's build included.
const smokeDeadline = 12 * time.Minute

func TestQuickSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Caddy and runs the harness end to end")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// The deadline only stops a hang: it also covers building Caddy, which
	// took over 4 minutes with a cold build cache on 2 cores shared with the
	// rest of the suite.
	ctx, cancel := context.WithTimeout(context.Background(), smokeDeadline)
	defer cancel()
	root, err := repoRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	o := Options{
		Out: out, Markdown: filepath.Join(out, "BENCHMARKS.md"), Plots: filepath.Join(out, "plots"), PlotExt: ".svg",
		Only: map[string]bool{"quality": true, "scenarios": true, "fleet": true, "overhead": true, "trace": true},
	}
	env := &Env{Root: root, Out: out, Quick: true, RunDeadline: time.Minute, Command: "go -C bench test -run TestQuickSmoke ."}
	if err := runSections(ctx, env, o, smokePlan(), t.TempDir(), time.Now()); err != nil {
		t.Fatal(err)
	}

	l, err := loadSections(out)
	if err != nil {
		t.Fatal(err)
	}
	if l.quality == nil || l.fleet == nil || l.overhead == nil {
		t.Fatalf("missing section results: quality %v fleet %v overhead %v", l.quality != nil, l.fleet != nil, l.overhead != nil)
	}
	if len(l.quality.Runs) != 2 {
		t.Fatalf("quality runs = %d, want 2", len(l.quality.Runs))
	}
	// Caddy's CPU is read in clock ticks (10 ms): one tiny run may take
	// less than a tick, so the section as a whole must show some.
	var caddyCPU float64
	for _, r := range l.quality.Runs {
		s := r.Summary
		if s.OK == 0 || s.Prompt == 0 || s.Output == 0 || s.TTFT.N == 0 || s.TTFT.P50 <= 0 || s.ITL.N == 0 {
			t.Errorf("quality %s: no numbers: %+v", r.Policy, s)
		}
		if r.CaddyCPU < 0 {
			t.Errorf("quality %s: negative Caddy CPU %v", r.Policy, r.CaddyCPU)
		}
		caddyCPU += r.CaddyCPU
	}
	if caddyCPU <= 0 {
		t.Errorf("Caddy CPU not measured in any quality run")
	}
	// The llm policy decided every request (its decision counters come
	// from the Caddy process's metrics).
	llm := l.quality.at("tiny", "llm", 1)
	var decided float64
	if llm != nil {
		for _, v := range llm.Decisions {
			decided += v
		}
	}
	if llm == nil || decided < float64(llm.Summary.Requests) {
		t.Errorf("llm run: %v decisions for its requests: %+v", decided, llm)
	}
	checkScenarios(t, l.scenarios)
	checkTrace(t, l.trace)
	if len(l.fleet.Runs) != 2 {
		t.Fatalf("fleet runs = %d, want 2", len(l.fleet.Runs))
	}
	for _, r := range l.fleet.Runs {
		if r.Completed == 0 || r.TTFT.N == 0 || r.SimSeconds <= 0 {
			t.Errorf("fleet %s: no numbers: %+v", r.Policy, r)
		}
		if r.Policy == "llm" && (r.DecisionNs.N == 0 || r.EventBatches == 0 || r.MirrorProblems != 0) {
			t.Errorf("fleet llm: decisions %d, event batches %d, mirror problems %d", r.DecisionNs.N, r.EventBatches, r.MirrorProblems)
		}
	}
	wantTargets := 5 // plain, admission, approx, llm, direct
	if l.overhead.Params.Tokenizer != "" {
		wantTargets = 6 // and llm-local
	}
	if len(l.overhead.Stats) != wantTargets {
		t.Fatalf("overhead stats = %d, want %d", len(l.overhead.Stats), wantTargets)
	}
	for _, s := range l.overhead.Stats {
		if s.Requests == 0 || s.Latency.P50 <= 0 {
			t.Errorf("overhead %s: no numbers: %+v", s.Target, s)
		}
		if s.Target != "direct" && s.CPUPerReq <= 0 {
			t.Errorf("overhead %s: CPU per request not measured", s.Target)
		}
	}

	md, err := os.ReadFile(o.Markdown)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Headline", "## 1. Routing quality", "## 2. Where only the engines know", "## 3. Fleet simulation", "## 4. Gateway overhead", "Layer by layer", "### Production trace", "ttft_p90_tiny.svg", "hit_rate.svg"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	plots, err := filepath.Glob(filepath.Join(o.Plots, "*.svg"))
	if err != nil || len(plots) < 6 {
		t.Errorf("plots: %v (%v)", plots, err)
	}
	raw, err := os.ReadFile(filepath.Join(out, "quality.json"))
	if err != nil || !json.Valid(raw) {
		t.Errorf("quality.json unreadable: %v", err)
	}
}

// smokePlan is the smallest plan that exercises every code path.
func smokePlan() Plan {
	q := qualityParams(true)
	q.Engines = 2
	q.Plans = []QualityPlan{{Workload: WorkloadSpec{Name: "tiny", Kind: "prefix", Groups: 4, PerGroup: 3, SystemTokens: 256, QuestionTokens: 32, OutputTokens: 32,
		Reference: "smoke", Seed: 1}, Rates: []float64{1}}}
	var pols []PolicySpec
	for _, p := range q.Policies {
		if p.Name == "llm" || p.Name == "round_robin" {
			pols = append(pols, p)
		}
	}
	q.Policies = pols
	f := fleetParams(true)
	f.Sizes, f.Requests = []int{4}, 400
	f.Variants = []FleetVariant{{Name: "llm", Policy: "llm", Load: 1}, {Name: "round_robin", Policy: "round_robin", Load: 1}}
	ov := overheadParams(true)
	ov.Engines, ov.Concurrency, ov.Phase, ov.Warmup = 2, 4, 0.5, 0.2
	ov.Bodies = ov.Bodies[:1]
	// llm-local needs the real tokenizer files, which ./xcaddy.sh test
	// fetches (and CI requires); a bare go test runs without it.
	if os.Getenv("LLMGW_TOKENIZER_FILES") == "" {
		ov.Tokenizer = ""
	}
	sc := scenarioParams(true)
	sc.Engines = 2
	tr := traceParams(true, filepath.Join("traces", "conversation_trace.jsonl.gz"))
	tr.Policies = []string{"llm", "round_robin"}
	return Plan{Quality: q, Scenarios: sc, Fleet: f, Overhead: ov, Trace: tr}
}

// checkTrace checks the smoke plan's trace replays: the fleet simulation's
// two rungs and the real-Caddy rung, each policy with completed requests
// and TTFTs, the simulation's hit rates within the trace's ceiling.
func checkTrace(t *testing.T, tr *TraceResult) {
	t.Helper()
	if tr == nil || tr.Ceiling.Requests != 200 || tr.CaddyCeiling == nil || tr.CaddyCeiling.Requests != 24 || tr.Commit == "" {
		t.Fatalf("trace: want 200 requests simulated, 24 through Caddy, a commit: %+v", tr)
	}
	count := map[string]int{}
	for _, r := range tr.Runs {
		count[r.Replay]++
		if r.Completed == 0 || r.TTFT.N != r.Completed || r.TTFT.P50 <= 0 || r.HitRate < 0 {
			t.Errorf("trace %s %s %.2gx: no numbers: %+v", r.Replay, r.Policy, r.Speedup, r)
		}
		if r.Replay == "fleetsim" && (r.Completed+r.Rejected != 200 || r.HitRate > tr.Ceiling.TokenRate) {
			t.Errorf("trace fleetsim %s %.2gx: %d + %d of 200 requests, hit rate %.3f above the ceiling %.3f", r.Policy, r.Speedup, r.Completed, r.Rejected, r.HitRate, tr.Ceiling.TokenRate)
		}
	}
	if count["fleetsim"] != 4 || count["caddy"] != 2 {
		t.Errorf("trace runs: %v, want 4 simulated and 2 through Caddy", count)
	}
}

// checkScenarios checks the smoke plan's scenarios: two gateways with
// bypassing traffic, a warm-up and restarts; a burst; the late-join, the
// multimodel and the images scenarios.
func checkScenarios(t *testing.T, q *QualityResult) {
	t.Helper()
	if q == nil || len(q.Runs) != 9 {
		t.Fatalf("scenario runs: %+v, want 9 (2 gateways-2, 1 burst, 2 multimodel, 2 images, 2 dp-ranks)", q)
	}
	for _, pol := range []string{"llm", "llm-approx"} {
		r := q.at("gateways-2", pol, 1)
		if r == nil || r.Summary.OK == 0 || r.Bypassed == 0 || r.Restarts == 0 || r.Summary.Requests+r.Bypassed != 32 {
			t.Errorf("gateways-2 %s: want completed, bypassed and restarts, 32 requests: %+v", pol, r)
		}
	}
	if r := q.at("gateways-2", "llm", 1); r != nil {
		var decided float64
		for _, v := range r.Decisions {
			decided += v
		}
		if decided < float64(r.Summary.Requests) {
			t.Errorf("gateways-2 llm: %v decisions over both gateways for %d routed requests", decided, r.Summary.Requests)
		}
	}
	b := q.at("burst", "llm", 0.8)
	if b == nil || b.Bursts == nil || b.Bursts.Bursts != 3 || b.Bursts.EnginesMax < 1 {
		t.Errorf("burst llm: want 3 bursts with engines counted: %+v", b)
	}
	checkLateJoin(t, q)
	checkMultiModel(t, q)
	checkImages(t, q)
	checkDPRanks(t, q)
}

// checkDPRanks checks the smoke plan's dp-ranks runs: every request
// completed on both fleets; the data-parallel server saw each of them
// with a rank of its own in X-data-parallel-rank, the rank the gateway
// picked, and each rank served what was pinned to it; the separate
// engines' run has no rank figures.
func checkDPRanks(t *testing.T, q *QualityResult) {
	t.Helper()
	sep, dp := q.at("dp-ranks", "llm", 1), q.at("dp-ranks", dpPolicy, 1)
	if sep == nil || dp == nil || dp.Ranks == nil || sep.Ranks != nil {
		t.Fatalf("dp-ranks: want llm and %s runs, rank figures for the latter only: %+v, %+v", dpPolicy, sep, dp)
	}
	for _, r := range []*QualityRun{sep, dp} {
		if r.Summary.OK != 12 || len(r.PerEngine) != 2 {
			t.Errorf("dp-ranks %s: %d of %d completed, per engine %v", r.Policy, r.Summary.OK, r.Summary.Requests, r.PerEngine)
		}
	}
	st := dp.Ranks
	if st.Requests() != 12 || st.Unranked() != 0 || st.Checked != 12 || st.Mismatched != 0 {
		t.Errorf("dp-ranks: the server counted %+v, want 12 requests each with the gateway's pick", st)
	}
	for i, n := range st.Pinned {
		if n != dp.PerEngine[i] {
			t.Errorf("dp-ranks: ranks pinned %v, served %v: want each rank to serve what was pinned to it", st.Pinned, dp.PerEngine)
			break
		}
	}
}

// checkImages checks the smoke plan's images runs: every request
// completed, `llm`'s gateway keyed all 6 prompts with their images and
// round_robin's none (it does not route on prefixes), the 3 requests of
// the image with a uuid were sent with it, and the blocks past the image
// were counted from the engines' usage.
func checkImages(t *testing.T, q *QualityResult) {
	t.Helper()
	llm, rr := q.at("images", "llm", 1), q.at("images", "round_robin", 1)
	if llm == nil || llm.Images == nil || rr == nil || rr.Images == nil {
		t.Fatalf("images: want llm and round_robin runs with image figures: %+v, %+v", llm, rr)
	}
	for _, r := range []*QualityRun{llm, rr} {
		if im := r.Images; r.Summary.OK != 6 || im.UUIDRequests != 3 || im.Blocks == 0 || im.Hit > im.Blocks {
			t.Errorf("images %s: %d of %d completed, %+v", r.Policy, r.Summary.OK, r.Summary.Requests, im)
		}
	}
	if llm.Images.Keyed != 6 || llm.Images.Text != 0 || rr.Images.Keyed+rr.Images.Text != 0 {
		t.Errorf("images: llm keyed %v, as text %v; round_robin %v, %v", llm.Images.Keyed, llm.Images.Text, rr.Images.Keyed, rr.Images.Text)
	}
}

// checkMultiModel checks the smoke plan's multimodel runs: `llm` sent
// every request to an engine serving its model and every one completed,
// with adapter requests counted at the engines; under `least_conn` every
// request an engine did not serve reached the client as a 404.
func checkMultiModel(t *testing.T, q *QualityResult) {
	t.Helper()
	llm, lc := q.at("multimodel", "llm", 1), q.at("multimodel", "least_conn", 1)
	if llm == nil || llm.Models == nil || lc == nil || lc.Models == nil {
		t.Fatalf("multimodel: want llm and least_conn runs with model figures: %+v, %+v", llm, lc)
	}
	if m := llm.Models; m.Unserved != 0 || llm.Summary.OK != 12 || m.AdapterRequests != 6 || m.AdapterArrivals != 6 {
		t.Errorf("multimodel llm: %d of %d completed, %+v", llm.Summary.OK, llm.Summary.Requests, m)
	}
	if m := lc.Models; m.Unserved != m.NotFound || lc.Summary.OK+m.NotFound != 12 {
		t.Errorf("multimodel least_conn: %d completed, %+v", lc.Summary.OK, m)
	}
}

// checkLateJoin checks the smoke plan's late-join: every case compared
// its 12 requests, both gateways explained each, every routed request
// completed, and the reference gateway, which saw the warm-up, found the
// prefixes.
func checkLateJoin(t *testing.T, q *QualityResult) {
	t.Helper()
	lj := q.lateJoinResult("late-join")
	if lj == nil || len(lj.Cases) != len(lateJoinCases) || lj.Warm != 4 {
		t.Fatalf("late-join: want %d cases after 4 warm-up requests: %+v", len(lateJoinCases), lj)
	}
	for _, c := range lj.Cases {
		ref := summarizeHits(c.Rows, refSide, nil)
		if len(c.Rows) != 12 || ref.Errors > 0 || summarizeRouted(c).Failed > 0 || ref.rate() == 0 || c.RefBlocks == 0 {
			t.Errorf("late-join %s: %d rows, %d not explained, %d failed, reference hit rate %.3f, %d blocks mirrored", c.Name, len(c.Rows),
				ref.Errors, summarizeRouted(c).Failed, ref.rate(), c.RefBlocks)
		}
	}
}

// TestSoakSmoke runs the soak section end to end, briefly: the real test
// as a subprocess against a gateway built from this checkout, on the
// schedule it scales to 20 s — engine restarts, a stream-cut episode, a
// reload, gauges under load — its figures read back; and a test name that
// matches nothing, which must fail the section rather than leave it
// without figures unnoticed.
func TestSoakSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Caddy and runs caddymodule's soak test")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), smokeDeadline)
	defer cancel()
	root, err := repoRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	bin, err := buildCaddy(ctx, root, tmp)
	if err != nil {
		t.Fatal(err)
	}
	env := &Env{Root: root, Out: t.TempDir(), Caddy: bin}
	p, err := soakParams(false)
	if err != nil {
		t.Fatal(err)
	}
	p.Duration = 20 * time.Second
	res, err := runSoak(ctx, env, p, tmp)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Passed || res.Run == nil {
		t.Fatalf("soak failed: %s\n%s", res.Problem, strings.Join(res.Tail, "\n"))
	}
	r := res.Run
	if r.Requests == 0 || r.Outcomes["ok"] == 0 || !r.external() || r.duration() != p.Duration {
		t.Errorf("soak figures: %d requests, %d served, mode %q, duration %s", r.Requests, r.Outcomes["ok"], r.Mode, r.Duration)
	}
	// The point of a short soak: its scaled schedule injected every fault
	// and gauged the gateway under load, so the leak check ran.
	if r.Restarts < 1 || r.Cuts < 1 || r.Reloads < 1 || len(r.Gauges) < 3 {
		t.Errorf("a %s soak injected %d engine restarts, %d stream-cut episodes, %d reloads and took %d gauges (want ≥ 1 of each fault and a gauge under load); schedule %+v",
			r.Duration, r.Restarts, r.Cuts, r.Reloads, len(r.Gauges), r.Setup.Schedule)
	}
	first, last, lim := r.Gauges[0], r.Gauges[len(r.Gauges)-1], r.Setup.Limits
	if last.Goroutines > lim.Goroutines || last.RSSMiB > lim.RSSMiB {
		t.Errorf("the gateway ended at %.0f goroutines and %.1f MiB, beyond the limits %+v, yet the test passed", last.Goroutines, last.RSSMiB, lim)
	}
	t.Logf("%d requests, %v; %d restarts, %d stream-cut episodes, %d reloads; goroutines %.0f → %.0f (limit %.0f), RSS %.1f → %.1f MiB (limit %.1f)",
		r.Requests, r.Outcomes, r.Restarts, r.Cuts, r.Reloads, first.Goroutines, last.Goroutines, lim.Goroutines, first.RSSMiB, last.RSSMiB, lim.RSSMiB)
	if len(first.Held) == 0 || len(last.Held) == 0 {
		t.Errorf("no goroutine dump before (%d entry functions) or after (%d) the load", len(first.Held), len(last.Held))
	} else {
		t.Log(heldFinding(first.Held, last.Held))
	}

	p.Test = "TestNoSuchSoak"
	res, err = runSoak(ctx, env, p, tmp)
	if err != nil {
		t.Fatal(err)
	}
	if res.Passed || !strings.Contains(res.Problem, "wrote no figures") {
		t.Errorf("a soak that wrote no figures: passed %v, problem %q", res.Passed, res.Problem)
	}
}
