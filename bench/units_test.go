package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
	"github.com/llmgw/caddy-llmgw/kvindex"
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

// TestBatchEncoder checks the fleet simulation's event batches against
// the gateway's own decoder.
func TestBatchEncoder(t *testing.T) {
	evs := []desEvent{
		{stored: true, hashes: []uint64{11, 12}, tokens: []uint64{1, 2, 3, 4}},
		{stored: true, hashes: []uint64{13}, parent: 12, hasPar: true, tokens: []uint64{5, 6}},
		{hashes: []uint64{11}},
	}
	b, err := kvindex.DecodeBatch(newBatchEncoder().encode(1.5, evs, 2))
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 1.5 || len(b.Events) != 3 || b.Unknown != 0 {
		t.Fatalf("batch %+v", b)
	}
	for i, want := range evs {
		got := b.Events[i]
		kind := kvindex.EventBlockRemoved
		if want.stored {
			kind = kvindex.EventBlockStored
		}
		if got.Kind != kind || !slices.Equal(got.BlockHashes, want.hashes) || got.HasParent != want.hasPar || got.Parent != want.parent {
			t.Errorf("event %d: %+v, want %+v", i, got, want)
		}
		if want.stored && (!slices.Equal(got.TokenIDs, want.tokens) || got.BlockSize != 2 || got.Medium != "GPU") {
			t.Errorf("event %d: tokens %v block size %d medium %q", i, got.TokenIDs, got.BlockSize, got.Medium)
		}
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

// TestFleetSim runs the discrete-event model small: every request is
// accounted for, the index's mirrors accept every event, and routing on
// the index finds the cache that spreading requests cannot.
func TestFleetSim(t *testing.T) {
	p := fleetParams(true)
	p.Requests = 3000
	hit := map[string]float64{}
	for _, v := range []FleetVariant{{Name: "llm", Policy: "llm", Load: 1}, {Name: "rr", Policy: "round_robin", Load: 1}, {Name: "ll2", Policy: "least_loaded", Load: 1.4, InflightX: 2}} {
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
