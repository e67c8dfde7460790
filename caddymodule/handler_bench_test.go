package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/fleet"
)

// The benchmarks build the llm_admission handler directly on a fleet whose
// one engine is a static /metrics page (no Caddy, no proxy), so they measure
// the handler itself.

// benchGaugePage serves a vLLM /metrics page with the given running count.
type benchGaugePage struct{ running atomic.Int64 }

func (p *benchGaugePage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"sim-model\",engine=\"0\"} %d.0\n"+
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"sim-model\",engine=\"0\"} 0.0\n"+
		"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"sim-model\",engine=\"0\"} 0.1\n", p.running.Load())
}

// benchFleet is a started fleet with one engine whose gauges come from page,
// scraped once at start (poll interval 1h) and known when it returns.
func benchFleet(tb testing.TB, page *benchGaugePage) (*fleet.Fleet, string) {
	tb.Helper()
	srv := httptest.NewServer(page)
	tb.Cleanup(srv.Close)
	dial := strings.TrimPrefix(srv.URL, "http://")
	f := fleet.New(zap.NewNop(), fleet.Options{})
	tb.Cleanup(f.Close)
	gen := f.NewGeneration(fleet.Config{
		PollInterval: time.Hour,
		PollTimeout:  5 * time.Second,
		StaleAfter:   3,
		IdleTTL:      time.Hour,
		Engines:      []*fleet.EngineConfig{{Dial: dial}},
	}, zap.NewNop())
	f.Start(gen)
	for w := newWait(tb, 10*time.Second, "engine gauges known").pace(5 * time.Millisecond); ; w.tick() {
		if e, ok := f.Registry().Get(dial); ok && e.Load().Known {
			// As lb_policy llm in the same route would have taught it.
			f.LearnPool(gen, "default", []string{dial})
			return f, dial
		}
	}
}

func benchHandler(f *fleet.Fleet, h Admission) *Admission {
	h.setDefaults()
	h.fleet, h.logger = f, zap.NewNop()
	return &h
}

// benchChatBody is a chat completion of about 3 KB: a system prompt, a few
// turns, sampling options.
func benchChatBody() []byte {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You are a careful assistant. Answer briefly and cite sources. ", 20)}}
	for i := range 6 {
		msgs = append(msgs,
			map[string]string{"role": "user", "content": fmt.Sprintf("Question %d: how does admission control interact with prefix caching in a fleet of engines?", i)},
			map[string]string{"role": "assistant", "content": "It keeps engines below their limits while the router keeps prefixes warm."})
	}
	b, _ := json.Marshal(map[string]any{
		"model": "sim-model", "messages": msgs, "stream": false, "max_tokens": 256,
		"temperature": 0.7, "top_p": 0.95, "user": "bench",
	})
	return b
}

// benchDiscardWriter is a ResponseWriter that keeps nothing.
type benchDiscardWriter struct{ h http.Header }

func (d *benchDiscardWriter) Header() http.Header         { return d.h }
func (d *benchDiscardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *benchDiscardWriter) WriteHeader(int)             {}

// benchChatResponse is what the trivial next handler answers.
var benchChatResponse = []byte(`{"id":"chatcmpl-1","object":"chat.completion","model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":512,"completion_tokens":1,"total_tokens":513}}`)

// benchNext reads the body and answers a fixed completion, as an upstream
// would without any network.
var benchNext = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(benchChatResponse)
	return err
})

func benchRequest(ctx context.Context, body []byte) *http.Request {
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw/v1/chat/completions", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

func benchVarsContext() context.Context {
	return context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{})
}

// BenchmarkAdmissionHandler is the llm_admission handler's added cost per
// admitted request: the next handler alone, then the handler in front of it
// (body read and parse, band, gate, reservation on the engine with the most
// room, observing writer, release). The difference of the two is the
// handler's latency.
func BenchmarkAdmissionHandler(b *testing.B) {
	f, _ := benchFleet(b, new(benchGaugePage))
	h := benchHandler(f, Admission{MaxInflight: 1 << 20})
	body := benchChatBody()
	b.Run("next_only", func(b *testing.B) {
		w := &benchDiscardWriter{h: http.Header{}}
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			clear(w.h)
			r := benchRequest(benchVarsContext(), body)
			if err := benchNext.ServeHTTP(w, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("admission", func(b *testing.B) {
		w := &benchDiscardWriter{h: http.Header{}}
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			clear(w.h)
			r := benchRequest(benchVarsContext(), body)
			if err := h.ServeHTTP(w, r, benchNext); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkParkedMemory is the memory one parked request holds, over 10,000
// parked at once: through the gate alone (the Waiter and its TryFunc), and
// through the handler's real path (a goroutine per request in ServeHTTP
// with its body read, parsed request, closure, Waiter and timer, as a
// connection's goroutine would hold them; the HTTP server's own
// per-connection buffers are not included).
func BenchmarkParkedMemory(b *testing.B) {
	const n = 10000
	b.Run("gate", func(b *testing.B) {
		for b.Loop() {
			g := admission.NewGate(admission.Config{QueueSize: 2 * n})
			ws := make([]*admission.Waiter, n)
			heap0, stack0 := benchMem()
			for i := range ws {
				w, err := g.Enter(admission.Normal, func() bool { return false })
				if err != nil {
					b.Fatal(err)
				}
				ws[i] = w
			}
			reportMem(b, n, heap0, stack0)
			for _, w := range ws {
				w.Leave()
			}
		}
	})
	b.Run("handler", func(b *testing.B) {
		page := new(benchGaugePage)
		page.running.Store(1) // at max_inflight: everything parks
		f, _ := benchFleet(b, page)
		h := benchHandler(f, Admission{MaxInflight: 1, QueueSize: 2 * n, MaxPark: caddy.Duration(time.Hour)})
		body := benchChatBody()
		for b.Loop() {
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			heap0, stack0 := benchMem()
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rctx := context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
					_ = h.ServeHTTP(&benchDiscardWriter{h: http.Header{}}, benchRequest(rctx, body), benchNext)
				}()
			}
			w := newWait(b, 30*time.Second, fmt.Sprintf("%d parked", n)).pace(time.Millisecond)
			for f.Gates()["default"] == nil || f.Gates()["default"].Stats().Depth[admission.Normal] < n {
				w.tick()
			}
			reportMem(b, n, heap0, stack0)
			cancel()
			wg.Wait()
		}
	})
}

// benchMem is the live heap and the goroutine stacks after a GC.
func benchMem() (heap, stack int64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc), int64(m.StackInuse)
}

// reportMem reports the memory held per parked request since (heap0, stack0).
func reportMem(b *testing.B, n int, heap0, stack0 int64) {
	heap, stack := benchMem()
	b.ReportMetric(float64(heap-heap0+stack-stack0)/float64(n), "B/parked")
	b.ReportMetric(float64(heap-heap0)/float64(n), "heap-B/parked")
	b.ReportMetric(float64(stack-stack0)/float64(n), "stack-B/parked")
}
