package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestExplain: explain routes as the pool's policy would, names the pick,
// and says so when the pool has no engines.
func TestExplain(t *testing.T) {
	f := manualFleet(t, &EngineConfig{Dial: deadDials[0], MaxInflight: 4}, &EngineConfig{Dial: deadDials[1], MaxInflight: 4})
	if _, err := f.Explain(context.Background(), chatRequest(t, nil, "hi"), "nobody"); err != nil {
		t.Fatalf("a pool with no configured engines of its own falls back to every engine, got %v", err)
	}
	s := DefaultSettings()
	s.Tokenize = false
	f.SetPolicy("default", s)
	scrape(f, deadDials[0], upstreams.Gauges{Running: 4}) // full
	scrape(f, deadDials[1], upstreams.Gauges{Running: 1})
	ex, err := f.Explain(context.Background(), chatRequest(t, nil, "hello there"), "default")
	if err != nil {
		t.Fatal(err)
	}
	if ex.Pick == nil || *ex.Pick != deadDials[1] || len(ex.Candidates) != 2 || ex.Candidates[0].Excluded != routing.ExcludedSaturated {
		t.Fatalf("explanation %+v", ex)
	}
	// The pick's prediction is its candidate's, and its parts add up.
	if pr := ex.Candidates[1].Prediction; ex.PredictedTTFT <= 0 || ex.PredictedTTFT != pr.TTFT ||
		math.Abs(pr.AheadSeconds+pr.PrefillSeconds+pr.SlotSeconds+pr.StepSeconds+pr.PenaltySeconds-pr.TTFT) > 1e-12 {
		t.Fatalf("explained prediction %v, the pick's %+v", ex.PredictedTTFT, pr)
	}
	if ex.Tokens != 0 || ex.TokenizeError != "" || ex.Tokenize.Called {
		t.Fatalf("tokenize is off for the pool, yet tokens %d error %q called %v", ex.Tokens, ex.TokenizeError, ex.Tokenize.Called)
	}

	empty := New(f.logger, Options{ManualScrape: true})
	defer empty.Close()
	if _, err := empty.Explain(context.Background(), &openai.Request{Model: "m"}, "default"); !errors.Is(err, ErrNoEngines) {
		t.Fatalf("explain on an empty fleet: %v, want ErrNoEngines", err)
	}
}

// TestReports: engine reports, saturation and breaker states read the
// fleet's live state.
func TestReports(t *testing.T) {
	f := manualFleet(t, &EngineConfig{Dial: deadDials[0], MaxInflight: 2}, &EngineConfig{Dial: deadDials[1], MaxInflight: 2, Pool: "other"})
	scrape(f, deadDials[0], upstreams.Gauges{Running: 2, KVUsage: 0.5, BlockSize: 16, NumGPUBlocks: 100})
	f.SetDrained(deadDials[1], true)
	f.SetBreaker(routing.BreakerConfig{Failures: 1})
	f.Proxied(deadDials[1]).Outcome(errors.New("refused"), 0)
	f.NotePoolModel("default", "m")
	byDial := map[string]EngineReport{}
	for _, r := range f.EngineReports() {
		byDial[r.Dial] = r
	}
	a, b := byDial[deadDials[0]], byDial[deadDials[1]]
	if !a.Known || a.Running != 2 || a.KVUsage != 0.5 || a.GPUBlocks != 100 || a.MaxInfl != 2 || a.Pool != "default" || a.KV != nil {
		t.Fatalf("report of the scraped engine: %+v", a)
	}
	if b.Known || !b.Drained || b.Breaker != routing.StateOpen || b.Pool != "other" {
		t.Fatalf("report of the drained, failing engine: %+v", b)
	}
	if sat := f.Saturation(); sat["m"] != 1 {
		t.Fatalf("saturation %v, want the default pool's only engine full", sat)
	}
	if open := f.BreakerOpen(); !open[deadDials[1]] || open[deadDials[0]] {
		t.Fatalf("breaker states %v", open)
	}
	res := f.Registry().Ensure(deadDials[0]).Reserve()
	defer res.Done()
	if d := f.QueueDepth(); d != [admission.NumBands]int{} {
		t.Fatalf("queue depth %v with no gate", d)
	}
}

// TestReportsModelsAndLoRA: an engine report shows the models the engine
// serves and its models error, and the LoRA adapters in flight; an engine
// that told nothing shows null models and no LoRA state.
func TestReportsModelsAndLoRA(t *testing.T) {
	f := manualFleet(t, &EngineConfig{Dial: deadDials[0]}, &EngineConfig{Dial: deadDials[1]})
	e := f.Registry().Ensure(deadDials[0])
	e.RecordModels([]upstreams.ServedModel{{ID: "base", Root: "/models/base", MaxModelLen: 4096}, {ID: "sql", Root: "/lora/sql", Parent: "base"}}, nil)
	e.RecordModels(nil, errors.New("parse models: boom"))
	scrape(f, deadDials[0], upstreams.Gauges{LoRA: upstreams.LoRAState{MaxLoRA: 2, Running: []string{"sql"}, Known: true}})
	scrape(f, deadDials[1], upstreams.Gauges{})
	byDial := map[string]EngineReport{}
	for _, r := range f.EngineReports() {
		byDial[r.Dial] = r
	}
	a, b := byDial[deadDials[0]], byDial[deadDials[1]]
	want := []ModelReport{{ID: "base", MaxModelLen: 4096}, {ID: "sql", Parent: "base"}}
	if !slices.Equal(a.Models, want) || a.ModelsSource != "discovered" || a.ModelsError != "parse models: boom" || a.ModelsLearnedAt.IsZero() {
		t.Fatalf("models of the engine: %+v %q %q", a.Models, a.ModelsSource, a.ModelsError)
	}
	if a.LoRA == nil || a.LoRA.MaxLoRA != 2 || !slices.Equal(a.LoRA.Running, []string{"sql"}) || a.LoRA.Waiting == nil {
		t.Fatalf("LoRA of the engine: %+v", a.LoRA)
	}
	js, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if b.Models != nil || b.LoRA != nil || !strings.Contains(string(js), `"models":null`) || strings.Contains(string(js), `"lora"`) {
		t.Fatalf("report of an engine that told nothing: %s", js)
	}
}

// TestQueueReportsAndRetryAfter: the queue report counts a parked request
// in its pool and band, and Retry-After falls back to max_park while
// nothing drains.
func TestQueueReportsAndRetryAfter(t *testing.T) {
	f := manualFleet(t, &EngineConfig{Dial: deadDials[0], MaxInflight: 1})
	g := f.Gate("p", admission.Config{})
	w, err := g.Enter(admission.Low, func() bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Leave()
	q := f.QueueReports()
	if got := q["p"]["low"]; got.Depth != 1 || got.Parked != 1 || q["p"]["high"].Depth != 0 {
		t.Fatalf("queue report %+v", q)
	}
	if ra := f.RetryAfter(deadDials[:1], g, admission.Low, 0, 30*time.Second); ra != 30*time.Second {
		t.Fatalf("Retry-After %v with nothing draining, want max_park 30s", ra)
	}
	if ra := f.RetryAfter(deadDials[:1], nil, admission.Low, 3, 0); ra != time.Second {
		t.Fatalf("Retry-After %v with no bound and no rate, want the 1s floor", ra)
	}
}

// TestEngineReportsPrefill: /llm/engines shows each engine's derived
// prefill rate and how long a long prompt still occupies it.
func TestEngineReportsPrefill(t *testing.T) {
	f, clk := clockedFleet(t, &EngineConfig{Dial: deadDials[0], MaxInflight: 4})
	scrape(f, deadDials[0], upstreams.Gauges{PromptTokens: 1000, CachedTokens: 0, PrefillSeconds: 1})
	// 9,000 uncached prompt tokens in 1.5 s of prefill since: 6,000 tokens/s.
	scrape(f, deadDials[0], upstreams.Gauges{PromptTokens: 12000, CachedTokens: 2000, PrefillSeconds: 2.5})
	f.Registry().Ensure(deadDials[0]).Reserve().Occupy(3 * time.Second)
	clk.Advance(time.Second)
	reps := f.EngineReports()
	if len(reps) != 1 || reps[0].PrefillRate < 5999 || reps[0].PrefillRate > 6001 || reps[0].Occupied != 2 {
		t.Fatalf("reports %+v, want prefill_rate 6000 and occupied 2 s", reps)
	}
}
