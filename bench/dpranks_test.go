package main

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestDPFleet: a data-parallel fleet is one server whose ranks are the
// fleet's engines, publishing on the base ports + rank; the gateway's
// Caddyfile declares it as one engine with data_parallel_size and rank 0's
// endpoints, and waits for every rank. A request sent to the server
// without a rank is counted unpinned there, and the load generator
// records which rank served it; with no gateway's pick to match, the
// check counts it mismatched.
func TestDPFleet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f, err := startDPFleet(ctx, 2, simConfig(simModel(), 64, 50, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Engines) != 2 || f.DP == nil {
		t.Fatalf("%d engines, server %v", len(f.Engines), f.DP)
	}
	ep0, ep1 := f.Engines[0].KVEndpoint(), f.Engines[1].KVEndpoint()
	var p0, p1 int
	if _, err := fmt.Sscanf(ep0[strings.LastIndexByte(ep0, ':')+1:], "%d", &p0); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscanf(ep1[strings.LastIndexByte(ep1, ':')+1:], "%d", &p1); err != nil || p1 != p0+1 {
		t.Fatalf("rank 1 publishes on %s, want rank 0's port %d + 1 (%v)", ep1, p0, err)
	}
	refs := f.Refs(true)
	if len(refs) != 1 || refs[0].Dial != f.DP.Addr() || refs[0].DataParallelSize != 2 || refs[0].KVEvents != ep0 ||
		refs[0].KVReplay != f.Engines[0].ReplayEndpoint() || refs[0].MaxInflight != simModel().MaxNumSeqs {
		t.Fatalf("refs %+v", refs)
	}
	if n := routingTargets(append(refs, EngineRef{Dial: "other:1"})); n != 3 {
		t.Errorf("routing targets %d, want 3 (2 ranks and an engine)", n)
	}
	cf := GatewayConfig{Engines: refs, Policy: "llm"}.caddyfile(1, 2)
	if want := fmt.Sprintf("engine %s {\n\t\t\tmax_inflight 16\n\t\t\tdata_parallel_size 2\n\t\t\tkv_events %s\n", f.DP.Addr(), ep0); !strings.Contains(cf, want) {
		t.Errorf("Caddyfile lacks %q:\n%s", want, cf)
	}

	sessions := []Session{{Key: "g", Turns: []Turn{{User: "hello there", MaxTokens: 2}}}}
	recs := Run(ctx, Target{URL: f.DP.URL() + "/v1/chat/completions", Model: "sim-model", Client: http.DefaultClient}, sessions, LoadConfig{Stream: true})
	if len(recs) != 1 || !recs[0].OK() || recs[0].ServedRank != "0" {
		t.Fatalf("records %+v, want one served by rank 0 (the first in turn)", recs)
	}
	st := serverRankStats(f.DP)
	st.compare(recs, f.DP.Addr())
	if st.Unpinned != 1 || st.Requests() != 1 || st.Unranked() != 1 || st.Checked != 1 || st.Mismatched != 1 {
		t.Errorf("rank stats %+v", st)
	}
}

// TestRankStatsCompare: a record counts when a rank answered it, and
// matches only when the gateway's pick is that rank's key.
func TestRankStatsCompare(t *testing.T) {
	const dial = "127.0.0.1:8000"
	recs := []Record{
		{Upstream: dial + "#1", ServedRank: "1"},
		{Upstream: dial + "#3", ServedRank: "3"},
		{Upstream: dial + "#0", ServedRank: "2"},                       // another rank served it
		{Upstream: "", ServedRank: "0"},                                // no pick named
		{Upstream: "10.0.0.9:8000", ServedRank: "0"},                   // picked elsewhere
		{Upstream: dial + "#0", ServedRank: "x"},                       // garbled
		{Upstream: dial + "#2", Status: http.StatusServiceUnavailable}, // never reached the server
	}
	st := &RankStats{Pinned: []uint64{3, 4}, Unpinned: 2, Refused: 1}
	st.compare(recs, dial)
	if st.Checked != 6 || st.Mismatched != 4 {
		t.Errorf("checked %d mismatched %d, want 6 and 4", st.Checked, st.Mismatched)
	}
	if st.Requests() != 10 || st.Unranked() != 3 {
		t.Errorf("requests %d unranked %d, want 10 and 3", st.Requests(), st.Unranked())
	}
}

// TestDPRanksPlan: the scenario is prefix-high on 4 engines at 1× cap₀,
// separate engines against one server's ranks; the section's policies
// include the data-parallel arm, which no other scenario runs.
func TestDPRanksPlan(t *testing.T) {
	t.Setenv("BENCH_SCENARIOS", "")
	t.Setenv("BENCH_POLICIES", "")
	p := scenarioParams(false)
	var plan *QualityPlan
	for i := range p.Plans {
		if p.Plans[i].Scenario.dataParallel() {
			if plan != nil {
				t.Fatalf("two data-parallel plans: %s and %s", plan.Workload.Name, p.Plans[i].Workload.Name)
			}
			plan = &p.Plans[i]
		}
	}
	if plan == nil {
		t.Fatal("no dp-ranks plan")
	}
	w, ph := plan.Workload, prefixHigh()
	w.Name, w.Reference = ph.Name, ph.Reference
	if !reflect.DeepEqual(w, ph) || len(plan.Rates) != 1 || plan.Rates[0] != 1 {
		t.Errorf("dp-ranks runs %+v at %v, want prefix-high at 1×", plan.Workload, plan.Rates)
	}
	if pp := plan.Scenario.apply(p); pp.Engines != 4 {
		t.Errorf("engines %d, want 4", pp.Engines)
	}
	dp := 0
	for _, pol := range p.Policies {
		if pol.DataParallel {
			dp++
			if pol.Name != dpPolicy || pol.Policy != "llm" || !pol.KV || !strings.Contains(pol.Body, "debug_headers") {
				t.Errorf("data-parallel policy %+v: want llm with KV events and debug headers (the pick to check)", pol)
			}
		}
	}
	if dp != 1 {
		t.Errorf("%d data-parallel policies, want 1", dp)
	}
}

// TestRenderDPRanks renders the scenario's table and its goal line.
func TestRenderDPRanks(t *testing.T) {
	sc := &ScenarioOptions{Desc: "desc", Why: "why", Engines: 4, Policies: []string{"llm", dpPolicy}}
	run := func(pol string, hit float64, ranks *RankStats) QualityRun {
		return QualityRun{Workload: "dp", Policy: pol, RateX: 1, Rate: 6.1, PerEngine: []uint64{80, 81, 79, 80},
			Summary: Summary{Requests: 320, OK: 320, HitRate: hit, TTFT: Pcts{P50: 0.5, P90: 1.5}}, Ranks: ranks}
	}
	q := &QualityResult{
		Params:    QualityParams{Policies: []PolicySpec{{Name: "llm"}, {Name: dpPolicy, DataParallel: true}}, LagThreshold: 1.12},
		Workloads: []QualityWorkload{{Spec: WorkloadSpec{Name: "dp"}, Scenario: sc}},
		Runs: []QualityRun{run("llm", 0.75, nil),
			run(dpPolicy, 0.71, &RankStats{Pinned: []uint64{80, 81, 79, 79}, Unpinned: 1, Checked: 320, Mismatched: 2})},
	}
	var b strings.Builder
	renderScenario(&b, q, q.Workloads[0])
	for _, want := range []string{
		"### dp\n\ndesc\n\n",
		"| 6.1/s (1×) | 4 engines | `llm` | 75.0% | 0.50 s | 1.50 s | 320/320 | 0 | 0 | 80 / 81 / 79 / 80 | – | – | – |\n",
		"| 6.1/s (1×) | 1 server × 4 ranks | `llm-dp` | 71.0% | 0.50 s | 1.50 s | 320/320 | 0 | 0 | 80 / 81 / 79 / 80 | 1 of 320 | 2 of 320 | – |\n",
		"Why: why\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
	goals := scenarioGoals(q)
	want := "dp at 6.1 req/s (1× cap₀): hit rate through one server's 4 ranks 71.0% vs 4 separate engines 75.0% (-4.0 points: misses the goal of within 3), " +
		"TTFT p50 0.50 s vs 0.50 s, p90 1.50 s vs 1.50 s; at the server 1 of 320 requests came without a valid `X-data-parallel-rank` and 2 of 320 were served by a rank other than the gateway's pick"
	if len(goals) != 1 || goals[0] != want {
		t.Errorf("goals = %q, want [%q]", goals, want)
	}
	q.Runs[1].Summary.HitRate = 0.73
	if g := scenarioGoals(q); len(g) != 1 || !strings.Contains(g[0], "(-2.0 points: meets the goal of within 3)") {
		t.Errorf("goals at 2 points below: %q", g)
	}
}
