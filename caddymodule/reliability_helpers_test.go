package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
)

// Helpers of the reliability and security tests (reliability_*_test.go,
// tls_*_test.go). They drive the in-process Caddy of
// integration_helpers_test.go; names start with rel so that they do not
// collide with the other test files of the package.

// relEngine is one engine entry of the llm app.
type relEngine struct {
	dial   string
	kv     string // kv_events endpoint; "" = none
	replay string // kv_replay endpoint; "" = none
	extra  string // more lines inside engine { }
}

// relEngines lists simulated engines with their KV endpoints.
func relEngines(es ...*vllmsim.Engine) []relEngine {
	out := make([]relEngine, len(es))
	for i, e := range es {
		out[i] = relEngine{dial: e.Addr(), kv: e.KVEndpoint(), replay: e.ReplayEndpoint()}
	}
	return out
}

// relGateway renders a Caddyfile for the reliability tests; it is more
// flexible than gatewayCaddyfile (global options, site lines, TLS sites).
type relGateway struct {
	engines     []relEngine
	upstreams   []string // reverse_proxy upstreams; default the engines' dials
	global      string   // more global option lines
	appExtra    string   // lines inside llm { }
	site        string   // site address; default http://<gatewayAddr>
	siteExtra   string   // lines inside the site block, before the handlers
	admission   string   // lines inside llm_admission { }; "-" omits it
	policy      string   // lines inside lb_policy llm { }; "-" round_robin
	proxyExtra  string   // lines inside reverse_proxy { }
	pollIntervl string   // default 50ms
}

func (g relGateway) caddyfile() string {
	var b strings.Builder
	poll := g.pollIntervl
	if poll == "" {
		poll = "50ms"
	}
	fmt.Fprintf(&b, "{\n\tadmin %s\n\tskip_install_trust\n\thttp_port %d\n\thttps_port %d\n\tgrace_period 1ns\n%s", adminAddr, httpPort, httpsPort, g.global)
	fmt.Fprintf(&b, "\tllm {\n\t\tpoll_interval %s\n%s", poll, g.appExtra)
	for _, e := range g.engines {
		fmt.Fprintf(&b, "\t\tengine %s {\n", e.dial)
		if e.kv != "" {
			fmt.Fprintf(&b, "\t\t\tkv_events %s\n", e.kv)
		}
		if e.replay != "" {
			fmt.Fprintf(&b, "\t\t\tkv_replay %s\n", e.replay)
		}
		b.WriteString(e.extra)
		b.WriteString("\t\t}\n")
	}
	site := g.site
	if site == "" {
		site = "http://" + gatewayAddr
	}
	fmt.Fprintf(&b, "\t}\n}\n\n%s {\n%s", site, g.siteExtra)
	if g.admission != "-" {
		fmt.Fprintf(&b, "\tllm_admission {\n%s\t}\n", g.admission)
	}
	ups := g.upstreams
	if ups == nil {
		for _, e := range g.engines {
			ups = append(ups, e.dial)
		}
	}
	fmt.Fprintf(&b, "\treverse_proxy %s {\n", strings.Join(ups, " "))
	if g.policy == "-" {
		b.WriteString("\t\tlb_policy round_robin\n")
	} else {
		fmt.Fprintf(&b, "\t\tlb_policy llm {\n%s\t\t}\n", g.policy)
	}
	fmt.Fprintf(&b, "\t\tflush_interval -1\n%s\t}\n}\n", g.proxyExtra)
	return b.String()
}

// load loads the gateway into the shared in-process Caddy.
func (g relGateway) load(t testing.TB) {
	t.Helper()
	newTester(t, g.caddyfile())
}

// relStreamBody is a streaming chat request generating maxTokens tokens.
func relStreamBody(content string, maxTokens int) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "sim-model",
		"stream":     true,
		"max_tokens": maxTokens,
		"messages":   []map[string]string{{"role": "user", "content": content}},
	})
	return string(b)
}

// relStream is the outcome of one streamed request, read to its end.
type relStream struct {
	status   int
	header   http.Header
	data     int    // "data: {...}" token events
	done     bool   // "data: [DONE]" seen
	errEvent string // the data line of an "event: error", if any
	body     string // the raw body (bounded)
	readErr  error  // how reading the body ended (nil = clean EOF)
	err      error  // the request failed before a response
	reused   bool   // sent on a reused keep-alive connection
	proto    int    // HTTP major version of the response
}

// keepAliveRace reports a request that failed before any response on a
// reused keep-alive connection: the server closed the idle connection
// (as a config reload does) while the request was on its way, so it was
// never read. Clients retry these (Go's transport does for idempotent
// requests, the OpenAI SDKs for every connection error).
func (s relStream) keepAliveRace() bool {
	return s.err != nil && s.status == 0 && s.reused
}

// complete reports a full, clean stream.
func (s relStream) complete() bool {
	return s.err == nil && s.status == http.StatusOK && s.done && s.readErr == nil && s.errEvent == ""
}

// cleanError reports a response that ended cleanly with an error the client
// can see: a JSON error status, or an SSE error event.
func (s relStream) cleanError() bool {
	if s.err != nil || s.readErr != nil {
		return false
	}
	if s.status >= 400 {
		return json.Valid([]byte(s.body))
	}
	return s.errEvent != ""
}

// relDoStream sends a streaming request through the gateway (or to url when
// set) and reads it to the end, bounded by ctx.
func relDoStream(ctx context.Context, c *http.Client, url, body string, header map[string]string) relStream {
	return relDoStreamFn(ctx, c, url, body, header, nil)
}

// relDoStreamFn is relDoStream calling onData(n) after the n-th token event.
func relDoStreamFn(ctx context.Context, c *http.Client, url, body string, header map[string]string, onData func(n int)) relStream {
	if c == nil {
		c = client
	}
	if url == "" {
		url = "http://" + gatewayAddr + "/v1/chat/completions"
	}
	var reused bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return relStream{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		return relStream{err: err, reused: reused}
	}
	defer res.Body.Close()
	out := relStream{status: res.StatusCode, header: res.Header, reused: reused, proto: res.ProtoMajor}
	var raw strings.Builder
	br := bufio.NewReader(res.Body)
	errEvent := false
	for {
		line, err := br.ReadString('\n')
		if raw.Len() < 64<<10 {
			raw.WriteString(line)
		}
		l := strings.TrimRight(line, "\r\n")
		switch {
		case l == "event: error":
			errEvent = true
		case l == "data: [DONE]":
			out.done = true
		case strings.HasPrefix(l, "data: ") && errEvent:
			out.errEvent = strings.TrimPrefix(l, "data: ")
			errEvent = false
		case strings.HasPrefix(l, "data: "):
			out.data++
			if onData != nil {
				onData(out.data)
			}
		}
		if err != nil {
			if err != io.EOF {
				out.readErr = err
			}
			break
		}
	}
	out.body = raw.String()
	return out
}

// relGoroutines returns the goroutine count once it has settled: the lowest
// of several samples over a second, after a GC.
func relGoroutines() int {
	n := runtime.NumGoroutine()
	for range 10 {
		runtime.GC()
		time.Sleep(100 * time.Millisecond)
		n = min(n, runtime.NumGoroutine())
	}
	return n
}

// relWaitGoroutines waits until the goroutine count is at most limit, and
// fails with the goroutines that are new since base (a relGoroutineGroups
// snapshot) when it does not get there.
func relWaitGoroutines(t testing.TB, limit int, base map[string]int, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		client.CloseIdleConnections()
		n := relGoroutines()
		if n <= limit {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d, want at most %d; groups grown since the baseline:\n%s", n, limit, relGroupDiff(base, relGoroutineGroups()))
			return n
		}
	}
}

// relGoroutineGroups counts the live goroutines by their top function and
// the function that created them.
func relGoroutineGroups() map[string]int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	counts := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(strings.TrimSpace(g), "\n")
		if len(lines) < 2 {
			continue
		}
		key := strings.TrimSpace(lines[1])
		if i := strings.LastIndexByte(key, '('); i > 0 {
			key = key[:i]
		}
		for _, l := range lines {
			if strings.HasPrefix(l, "created by ") {
				c := strings.TrimPrefix(l, "created by ")
				if i := strings.Index(c, " in goroutine"); i > 0 {
					c = c[:i]
				}
				key += " <- " + c
			}
		}
		counts[key]++
	}
	return counts
}

// relGroupDiff lists the groups that grew from a to b.
func relGroupDiff(a, b map[string]int) string {
	var out strings.Builder
	for k, n := range b {
		if n > a[k] {
			fmt.Fprintf(&out, "%+5d %s\n", n-a[k], k)
		}
	}
	return out.String()
}

// relHeapInuse returns HeapInuse after two GCs.
func relHeapInuse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// relReset loads a config without engines (idle_ttl 1ms) and waits until
// the shared fleet has forgotten every engine, so a test leaves no engines,
// pollers or subscriptions behind for the tests after it. It talks to the
// admin API directly: it runs in t.Cleanup, possibly after a failure.
func relReset(t testing.TB) {
	t.Helper()
	cfg := fmt.Sprintf("{\n\tadmin %s\n\tskip_install_trust\n\thttp_port %d\n\thttps_port %d\n\tgrace_period 1ns\n\tllm {\n\t\tidle_ttl 1ms\n\t}\n}\n\nhttp://%s {\n\trespond \"reset\"\n}\n",
		adminAddr, httpPort, httpsPort, gatewayAddr)
	req, err := http.NewRequest(http.MethodPost, "http://"+adminAddr+"/load", strings.NewReader(cfg))
	if err != nil {
		t.Error(err)
		return
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	res, err := client.Do(req)
	if err != nil {
		t.Errorf("reset load: %v", err)
		return
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("reset load: %d %s", res.StatusCode, body)
		return
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var all []engineReport
		if adminJSON(t, http.MethodGet, "/llm/engines", "", &all) == http.StatusOK && len(all) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("reset: %d engines still known", len(all))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// relTokenize asks an engine's /tokenize for the tokens of a one-message
// chat, as the gateway's policy would.
func relTokenize(t testing.TB, e *vllmsim.Engine, content string) []uint64 {
	t.Helper()
	b, _ := json.Marshal(map[string]any{
		"model":    "sim-model",
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	res, err := client.Post(e.URL()+"/tokenize", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out struct {
		Tokens []uint64 `json:"tokens"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil || len(out.Tokens) == 0 {
		t.Fatalf("tokenize: %v %+v", err, out)
	}
	return out.Tokens
}

// relCandidate is one candidate of the explain API.
type relCandidate struct {
	Dial          string  `json:"dial"`
	Tier          string  `json:"tier"`
	MatchedBlocks int     `json:"matched_blocks"`
	Cost          float64 `json:"cost"`
}

// relExplain returns the explain API's candidate for dial.
func relExplain(t testing.TB, body, dial string) relCandidate {
	t.Helper()
	var out struct {
		Candidates []relCandidate `json:"candidates"`
	}
	if code := adminJSON(t, http.MethodPost, "/llm/explain", body, &out); code != http.StatusOK {
		t.Fatalf("explain: %d", code)
	}
	for _, c := range out.Candidates {
		if c.Dial == dial {
			return c
		}
	}
	t.Fatalf("explain: no candidate %s in %+v", dial, out.Candidates)
	return relCandidate{}
}
