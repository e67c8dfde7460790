package upstreams

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// failure modes a fakeEngine can serve on /metrics.
const (
	modeOK      = "ok"
	mode500     = "500"
	modeHang    = "hang"
	modeHTML    = "html"
	modeGarbage = "garbage"
	modeHuge    = "huge" // 50 MB
	modeMissing = "missing"
)

// fakeEngine is a real HTTP server serving a vLLM-shaped /metrics page whose
// gauges and failure mode the test controls.
type fakeEngine struct {
	srv      *httptest.Server
	mode     atomic.Value // string
	hits     atomic.Int64
	mu       sync.Mutex
	running  float64
	waiting  float64
	kv       float64
	lastAuth string
	// gate, if set, blocks each /metrics request after it arrived until it
	// is closed; arrived receives one value per request.
	gate    chan struct{}
	arrived chan struct{}
	// arrivals are when the /metrics requests arrived, in order.
	arrivals []time.Time
	// itlSecs and itlCount, when itlCount > 0, are served as the
	// inter-token latency histogram's _sum and _count.
	itlSecs, itlCount float64
	// sleep, when sleepGauge, is served as vllm:engine_sleep_state's
	// level (0 awake), as vLLM renders it.
	sleepGauge bool
	sleep      int
}

func newFakeEngine(t *testing.T) *fakeEngine {
	t.Helper()
	f := &fakeEngine{}
	f.mode.Store(modeOK)
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) dial() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeEngine) set(running, waiting, kv float64) {
	f.mu.Lock()
	f.running, f.waiting, f.kv = running, waiting, kv
	f.mu.Unlock()
}

func (f *fakeEngine) setMode(m string) { f.mode.Store(m) }

// setITL sets the inter-token latency histogram's totals.
func (f *fakeEngine) setITL(secs, count float64) {
	f.mu.Lock()
	f.itlSecs, f.itlCount = secs, count
	f.mu.Unlock()
}

// arrival returns when the i-th /metrics request (from 0) arrived; false
// before it has.
func (f *fakeEngine) arrival(i int) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.arrivals) {
		return time.Time{}, false
	}
	return f.arrivals[i], true
}

func (f *fakeEngine) auth() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastAuth
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	f.hits.Add(1)
	f.mu.Lock()
	f.lastAuth = r.Header.Get("Authorization")
	f.arrivals = append(f.arrivals, time.Now())
	run, wait, kv := f.running, f.waiting, f.kv
	itlSecs, itlCount := f.itlSecs, f.itlCount
	sleepGauge, sleep := f.sleepGauge, f.sleep
	gate, arrived := f.gate, f.arrived
	f.mu.Unlock()
	if arrived != nil {
		arrived <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	switch f.mode.Load().(string) {
	case mode500:
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
	case modeHang:
		<-r.Context().Done()
	case modeHTML:
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, "<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>please log in</body></html>\n")
	case modeGarbage:
		fmt.Fprint(w, "vllm:num_requests_running{engine=\"0\" oops\n\x00\x01\x02")
	case modeHuge:
		chunk := []byte(strings.Repeat("# padding comment line that is not a metric\n", 1000))
		for written := 0; written < 50<<20; written += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return // client gave up, as it should
			}
		}
	case modeMissing:
		fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\"} %g\n", run)
	default:
		fmt.Fprintf(w, "# HELP vllm:num_requests_running r\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} %g\n", run)
		fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %g\n", wait)
		fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} %g\n", kv)
		fmt.Fprint(w, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1000\"} 1.0\n")
		if itlCount > 0 {
			fmt.Fprintf(w, "# TYPE vllm:inter_token_latency_seconds histogram\nvllm:inter_token_latency_seconds_bucket{engine=\"0\",le=\"+Inf\"} %g\n", itlCount)
			fmt.Fprintf(w, "vllm:inter_token_latency_seconds_count{engine=\"0\"} %g\nvllm:inter_token_latency_seconds_sum{engine=\"0\"} %g\n", itlCount, itlSecs)
		}
		if sleepGauge {
			fmt.Fprint(w, sleepStatePage("0", sleep))
		}
	}
}

// fastOpts polls often so state machines move quickly in tests; the timeout
// is generous so a loaded machine (-race, shared cores) does not fail
// scrapes that should succeed.
func fastOpts() Options {
	return Options{PollInterval: 20 * time.Millisecond, PollTimeout: 10 * time.Second, StaleAfter: 3}
}
