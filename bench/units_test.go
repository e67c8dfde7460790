package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

func TestPercentiles(t *testing.T) {
	tests := []struct {
		in            []float64
		p50, p90, p99 float64
		mean          float64
	}{
		{in: nil},
		{in: []float64{3}, p50: 3, p90: 3, p99: 3, mean: 3},
		{in: []float64{4, 1, 3, 2}, p50: 2, p90: 4, p99: 4, mean: 2.5},
		{in: []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, p50: 5, p90: 9, p99: 10, mean: 5.5},
	}
	for _, tt := range tests {
		got := percentiles(slices.Clone(tt.in))
		if got.N != len(tt.in) || got.P50 != tt.p50 || got.P90 != tt.p90 || got.P99 != tt.p99 || got.Mean != tt.mean {
			t.Errorf("percentiles(%v) = %+v", tt.in, got)
		}
	}
}

func TestReadStream(t *testing.T) {
	const ok = ": keep-alive\n\n" +
		`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n" +
		`data: {"choices":[{"delta":{"content":" a"}}]}` + "\n\n" +
		": keep-alive\n\n" +
		`data: {"choices":[{"delta":{"content":" b"}}]}` + "\n\n" +
		`data: {"choices":[{"delta":{"content":" c"},"finish_reason":"length"}]}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n" +
		"data: [DONE]\n\n"
	var rec Record
	answer, err := readStream(strings.NewReader(ok), &rec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if answer != " a b c" || rec.Chunks != 3 || len(rec.Gaps) != 2 || rec.TTFT <= 0 {
		t.Errorf("answer %q chunks %d gaps %d ttft %v", answer, rec.Chunks, len(rec.Gaps), rec.TTFT)
	}
	if rec.PromptTokens != 40 || rec.OutputTokens != 3 || rec.CachedTokens != 32 {
		t.Errorf("usage: %+v", rec)
	}

	bad := map[string]string{
		"error event":   `data: {"choices":[{"delta":{"content":" a"}}]}` + "\n\nevent: error\ndata: {\"error\":{\"message\":\"engine died\"}}\n\n",
		"no usage":      `data: {"choices":[{"delta":{"content":" a"}}]}` + "\n\ndata: [DONE]\n\n",
		"cut short":     `data: {"choices":[{"delta":{"content":" a"}}]}` + "\n\n",
		"garbage chunk": "data: {nope\n\n",
	}
	for name, body := range bad {
		var rec Record
		if _, err := readStream(strings.NewReader(body), &rec, time.Now()); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestWorkloadTokens checks the generated text against the simulator's
// own tokenizer: the counts are what the spec asks for, a group's
// requests share the system prompt's blocks and different groups share
// none.
func TestWorkloadTokens(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	e, err := vllmsim.Start(ctx, vllmsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	tokenize := func(text string) []uint64 {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"prompt": text, "add_special_tokens": false})
		resp, err := c.Post(e.URL()+"/tokenize", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Tokens []uint64 `json:"tokens"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out.Tokens
	}

	spec := WorkloadSpec{Name: "t", Kind: "prefix", Groups: 3, PerGroup: 2, SystemTokens: 512, QuestionTokens: 100, OutputTokens: 64, Seed: 9}
	sessions, err := spec.Build(4)
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != spec.Requests() {
		t.Fatalf("%d sessions, want %d", len(sessions), spec.Requests())
	}
	bySys := map[string][]uint64{}
	for _, s := range sessions {
		if got := len(tokenize(s.Turns[0].User)); got != spec.QuestionTokens {
			t.Errorf("question: %d tokens, want %d", got, spec.QuestionTokens)
		}
		if s.Turns[0].MaxTokens != 16 {
			t.Errorf("max tokens %d, want 64/4", s.Turns[0].MaxTokens)
		}
		if _, seen := bySys[s.Key]; !seen {
			toks := tokenize(s.System)
			if len(toks) != spec.SystemTokens {
				t.Errorf("system prompt: %d tokens, want %d", len(toks), spec.SystemTokens)
			}
			bySys[s.Key] = toks
		}
	}
	if len(bySys) != spec.Groups {
		t.Fatalf("%d groups, want %d", len(bySys), spec.Groups)
	}
	var firsts []uint64
	for _, toks := range bySys {
		firsts = append(firsts, toks[0])
	}
	slices.Sort(firsts)
	if len(slices.Compact(firsts)) != spec.Groups {
		t.Errorf("groups share their first token: %v", firsts)
	}

	mt := WorkloadSpec{Name: "m", Kind: "multiturn", Groups: 2, Turns: 3, SystemTokens: 64, QuestionTokens: 32, OutputTokens: 8, Seed: 1}
	ms, err := mt.Build(1)
	if err != nil || len(ms) != 2 || len(ms[0].Turns) != 3 || mt.Requests() != 6 {
		t.Fatalf("multiturn: %d sessions, err %v", len(ms), err)
	}
	if _, err := (WorkloadSpec{Name: "x", Kind: "nope", Groups: 1, QuestionTokens: 1, OutputTokens: 1}).Build(1); err == nil {
		t.Error("unknown kind accepted")
	}
}

func TestSimLag(t *testing.T) {
	p := QualityParams{Engines: 2, TimeScale: 2, Model: EngineModel{DecodeStepSeconds: 0.02, TokenScale: 4, PrefillTokensPerSec: 1000}}
	step := 80 * time.Millisecond / 2 // wall time of one step at time scale 2
	mk := func(gap time.Duration, prompt, cached int) Record {
		return Record{Status: 200, TTFT: 10 * time.Millisecond, Chunks: 11,
			E2E: 10*time.Millisecond + 10*gap, PromptTokens: prompt, CachedTokens: cached}
	}
	// Decoding only (everything cached), on time: lag 1.
	if got := simLag([]Record{mk(step, 100, 100), mk(step, 100, 100)}, p); math.Abs(got-1) > 1e-9 {
		t.Errorf("on time: lag %v, want 1", got)
	}
	// Half slower than scheduled.
	if got := simLag([]Record{mk(step*3/2, 100, 100), mk(step*3/2, 100, 100)}, p); math.Abs(got-1.5) > 1e-9 {
		t.Errorf("slow: lag %v, want 1.5", got)
	}
	// Both engines prefilled for a quarter of their busy time and the
	// tokens came 4/3 steps apart: that is on time.
	busy := 10*time.Millisecond + 10*step*4/3
	prefill := int(0.25 * 2 * busy.Seconds() * p.TimeScale * p.Model.PrefillTokensPerSec)
	if got := simLag([]Record{mk(step*4/3, prefill/2+100, 100), mk(step*4/3, prefill/2+100, 100)}, p); math.Abs(got-1) > 0.01 {
		t.Errorf("prefill-heavy: lag %v, want 1", got)
	}
	if got := simLag(nil, p); got != 0 {
		t.Errorf("no records: lag %v", got)
	}

	tests := []struct {
		run  QualityRun
		want bool
	}{
		{QualityRun{PerEngine: []uint64{40, 40, 41, 39}}, true},
		{QualityRun{PerEngine: []uint64{40, 40, 41, 39}, Preemptions: 1}, false},
		{QualityRun{PerEngine: []uint64{60, 30, 40, 30}}, false}, // 60 > 1.3 × 40
		{QualityRun{}, false},
	}
	for _, tt := range tests {
		if got := lagApplies(&tt.run); got != tt.want {
			t.Errorf("lagApplies(%v, %d preemptions) = %v", tt.run.PerEngine, tt.run.Preemptions, got)
		}
	}
}

func TestKVBlocks(t *testing.T) {
	m := simModel()
	w := WorkloadSpec{Kind: "prefix", Groups: 40, PerGroup: 8, SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 256}
	blocks, rho := m.KVBlocks(w, 8, 0.5)
	working := int(math.Ceil(workingSetHeadroom * float64(m.MaxNumSeqs*m.RequestBlocks(w))))
	if blocks != working { // 40 × 128 blocks / (0.5 × 8) = 1280 < the working set
		t.Errorf("blocks %d, want the working-set floor %d", blocks, working)
	}
	if want := 40 * 128 / float64(8*blocks); math.Abs(rho-want) > 1e-9 {
		t.Errorf("rho %v, want %v", rho, want)
	}
	w.Groups = 400 // now the resident set decides
	blocks, rho = m.KVBlocks(w, 8, 0.5)
	if blocks != 400*128*2/8 || math.Abs(rho-0.5) > 1e-9 {
		t.Errorf("blocks %d rho %v, want %d and 0.5", blocks, rho, 400*128*2/8)
	}
	if _, rho := m.KVBlocks(WorkloadSpec{Kind: "random", Groups: 10, PerGroup: 1, QuestionTokens: 100, OutputTokens: 10}, 8, 0.5); rho != 0 {
		t.Errorf("no sharing: rho %v", rho)
	}
}

// TestFleetSim runs the fleet section small, through its adapter: every
// request is accounted for, the index's mirrors accept every event, and
// routing on the index finds the cache that spreading requests cannot.
func TestFleetSim(t *testing.T) {
	p := fleetParams(true)
	p.Requests = 3000
	hit := map[string]float64{}
	for _, v := range []FleetVariant{{Name: "llm", Policy: "llm", Load: 1}, {Name: "rr", Policy: "round_robin", Load: 1}, {Name: "lc2", Policy: "least_conn", Load: 1.4, InflightX: 2}} {
		r, err := simulateFleet(context.Background(), p, 8, v)
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed+r.Rejected != p.Requests || r.Completed == 0 {
			t.Errorf("%s: %d completed + %d rejected of %d", v.Name, r.Completed, r.Rejected, p.Requests)
		}
		if r.HitRate < 0 || r.HitRate > 1 || r.TTFT.N != r.Completed || r.TTFT.P50 <= 0 {
			t.Errorf("%s: hit %v ttft %+v", v.Name, r.HitRate, r.TTFT)
		}
		if v.Policy == "llm" {
			if r.MirrorProblems != 0 || r.EventBatches == 0 || r.DecisionNs.N != r.Completed {
				t.Errorf("llm: mirror problems %d, batches %d, decisions %d", r.MirrorProblems, r.EventBatches, r.DecisionNs.N)
			}
			if r.IndexBlocks > 8*r.KVBlocks {
				t.Errorf("llm: index holds %d blocks, engines only %d", r.IndexBlocks, 8*r.KVBlocks)
			}
		}
		hit[v.Name] = r.HitRate
	}
	if hit["llm"] <= hit["rr"] {
		t.Errorf("routing on the index found no more cache than round robin: %v", hit)
	}
}

// FuzzReadStream feeds arbitrary response bodies to the SSE reader: it
// must return (never panic or hang), and whatever it returns must be
// consistent.
func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\" a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte(": keep-alive\n\nevent: error\ndata: {\"error\":{\"message\":\"x\"}}\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"\\u00e9\\\"\"}}]}\n\n"))
	f.Add([]byte("data: [DONE]\n\n"))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":-1,\"prompt_tokens_details\":null}}\n\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var rec Record
		answer, err := readStream(bytes.NewReader(body), &rec, time.Now())
		if rec.Chunks > 0 && rec.TTFT < 0 {
			t.Fatalf("negative TTFT")
		}
		if len(rec.Gaps) != max(0, rec.Chunks-1) {
			t.Fatalf("%d gaps for %d chunks", len(rec.Gaps), rec.Chunks)
		}
		if err == nil && rec.PromptTokens == 0 {
			t.Fatalf("success without usage")
		}
		if len(answer) > len(body) {
			t.Fatalf("answer longer than the body")
		}
	})
}

// soakJSON is a small soak as TestReliabilitySoak writes it: two full
// minutes and a partial third.
const soakJSON = `{
  "duration": "2m30s",
  "mode": "Caddy binary /tmp/x/caddy (figures: the gateway process)",
  "gomaxprocs": 2, "workers": 48, "restarts": 3, "cuts": 1, "reloads": 1,
  "setup": {"engines": 4, "max_num_seqs": 16, "time_scale": 5, "max_inflight": 8, "max_park_ns": 10000000000,
    "queue_size": 512, "heartbeat_ns": 2000000000, "poll_interval_ns": 500000000, "lb_retries": 2,
    "workers": 48, "conversations": 8, "cut_after_tokens": 5,
    "schedule": {"restart_every_ns": 45000000000, "cut_every_ns": 100000000000, "cut_for_ns": 10000000000, "reload_every_ns": 120000000000, "gauge_every_ns": 30000000000},
    "limits": {"max_goroutines": 220, "max_rss_mib": 190.5, "idle_goroutine_slack": 5, "idle_wait_ns": 150000000000}},
  "requests": 1000,
  "outcomes": {"ok": 930, "client_left": 40, "sse_error_event": 20, "http_502": 6, "shutdown": 4},
  "minutes": [
    {"minute": 0, "requests": 400, "outcomes": {"ok": 372, "client_left": 16, "sse_error_event": 10, "http_502": 2}, "p50_ttft_ms": 120.5, "p99_ttft_ms": 450, "p99_total_ms": 900},
    {"minute": 1, "requests": 400, "outcomes": {"ok": 374, "client_left": 16, "sse_error_event": 6, "http_502": 4}, "p50_ttft_ms": 118, "p99_ttft_ms": 600, "p99_total_ms": 950},
    {"minute": 2, "requests": 200, "outcomes": {"ok": 184, "client_left": 8, "sse_error_event": 4, "shutdown": 4}, "p50_ttft_ms": 119, "p99_ttft_ms": 480, "p99_total_ms": 910}
  ],
  "gauges": [
    {"at": "0s", "goroutines": 60, "rss_mib": 40.5},
    {"at": "30s", "goroutines": 410, "rss_mib": 70.25, "step_ms": [4.5, 5], "scrape_lead_ms": [14, 15]},
    {"at": "1m0s", "goroutines": 420, "rss_mib": 72, "step_ms": [4, 6.25], "scrape_lead_ms": [13, 17.5]},
    {"at": "1m30s", "goroutines": 415, "rss_mib": 73},
    {"at": "2m0s", "goroutines": 418, "rss_mib": 73.5},
    {"at": "2m36s", "goroutines": 64, "rss_mib": 55}
  ],
  "idle": {"at": "4m40s", "goroutines": 62, "rss_mib": 54, "held": {"main.main": 1, "net/http.(*persistConn).readLoop": 1}},
  "events": ["45s restart 127.0.0.1:1", "1m30s restart 127.0.0.1:2", "1m40s streams cut on 127.0.0.1:3 for 10s", "2m0s reload", "2m15s restart 127.0.0.1:3"]
}`

// TestSoakReport renders section 5 from a hand-written soak, through the
// same files and loader a run uses.
func TestSoakReport(t *testing.T) {
	run, err := readSoakRun(strings.NewReader(soakJSON))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env := &Env{Out: dir, Command: "go -C bench run . -only soak"}
	res := &SoakResult{Params: SoakParams{Duration: 150 * time.Second, Test: "TestReliabilitySoak", Package: "./caddymodule"}, Command: "go test …", Passed: true, Run: run}
	if err := saveSection(env, "soak", res, time.Now()); err != nil {
		t.Fatal(err)
	}
	l, err := loadSections(dir)
	if err != nil {
		t.Fatal(err)
	}
	plots, err := plotSoak(dir, ".svg", l.soak.Run)
	if err != nil || len(plots) != 2 {
		t.Fatalf("plots %v: %v", plots, err)
	}
	md := render(l, "plots", map[string][]string{"soak": plots}, time.Minute)
	for _, want := range []string{
		"## 5. Soak",
		"**1000 requests** in 2m30s",
		"| served (`ok`) | 930 | 93.00% |",
		"| SSE error event (`sse_error_event`) | 20 | 2.00% |",
		"| 502 (`http_502`) | 6 | 0.60% |",
		"| 0 | 400 | 372 | 16 | 10 | 2 | 0 | 120 ms | 450 ms | 900 ms | 420 | 72.0 MiB | 1m0s |",
		"| 2 (partial, 30s) | 200 | 184 |",
		"**Drift.** TTFT p99 was 450 ms in minute 0 and 600 ms in minute 1, the last full one (+33%;",
		"60 goroutines and 40.5 MiB RSS before the load, 410 and 70.2 MiB under load at 30s",
		"and 64 and 55.0 MiB at 2m36s",
		"goroutines +4 and RSS +14.5 MiB over the whole soak",
		"**Under a 2m30s soak** (mixed load with 3 engine restarts, 1 stream-cut episode and 1 config reload): 1000 requests, 93.0% served, every one ended in a way the injected faults explain",
		"![soak_ttft](plots/soak_ttft.svg)",
		"Command: `BENCH_SOAK=2m30s go -C bench run . -only soak`",
		"in front of 4 [`vllmsim`](internal/sim/vllmsim) engines (max_num_seqs 16, 5× faster than real time",
		"with `max_inflight 8` each: 32 slots for 48 clients, so requests park in `llm_admission` (`max_park 10s`, `queue_size 512`, SSE heartbeats every 2 s)",
		"polls the engines every 500 ms (`poll_interval`); the proxy retries a failed request up to 2 times",
		"one of 8 long conversations",
		"Faults: an engine restarts every 45 s (3 restarts), one engine cuts its streams after 5 tokens for 10 s every 100 s (1 episode), and the config is reloaded every 2 minutes (1 reload); goroutines and RSS are read every 30 s.",
		"from the last gauge taken in the minute, one every 30 s)",
		"after the load the gateway had 64 goroutines and 55.0 MiB RSS, within the bounds the test derived from its 60 and 40.5 MiB before the load (at most 220 goroutines and 190.5 MiB)",
		"**Once idle.** After the load, the soak waited for the gateway's idle keep-alive connections to time out (at most 2m30s): at 4m40s it had 62 goroutines, +2 from the 60 before the load (the bound: ±5).",
		"**Scrape lead.** Under the load, local accounting began each scrape's epoch 13.0–17.5 ms before the scrape (each engine at every gauge, from `/llm/engines`): two of the engine's steps, 4.0–6.2 ms as the gateway measured them, plus 5 ms.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("report:\n%s", md)
	}

	// A -quick soak's report states its own, scaled, configuration.
	quick, err := readSoakRun(strings.NewReader(strings.NewReplacer(
		// A short soak takes no idle gauge.
		`  "idle": {"at": "4m40s", "goroutines": 62, "rss_mib": 54, "held": {"main.main": 1, "net/http.(*persistConn).readLoop": 1}},`+"\n", "",
		`"engines": 4`, `"engines": 3`, `"max_inflight": 8`, `"max_inflight": 20`,
		`"restart_every_ns": 45000000000`, `"restart_every_ns": 6000000000`, `"cut_every_ns": 100000000000`, `"cut_every_ns": 13333000000`,
		`"cut_for_ns": 10000000000`, `"cut_for_ns": 1333000000`, `"reload_every_ns": 120000000000`, `"reload_every_ns": 16000000000`,
		`"gauge_every_ns": 30000000000`, `"gauge_every_ns": 4000000000`).Replace(soakJSON)))
	if err != nil {
		t.Fatal(err)
	}
	env.Quick = true
	res = &SoakResult{Params: SoakParams{Duration: soakDuration(true)}, Command: "go test …", Passed: true, Run: quick}
	if err := saveSection(env, "soak", res, time.Now()); err != nil {
		t.Fatal(err)
	}
	if l, err = loadSections(dir); err != nil {
		t.Fatal(err)
	}
	md = render(l, "plots", nil, time.Minute)
	for _, want := range []string{
		"Command: `go -C bench run . -quick -only soak`",
		"in front of 3 [`vllmsim`](internal/sim/vllmsim) engines",
		"with `max_inflight 20` each: 60 slots for 48 clients, so requests rarely park",
		"an engine restarts every 6 s (3 restarts), one engine cuts its streams after 5 tokens for 1.3 s every 13.3 s (1 episode), and the config is reloaded every 16 s (1 reload); goroutines and RSS are read every 4 s.",
		"one every 4 s)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("quick soak: report lacks %q", want)
		}
	}
	for _, stale := range []string{"45 s", "100 s", "2 minutes", "every 30 s", "4 [`vllmsim`]", "max_inflight 8", "`go -C bench run . -only soak`"} {
		if strings.Contains(md, stale) {
			t.Errorf("quick soak: report states %q, the full soak's configuration", stale)
		}
	}
	env.Quick = false

	// A failed soak says so, with the test's output, and shows no figures.
	res = &SoakResult{Passed: false, Problem: "go test TestReliabilitySoak failed: exit status 1", Tail: []string{"    reliability_soak_test.go:440: 3 requests ended transport_error", "--- FAIL: TestReliabilitySoak (95.1s)"}, Run: run}
	if err := saveSection(env, "soak", res, time.Now()); err != nil {
		t.Fatal(err)
	}
	if l, err = loadSections(dir); err != nil {
		t.Fatal(err)
	}
	md = render(l, "plots", nil, time.Minute)
	for _, want := range []string{"**The soak failed: go test TestReliabilitySoak failed: exit status 1.**", "3 requests ended transport_error", "**The soak failed** (section 5)"} {
		if !strings.Contains(md, want) {
			t.Errorf("failed soak: report lacks %q", want)
		}
	}
	if strings.Contains(md, "Per minute") || strings.Contains(md, "**Drift.**") {
		t.Errorf("failed soak: the report shows figures:\n%s", md)
	}
}

// TestReadSoakRun: figures that do not add up are refused with the reason.
func TestReadSoakRun(t *testing.T) {
	edit := func(old, new string) string {
		if !strings.Contains(soakJSON, old) {
			t.Fatalf("soakJSON lacks %q", old)
		}
		return strings.Replace(soakJSON, old, new, 1)
	}
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", "EOF"},
		{"not JSON", "soak passed", "invalid character"},
		{"cut short", soakJSON[:200], "unexpected EOF"},
		{"wrong type", edit(`"requests": 1000`, `"requests": "many"`), "cannot unmarshal"},
		{"trailing data", soakJSON + ` {"requests": 1}`, "data after the JSON object"},
		{"bad duration", edit(`"duration": "2m30s"`, `"duration": "long"`), "duration \"long\""},
		{"no requests", edit(`"requests": 1000`, `"requests": 0`), "0 requests"},
		{"outcomes do not add up", edit(`"ok": 930`, `"ok": 931`), "outcomes add up to 1001, not the 1000 requests"},
		{"negative outcome", edit(`"shutdown": 4}`, `"shutdown": -4}`), "negative count"},
		{"minutes out of order", edit(`{"minute": 1,`, `{"minute": 0,`), "minute 0 out of order"},
		{"minute does not add up", edit(`"requests": 200,`, `"requests": 201,`), "minute 2: outcomes add up to 200, not its 201 requests"},
		{"p99 below p50", edit(`"p99_ttft_ms": 600`, `"p99_ttft_ms": 100`), "impossible latencies"},
		{"no gauges", edit(`"gauges": [`, `"gauges": [], "x": [`), "0 gauges"},
		{"gauge time", edit(`"at": "1m30s"`, `"at": "soon"`), "gauge 3: time \"soon\""},
		{"gauge goes back", edit(`"at": "1m30s"`, `"at": "10s"`), "gauge 3"},
		{"no setup", edit(`"setup": {`, `"x": {`), "no setup"},
		{"no schedule", edit(`"gauge_every_ns": 30000000000`, `"gauge_every_ns": 0`), "schedule"},
		{"no limits", edit(`"max_rss_mib": 190.5`, `"max_rss_mib": 0`), "limits"},
		{"workers disagree", edit(`"workers": 48, "conversations"`, `"workers": 47, "conversations"`), "48 workers, but the setup says 47"},
		{"negative cuts", edit(`"cuts": 1`, `"cuts": -1`), "negative fault counts"},
		{"too large", `{"events": ["` + strings.Repeat("x", maxSoakJSON) + `"]}`, "unexpected EOF"},
		{"valid", soakJSON, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run, err := readSoakRun(strings.NewReader(tt.in))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("valid soak refused: %v", err)
			case tt.want == "" && (run.Requests != 1000 || len(run.Minutes) != 3 || run.duration() != 150*time.Second):
				t.Fatalf("read %+v", run)
			case tt.want != "" && err == nil:
				t.Fatalf("accepted")
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("error %q, want it to say %q", err, tt.want)
			case tt.want != "" && !strings.HasPrefix(err.Error(), "soak figures: "):
				t.Fatalf("error %q does not say it is about the soak's figures", err)
			}
		})
	}
}

// TestLineLog: the subprocess's output is split into lines however it is
// written, JSON log lines are left out, long lines are cut and only the
// last lines are kept.
func TestLineLog(t *testing.T) {
	l := &lineLog{prefix: "test: ", keep: 3}
	out := "=== RUN   TestX\n{\"level\":\"info\"}\n  x_test.go:1: minute 0\r\n" + strings.Repeat("y", 3*maxLogLine) + "\nlast line, no newline"
	for len(out) > 0 { // in odd-sized writes
		n := min(7, len(out))
		if _, err := l.Write([]byte(out[:n])); err != nil {
			t.Fatal(err)
		}
		out = out[n:]
	}
	l.flush()
	got := l.tail()
	if len(got) != 3 || got[0] != "  x_test.go:1: minute 0" || got[2] != "last line, no newline" {
		t.Fatalf("tail %q", got)
	}
	if want := strings.Repeat("y", maxLogLine) + " …"; got[1] != want {
		t.Errorf("long line: %d bytes, want it cut to %d", len(got[1]), len(want))
	}
}

// TestReportStatesPlan: the report's prose states the configuration of
// the plan that ran (here the smoke plan, with -quick), not the full
// plan's engine counts, poll intervals and workload sizes.
func TestReportStatesPlan(t *testing.T) {
	plan := smokePlan()
	q := plan.Quality
	q.Engines, q.PollInterval = 3, 400*time.Millisecond
	spec := q.Plans[0].Workload
	spec.Name = "prefix-high" // the workload whyText explains
	run := QualityRun{Workload: spec.Name, Policy: "llm", RateX: 1, Rate: 2, Summary: Summary{OK: 1, Requests: 1}}
	f := plan.Fleet
	f.Sizes, f.PollInterval = []int{4, 16}, 0.1
	file := SectionFile{Quick: true, Machine: Machine{CPUs: 5}}
	l := &loaded{
		quality:  &QualityResult{Params: q, Workloads: []QualityWorkload{{Spec: spec, CapMiss: 2}}, Runs: []QualityRun{run}},
		fleet:    &FleetResult{Params: f},
		overhead: &OverheadResult{Params: plan.Overhead},
		files:    map[string]SectionFile{"quality": file, "fleet": file, "overhead": file},
	}
	md := render(l, "plots", nil, time.Minute)
	for _, want := range []string{
		"with a soak of 1 minute",
		"on 3 simulated vLLM engines behind a real Caddy",
		"Command: `go -C bench run . -quick -only quality`",
		"a fresh fleet of 3 [`vllmsim`](internal/sim/vllmsim) engines",
		"`llm { poll_interval 400ms;",
		"`reverse_proxy <3 engines> {",
		fmt.Sprintf("the prefill of its %d shared tokens", spec.SystemTokens),
		fmt.Sprintf("hashing %d groups onto 3 engines", spec.Groups),
		"## 3. Fleet simulation: 4 to 16 engines",
		"Command: `go -C bench run . -quick -only fleet`",
		"every 100 ms of simulated time",
		"On 5 shared cores the load generator",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, stale := range []string{"8 engines", "8 simulated", "poll_interval 250ms", "250 ms poll", "40 groups", "2,048", "2 shared cores", "1-minute", "%!"} {
		if strings.Contains(md, stale) {
			t.Errorf("report states %q, which is not this plan", stale)
		}
	}
	if t.Failed() {
		t.Logf("report:\n%s", md)
	}
}

func TestKeepNamed(t *testing.T) {
	vs := []FleetVariant{{Name: "llm"}, {Name: "llm@1.4"}, {Name: "round_robin"}}
	name := func(v FleetVariant) string { return v.Name }
	if got := keepNamed(vs, "BENCH_TEST_KEEP", name); len(got) != 3 {
		t.Fatalf("unset: kept %v, want all", got)
	}
	t.Setenv("BENCH_TEST_KEEP", "llm,round_robin")
	got := keepNamed(vs, "BENCH_TEST_KEEP", name)
	if len(got) != 2 || got[0].Name != "llm" || got[1].Name != "round_robin" {
		t.Fatalf("kept %v, want llm and round_robin (whole names only)", got)
	}
}

// TestCalibration: the relative error is taken per request against its
// observed TTFT less the time it was parked; requests without a
// prediction or that failed are left out.
func TestCalibration(t *testing.T) {
	rec := func(pred float64, ttft time.Duration, status int) Record {
		return Record{Predicted: pred, TTFT: ttft, Status: status}
	}
	cases := []struct {
		name      string
		recs      []Record
		n         int
		abs, bias float64
	}{
		{"none predicted", []Record{rec(0, time.Second, 200)}, 0, 0, 0},
		{"exact", []Record{rec(0.5, 500*time.Millisecond, 200)}, 1, 0, 0},
		{"parked: observed from dispatch", []Record{{Predicted: 0.5, TTFT: 2 * time.Second, QueueWait: 1.5, Status: 200}}, 1, 0, 0},
		{"queue wait past the TTFT: left out", []Record{{Predicted: 0.5, TTFT: time.Second, QueueWait: 1, Status: 200}}, 0, 0, 0},
		{"slower and faster", []Record{
			rec(1, 2*time.Second, 200),          // −50%
			rec(0.3, 200*time.Millisecond, 200), // +50%
			rec(0.9, time.Second, 200),          // −10%
			rec(5, time.Second, 503),            // failed: left out
			rec(0, time.Second, 200),            // no prediction: left out
		}, 3, 0.5, -0.1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := calibration(c.recs)
			if c.n == 0 {
				if got != nil {
					t.Fatalf("calibration %+v from records without predictions", got)
				}
				return
			}
			if got == nil || got.N != c.n || math.Abs(got.AbsP50-c.abs) > 1e-9 || math.Abs(got.BiasP50-c.bias) > 1e-9 {
				t.Errorf("calibration %+v, want n %d abs p50 %g bias p50 %g", got, c.n, c.abs, c.bias)
			}
		})
	}
}
