package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
)

// Helpers of the admission integration tests (admission_*_test.go). They
// drive the real in-process Caddy of integration_helpers_test.go.

// slowEngine is a simulated engine that runs in real time (TimeScale 1) with
// a 10ms decode step, so a request with a large max_tokens holds a slot for as
// long as the test wants, and its KV events are not subscribed to.
func slowEngine(t testing.TB) *vllmsim.Engine {
	t.Helper()
	return startEngines(t, 1, vllmsim.Config{TimeScale: 1, DecodeStepTime: 10 * time.Millisecond})[0]
}

// occupant is a request sent straight to an engine, bypassing the gateway —
// how another gateway or a direct caller fills an engine ("global by
// construction": admission must see it through the engine's own gauges).
type occupant struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// release cancels the occupant's request and waits for its client to end.
func (o *occupant) release() {
	o.cancel()
	<-o.done
}

// occupy sends n long streaming requests straight to e and waits until the
// engine runs them all.
func occupy(t testing.TB, e *vllmsim.Engine, n int) []*occupant {
	t.Helper()
	base := e.Stats().Running + e.Stats().Waiting
	out := make([]*occupant, n)
	for i := range out {
		ctx, cancel := context.WithCancel(context.Background())
		o := &occupant{cancel: cancel, done: make(chan struct{})}
		out[i] = o
		t.Cleanup(o.release)
		body := fmt.Sprintf(`{"model":"sim-model","stream":true,"max_tokens":20000,"messages":[{"role":"user","content":"occupant %d %d"}]}`, i, time.Now().UnixNano())
		go func() {
			defer close(o.done)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}()
	}
	eventually(t, 10*time.Second, fmt.Sprintf("%d occupants running on the engine", n), func() bool {
		st := e.Stats()
		return st.Running+st.Waiting >= base+n
	})
	return out
}

// admWaitBusy waits until the gateway's view of dial (its last scrape) shows
// at least busy running+waiting requests.
func admWaitBusy(t testing.TB, dial string, busy int) {
	t.Helper()
	// Only a scrape taken from now on shows occupants the caller just
	// started directly: an older one may count a gateway request that has
	// finished since, whose slot admission (rightly) treats as free.
	since := time.Now()
	eventually(t, 10*time.Second, fmt.Sprintf("gateway sees %d busy on %s", busy, dial), func() bool {
		r := getEngineReport(t, dial)
		return r.Known && r.ScrapedAt.After(since) && r.Running+r.Waiting >= float64(busy)
	})
}

// admResult is one finished gateway request.
type admResult struct {
	status int
	header http.Header
	body   string
	err    error
	at     time.Time // when the body ended
}

// admSend posts body to the gateway in the background; the result arrives on
// the returned channel.
func admSend(ctx context.Context, path, body string, header map[string]string) <-chan admResult {
	ch := make(chan admResult, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gatewayAddr+path, strings.NewReader(body))
		if err != nil {
			ch <- admResult{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := client.Do(req)
		if err != nil {
			ch <- admResult{err: err, at: time.Now()}
			return
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		ch <- admResult{status: res.StatusCode, header: res.Header, body: string(b), err: err, at: time.Now()}
	}()
	return ch
}

// admChat is send for a small chat completion.
func admChat(ctx context.Context, stream bool, content string, header map[string]string) <-chan admResult {
	return admSend(ctx, "/v1/chat/completions", chatBody(stream, content), header)
}

// admWait receives a admResult or fails the test after d.
func admWait(t testing.TB, ch <-chan admResult, d time.Duration) admResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("no response within %v", d)
		return admResult{}
	}
}

// queueReport is GET /llm/queue.
type queueReport struct {
	Pools map[string]map[string]struct {
		Depth      int     `json:"depth"`
		OldestWait float64 `json:"oldest_wait_seconds"`
		Admitted   uint64  `json:"admitted"`
		Parked     uint64  `json:"parked"`
	} `json:"pools"`
}

// queueDepth returns the number of requests parked in a band of the default pool
// ("" for all bands).
func queueDepth(t testing.TB, band string) int {
	t.Helper()
	var q queueReport
	if code := adminJSON(t, http.MethodGet, "/llm/queue", "", &q); code != http.StatusOK {
		t.Fatalf("/llm/queue: %d", code)
	}
	n := 0
	for b, r := range q.Pools["default"] {
		if band == "" || b == band {
			n += r.Depth
		}
	}
	return n
}

// waitQueueDepth waits until a band (or all, "") of the default pool holds n
// parked requests.
func waitQueueDepth(t testing.TB, band string, n int) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("%d parked in band %q", n, band), func() bool { return queueDepth(t, band) == n })
}

// admStream reads an SSE response line by line, timestamping each line.
type admStream struct {
	res   *http.Response
	lines chan string
}

// openAdmStream posts a streaming chat completion through the gateway and
// returns once the response headers are in.
func openAdmStream(t testing.TB, ctx context.Context, body string, header map[string]string) *admStream {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gatewayAddr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("streaming request: %v", err)
	}
	s := &admStream{res: res, lines: make(chan string, 1024)}
	go sseLines(res, s.lines)
	return s
}

// next returns the next line, or fails the test after d; ok is false at EOF.
func (s *admStream) next(t testing.TB, d time.Duration) (string, bool) {
	t.Helper()
	select {
	case l, ok := <-s.lines:
		return l, ok
	case <-time.After(d):
		t.Fatalf("no SSE line within %v", d)
		return "", false
	}
}

// rest collects the remaining lines until EOF.
func (s *admStream) rest(t testing.TB, d time.Duration) []string {
	t.Helper()
	var out []string
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				return out
			}
			out = append(out, l)
		case <-deadline:
			t.Fatalf("stream did not end within %v; got %q", d, out)
		}
	}
}

// streamChatBody is a streaming chat completion asking for usage.
func streamChatBody(content string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{
		"model":          "sim-model",
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"max_tokens":     maxTokens,
		"messages":       []map[string]string{{"role": "user", "content": content}},
	})
	return string(b)
}

// upstreamRecorder is an upstream in front of a simulated engine that records what
// the gateway sent for inference and other non-metrics paths.
type upstreamRecorder struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []recordedRequest
}

type recordedRequest struct {
	method, path string
	header       http.Header
	body         []byte
}

func newUpstreamRecorder(t testing.TB, e *vllmsim.Engine) *upstreamRecorder {
	t.Helper()
	u, _ := url.Parse(e.URL())
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.FlushInterval = -1
	rec := &upstreamRecorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" && r.URL.Path != "/tokenize" {
			b, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
			rec.mu.Lock()
			rec.got = append(rec.got, recordedRequest{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: b})
			rec.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (r *upstreamRecorder) addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *upstreamRecorder) last(t testing.TB) recordedRequest {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		t.Fatal("upstream received nothing")
	}
	return r.got[len(r.got)-1]
}

func (r *upstreamRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// admCaddyfile is gatewayCaddyfile for arbitrary upstream dial addresses
// (the upstreamRecorder), without KV subscriptions. policy is the lines of
// lb_policy llm's block, "-" for round_robin, or a whole "lb_policy ..."
// line.
func admCaddyfile(dials []string, appExtra, admission, policy string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin %s\n\tskip_install_trust\n\thttp_port %d\n\thttps_port %d\n\tgrace_period 1ns\n\tllm {\n\t\tpoll_interval 50ms\n%s", adminAddr, httpPort, httpsPort, appExtra)
	for _, d := range dials {
		fmt.Fprintf(&b, "\t\tengine %s\n", d)
	}
	b.WriteString("\t}\n}\n\nhttp://" + gatewayAddr + " {\n")
	fmt.Fprintf(&b, "\tllm_admission {\n%s\t}\n", admission)
	b.WriteString("\treverse_proxy " + strings.Join(dials, " ") + " {\n")
	switch {
	case policy == "-":
		b.WriteString("\t\tlb_policy round_robin\n")
	case strings.HasPrefix(policy, "lb_policy "):
		b.WriteString("\t\t" + policy + "\n")
	default:
		fmt.Fprintf(&b, "\t\tlb_policy llm {\n%s\t\t}\n", policy)
	}
	b.WriteString("\t\tflush_interval -1\n\t}\n}\n")
	return b.String()
}

// scrapeMetrics scrapes the admin /metrics page.
func scrapeMetrics(t testing.TB) string {
	t.Helper()
	res, err := client.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatalf("scraping metrics: %v", err)
	}
	return readAll(t, res)
}

// openAIError decodes an OpenAI-style error body.
func openAIError(t testing.TB, body string) (msg, typ string, code int) {
	t.Helper()
	var v struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Error.Message == "" {
		t.Fatalf("not an OpenAI error body (%v): %q", err, body)
	}
	return v.Error.Message, v.Error.Type, v.Error.Code
}

// sseSplit splits an SSE body into lines.
func sseSplit(body string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}
