package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestModelFleet: engines are numbered pool after pool, and only the
// adapters' pool gets the LoRA settings.
func TestModelFleet(t *testing.T) {
	f := &ModelFleet{MaxLoRAs: 2, LoRALoadSeconds: 0.05, Pools: []ModelPool{
		{Model: "a", Engines: 2, Adapters: []string{"a-1", "a-2", "a-3"}},
		{Model: "b", Engines: 1},
	}}
	if f.engines() != 3 {
		t.Errorf("engines = %d, want 3", f.engines())
	}
	var c vllmsim.Config
	f.configure(1, &c)
	if c.Model != "a" || len(c.LoRAModules) != 3 || c.MaxLoRAs != 2 || c.LoRALoadTime != 50*time.Millisecond {
		t.Errorf("engine 1: %+v", c)
	}
	c = vllmsim.Config{}
	f.configure(2, &c)
	if c.Model != "b" || c.LoRAModules != nil || c.MaxLoRAs != 0 || c.LoRALoadTime != 0 {
		t.Errorf("engine 2: %+v", c)
	}
	if got, want := f.describe(), "2 × `a` (+ 3 adapters), 1 × `b`"; got != want {
		t.Errorf("describe = %q, want %q", got, want)
	}
}

// TestWorkloadModels: each group's sessions ask for the group's model,
// and the counts must cover the groups exactly.
func TestWorkloadModels(t *testing.T) {
	w := WorkloadSpec{Name: "m", Kind: "prefix", Groups: 3, PerGroup: 2, SystemTokens: 8, QuestionTokens: 4, OutputTokens: 4, Seed: 1,
		Models: []ModelGroups{{Model: "a", Groups: 1}, {Model: "b", Groups: 2}}}
	sessions, err := w.Build(1)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"group-0": "a", "group-1": "b", "group-2": "b"}
	for _, s := range sessions {
		if s.Model != want[s.Key] {
			t.Errorf("session of %s asks for %q, want %q", s.Key, s.Model, want[s.Key])
		}
	}
	w.Models[1].Groups = 1
	if _, err := w.Build(1); err == nil || !strings.Contains(err.Error(), "cover 2 groups of 3") {
		t.Errorf("models covering 2 of 3 groups: err = %v", err)
	}
	w.Models = nil
	sessions, _ = w.Build(1)
	if sessions[0].Model != "" {
		t.Errorf("without models, a session asks for %q", sessions[0].Model)
	}
}

// TestModelStats sums what the engines counted and what the client saw.
func TestModelStats(t *testing.T) {
	servesA := func(m string) bool { return m == "a" || m == "a-1" || m == "" }
	servesB := func(m string) bool { return m == "b" }
	engines := []EngineModels{
		{ByModel: map[string]int{"a": 3, "a-1": 4, "b": 2}, Serves: servesA,
			Stats: vllmsim.Stats{AdapterArrivals: 4, AdapterArrivalsInFlight: 3, LoRALoads: 1}},
		{ByModel: map[string]int{"b": 5, "a-1": 1, "a": 1}, Serves: servesB},
	}
	sessions := []Session{{Model: "a"}, {Model: "a-1"}, {Model: "b"}}
	recs := []Record{
		{Session: 1, Status: http.StatusOK, TTFT: time.Second},
		{Session: 1, Status: http.StatusOK, TTFT: 3 * time.Second},
		{Session: 1, Status: http.StatusNotFound, Err: "status 404"},
		{Session: 0, Status: http.StatusNotFound, Err: "status 404"},
		{Session: 2, Status: http.StatusOK, TTFT: 9 * time.Second},
	}
	st := modelStats(engines, recs, sessions, map[string]bool{"a-1": true}, 2)
	if st.Unserved != 4 || st.NotFound != 2 || st.AdapterRequests != 3 || st.AdapterArrivals != 4 || st.AdapterInFlight != 3 || st.LoRALoads != 1 {
		t.Errorf("stats = %+v", st)
	}
	if st.AdapterTTFT.N != 2 || st.AdapterTTFT.P90 != 6 {
		t.Errorf("adapter TTFT = %+v, want 2 requests, p90 6 s (simulated)", st.AdapterTTFT)
	}
	if st.InFlightShare() != 0.75 || (&ModelStats{}).InFlightShare() != 0 {
		t.Errorf("in-flight share = %v", st.InFlightShare())
	}
}

// TestRenderMultiModel renders the scenario's table and its goal line.
func TestRenderMultiModel(t *testing.T) {
	sc := &ScenarioOptions{Desc: "desc", Why: "why", Models: &ModelFleet{Pools: []ModelPool{{Model: "a", Engines: 1}}}}
	run := func(pol string, unserved int, inFlight uint64) QualityRun {
		return QualityRun{Workload: "mm", Policy: pol, RateX: 1, Rate: 7.7,
			Summary: Summary{Requests: 10, OK: 10 - unserved, Errors: unserved, HitRate: 0.5, TTFT: Pcts{P50: 0.4, P90: 2}},
			Models:  &ModelStats{Unserved: unserved, NotFound: unserved, AdapterTTFT: Pcts{P90: 3}, AdapterArrivals: 4, AdapterInFlight: inFlight, LoRALoads: 2}}
	}
	q := &QualityResult{
		Params:    QualityParams{Policies: []PolicySpec{{Name: "llm"}, {Name: "least_conn"}}, LagThreshold: 1.12},
		Workloads: []QualityWorkload{{Spec: WorkloadSpec{Name: "mm"}, Scenario: sc}},
		Runs:      []QualityRun{run("llm", 0, 4), run("least_conn", 5, 1)},
	}
	var b strings.Builder
	renderScenario(&b, q, q.Workloads[0])
	for _, want := range []string{
		"### mm\n\ndesc\n\n",
		"| 7.7/s (1×) | `llm` | 50.0% | 0.40 s | 2.00 s | 3.00 s | 10/10 | 0 | 0 | 0 | 0 of 10 | 100.0% (4 of 4) | 2 | – |\n",
		"| 7.7/s (1×) | `least_conn` | 50.0% | 0.40 s | 2.00 s | 3.00 s | 5/10 | 5 | 0 | 5 | 5 of 10 | 25.0% (1 of 4) | 2 | – |\n",
		"Why: why\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
	goals := scenarioGoals(q)
	want := "mm at 7.7 req/s (1× cap₀): 100.0% (4 of 4) of `llm`'s adapter requests arrived where their adapter was running or waiting (meets the goal of ≥ 90%), `least_conn` 25.0% (1 of 4); requests sent to an engine not serving their model: `llm` 0 of 10, `least_conn` 5 of 10"
	if len(goals) != 1 || goals[0] != want {
		t.Errorf("goals = %q, want [%q]", goals, want)
	}
}
