package vllmsim

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestPrefillTimeHistogram: request_prefill_time_seconds is a histogram with
// vLLM's buckets, observed once per finished request, in simulated seconds
// (the same with any TimeScale).
func TestPrefillTimeHistogram(t *testing.T) {
	const step = 20 * time.Millisecond
	e := startEngine(t, Config{TimeScale: 100, PrefillTokensPerSec: 1000, DecodeStepTime: step})
	c := newClient(t)
	fams := scrape(t, c, e)
	h := fams["vllm:request_prefill_time_seconds"]
	if h.GetType() != dto.MetricType_HISTOGRAM || len(h.Metric) != 1 || h.Metric[0].Histogram.GetSampleCount() != 0 {
		t.Fatalf("before any request: %v", h)
	}
	complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("alpha beta ", 200), "max_tokens": 2})
	st := e.Stats()
	h = scrape(t, c, e)["vllm:request_prefill_time_seconds"]
	hg := h.Metric[0].Histogram
	if len(hg.Bucket) != len(requestTimeBuckets)+1 || hg.Bucket[0].GetUpperBound() != 0.3 || hg.GetSampleCount() != 1 {
		t.Fatalf("after one request: %v", h)
	}
	// One step: the decode step time plus the uncached tokens at 1000/s.
	want := step.Seconds() + float64(st.PromptTokens-st.CachedTokens)/1000
	if got := hg.GetSampleSum(); math.Abs(got-want) > 1e-9 {
		t.Fatalf("prefill time %v s, want %v s (simulated, not wall time)", got, want)
	}
}

// TestDerivedPrefillRate: upstreams, scraping the simulator's real /metrics
// page, derives a prefill rate close to the configured PrefillTokensPerSec.
// It is lower: each prefill step also takes one DecodeStepTime.
func TestDerivedPrefillRate(t *testing.T) {
	const rate = 10000
	e := startEngine(t, Config{TimeScale: 50, PrefillTokensPerSec: rate})
	c := newClient(t)
	reg := upstreams.NewRegistry(upstreams.Options{})
	defer reg.Close()
	reg.Apply([]upstreams.EngineConfig{{Dial: e.Addr()}}, upstreams.Options{PollInterval: 10 * time.Millisecond, PollTimeout: 10 * time.Second})
	eng, ok := reg.Get(e.Addr())
	if !ok {
		t.Fatal("engine not registered")
	}
	waitFor(t, "first scrape", func() bool { return eng.Load().Known })

	// Sequential requests, each prefilled alone; the second half shares the
	// first half's prompts, so cached tokens must be left out.
	for i := range 8 {
		prompt := fmt.Sprintf("request %d: %s", i%4, strings.Repeat(fmt.Sprintf("w%d x y z ", i%4), 600))
		complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2})
	}
	st := e.Stats()
	if st.CachedTokens == 0 {
		t.Fatalf("no cache hits: %+v", st)
	}
	done := time.Now()
	waitFor(t, "a scrape after the last request", func() bool { return eng.Load().ScrapedAt.After(done) })
	got := eng.Load().PrefillRate
	uncached := float64(st.PromptTokens - st.CachedTokens)
	t.Logf("derived %.0f uncached tokens/s, configured %d (%.0f%%); %d prompt tokens, %d cached", got, rate, 100*got/rate, st.PromptTokens, st.CachedTokens)
	if !(got > 0.7*rate && got <= rate) {
		t.Fatalf("derived prefill rate %.0f, want within 30%% below %d (uncached %v)", got, rate, uncached)
	}
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
