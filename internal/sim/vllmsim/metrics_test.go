package vllmsim

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestPrefillTimeHistogram: request_prefill_time_seconds is a histogram with
// vLLM's buckets, observed once per finished request, in simulated seconds
// (the same with any TimeScale), or with WallClockMetrics in simulated
// seconds divided by TimeScale: the wall time the engine took.
func TestPrefillTimeHistogram(t *testing.T) {
	const step = 20 * time.Millisecond
	for _, c := range []struct {
		name  string
		wall  bool
		scale float64 // reported seconds per simulated second
	}{
		{"simulated clock", false, 1},
		{"wall clock", true, 1.0 / 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := startEngine(t, Config{TimeScale: 100, PrefillTokensPerSec: 1000, DecodeStepTime: step, WallClockMetrics: c.wall})
			cl := newClient(t)
			fams := scrape(t, cl, e)
			h := fams["vllm:request_prefill_time_seconds"]
			if h.GetType() != dto.MetricType_HISTOGRAM || len(h.Metric) != 1 || h.Metric[0].Histogram.GetSampleCount() != 0 {
				t.Fatalf("before any request: %v", h)
			}
			complete(t, cl, e.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("alpha beta ", 200), "max_tokens": 2})
			st := e.Stats()
			fams = scrape(t, cl, e)
			hg := fams["vllm:request_prefill_time_seconds"].Metric[0].Histogram
			if len(hg.Bucket) != len(requestTimeBuckets)+1 || hg.Bucket[0].GetUpperBound() != 0.3 || hg.GetSampleCount() != 1 {
				t.Fatalf("after one request: %v", hg)
			}
			// One step: the decode step time plus the uncached tokens at 1000/s.
			want := (step.Seconds() + float64(st.PromptTokens-st.CachedTokens)/1000) * c.scale
			if got := hg.GetSampleSum(); math.Abs(got-want) > 1e-9 {
				t.Fatalf("prefill time %v s, want %v s", got, want)
			}
			// Time to first token is on the same clock: at least the prefill.
			if got := fams["vllm:time_to_first_token_seconds"].Metric[0].Histogram.GetSampleSum(); got < want-1e-9 || got > want+step.Seconds()*c.scale {
				t.Errorf("time to first token %v s, prefill %v s", got, want)
			}
		})
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
	testwait.For(t, 15*time.Second, "first scrape", func() bool { return eng.Load().Known })

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
	testwait.For(t, 15*time.Second, "a scrape after the last request", func() bool { return eng.Load().ScrapedAt.After(done) })
	got := eng.Load().PrefillRate
	uncached := float64(st.PromptTokens - st.CachedTokens)
	t.Logf("derived %.0f uncached tokens/s, configured %d (%.0f%%); %d prompt tokens, %d cached", got, rate, 100*got/rate, st.PromptTokens, st.CachedTokens)
	if !(got > 0.7*rate && got <= rate) {
		t.Fatalf("derived prefill rate %.0f, want within 30%% below %d (uncached %v)", got, rate, uncached)
	}
}

// TestInterTokenLatencyHistogram: inter_token_latency_seconds observes the
// simulated time between a request's output tokens, once per token after
// the first, with vLLM's buckets.
func TestInterTokenLatencyHistogram(t *testing.T) {
	const step = 20 * time.Millisecond
	e := startEngine(t, Config{TimeScale: 50, DecodeStepTime: step})
	c := newClient(t)
	complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": "one two three", "max_tokens": 10})
	h := scrape(t, c, e)["vllm:inter_token_latency_seconds"]
	if h.GetType() != dto.MetricType_HISTOGRAM || len(h.Metric) != 1 {
		t.Fatalf("histogram: %v", h)
	}
	hg := h.Metric[0].Histogram
	if len(hg.Bucket) != len(itlBuckets)+1 || hg.Bucket[0].GetUpperBound() != 0.01 {
		t.Fatalf("buckets: %v", hg.Bucket)
	}
	// Nine tokens follow the first, each one decode step (simulated) later.
	if n, sum := hg.GetSampleCount(), hg.GetSampleSum(); n != 9 || math.Abs(sum-9*step.Seconds()) > 1e-9 {
		t.Fatalf("count %d sum %v, want 9 and %v", n, sum, 9*step.Seconds())
	}
}

// TestGaugesLagOneStep: a request that arrives while a step runs shows in
// num_requests_running/waiting only once the following step has ended, as
// vLLM renders its gauges from the latest step's scheduler stats.
func TestGaugesLagOneStep(t *testing.T) {
	e := startEngine(t, Config{MaxNumSeqs: 4, DecodeStepTime: 50 * time.Millisecond})
	c := newClient(t)
	shown := func() float64 {
		fams := scrape(t, c, e)
		return gauge(t, fams, "vllm:num_requests_running") + gauge(t, fams, "vllm:num_requests_waiting")
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testwait.For(t, 10*time.Second, what, cond)
	}
	// Background requests end with the test: their context is cancelled
	// (the engine aborts them) and the test waits for them.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	post := func(maxTokens int) {
		body := fmt.Sprintf(`{"prompt":"a b c","max_tokens":%d}`, maxTokens)
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := c.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	live := func() int { st := e.Stats(); return st.Running + st.Waiting }

	post(200) // keeps the engine stepping for 10 s
	waitFor("the first request in the gauges", func() bool { return shown() == 1 })
	for try := 0; ; try++ {
		if try == 5 {
			t.Fatal("a step ended between every arrival and its scrape")
		}
		before := e.Stats().Steps
		post(8)
		waitFor("the second request to arrive", func() bool { return live() == 2 })
		n := shown()
		if e.Stats().Steps != before {
			waitFor("the second request to end", func() bool { return live() == 1 })
			continue // a step ended in between: no conclusion
		}
		if n != 1 {
			t.Fatalf("gauges show %v requests right after the second arrived mid-step, want 1", n)
		}
		// The step that was running ends: the request joins the queue only
		// before the next one.
		waitFor("the step to end", func() bool { return e.Stats().Steps == before+1 })
		if n, steps := shown(), e.Stats().Steps; steps == before+1 && n != 1 {
			t.Fatalf("gauges show %v requests after the step it arrived in, want 1", n)
		}
		waitFor("the next step to end", func() bool { return e.Stats().Steps >= before+2 })
		if n, steps := shown(), e.Stats().Steps; steps <= before+6 && n != 2 {
			t.Fatalf("gauges show %v requests %d steps after it arrived, want 2", n, steps-before)
		}
		return
	}
}
