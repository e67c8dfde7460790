package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/freeport"
	"github.com/llmgw/caddy-llmgw/internal/testutil/tcplisten"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/caddyserver/caddy/v2/caddytest"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// The integration tests run one in-process Caddy (caddytest), reloaded by
// each test, in front of simulated vLLM engines on loopback. Its admin,
// HTTP and HTTPS ports are chosen when the test binary starts (see
// freeport.Port), so that test processes of this package and of the others run
// side by side; LLMGW_TEST_ADMIN_PORT / LLMGW_TEST_HTTP_PORT pin the first
// two instead.
var (
	adminPort   = envPort("LLMGW_TEST_ADMIN_PORT")
	httpPort    = envPort("LLMGW_TEST_HTTP_PORT")
	httpsPort   = envPort("")
	adminAddr   = fmt.Sprintf("localhost:%d", adminPort)
	gatewayAddr = fmt.Sprintf("127.0.0.1:%d", httpPort)
)

// envPort is the port the environment variable name sets, or else a free
// one. It runs at package initialisation, before any test: a failure
// there is no test's, hence the panic.
func envPort(name string) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	port, err := freeport.Port()
	if err != nil {
		panic(err)
	}
	return port
}

// mustFreePort is freeport.Port for a test.
func mustFreePort(t testing.TB, hosts ...string) int {
	t.Helper()
	port, err := freeport.Port(hosts...)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// startEngines starts n simulated engines with KV events on OS-assigned
// ports, closed when the test ends.
func startEngines(t testing.TB, n int, cfg vllmsim.Config) []*vllmsim.Engine {
	t.Helper()
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 50
	}
	if cfg.KVEvents == nil {
		cfg.KVEvents = &vllmsim.KVEventsConfig{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0"}
	}
	engines := make([]*vllmsim.Engine, n)
	for i := range engines {
		c := cfg
		kv := *cfg.KVEvents
		c.KVEvents = &kv
		e, err := vllmsim.Start(context.Background(), c)
		if err != nil {
			t.Fatalf("starting engine %d: %v", i, err)
		}
		engines[i] = e
		t.Cleanup(func() { _ = e.Close() })
	}
	return engines
}

// slowEngine is a simulated engine that runs in real time (TimeScale 1) with
// a 10ms decode step, so a request with a large max_tokens holds a slot for as
// long as the test wants.
func slowEngine(t testing.TB) *vllmsim.Engine {
	t.Helper()
	return startEngines(t, 1, vllmsim.Config{TimeScale: 1, DecodeStepTime: 10 * time.Millisecond})[0]
}

// gateway is the one Caddyfile of the integration tests: global options,
// the llm app and its engines, and one site with llm_admission in front of
// reverse_proxy with lb_policy llm. Every field is optional.
type gateway struct {
	engines      []gatewayEngine // the llm app's engines
	engineExtra  string          // lines inside every engine { }
	upstreams    []string        // reverse_proxy's upstreams; default the engines' dials
	dynamic      string          // a `dynamic ...` block instead of the upstream list
	global       string          // more global option lines
	pollInterval string          // poll_interval, default 50ms
	appExtra     string          // lines inside llm { }
	patient      bool            // tokenize_timeout 10s and poll_timeout 2s unless appExtra sets them
	noApp        bool            // no llm app at all (with respond)
	site         string          // the site address; default http://<gatewayAddr>
	siteExtra    string          // lines inside the site block, before the handlers
	respond      string          // when set, the site only responds this: no llm_admission, no proxy
	admission    string          // lines inside llm_admission { }; "-" omits the handler
	policy       string          // lines inside lb_policy llm { }; "-" round_robin; or a whole "lb_policy ..." line
	proxyExtra   string          // lines inside reverse_proxy { }
}

// gatewayEngine is one engine of the llm app.
type gatewayEngine struct {
	dial   string
	kv     string // kv_events endpoint; "" = none
	replay string // kv_replay endpoint; "" = none
	extra  string // more lines inside engine { }
}

// kvEngines lists simulated engines with their KV-event endpoints.
func kvEngines(es ...*vllmsim.Engine) []gatewayEngine {
	out := make([]gatewayEngine, len(es))
	for i, e := range es {
		out[i] = gatewayEngine{dial: e.Addr(), kv: e.KVEndpoint(), replay: e.ReplayEndpoint()}
	}
	return out
}

// noKVEngines lists simulated engines without subscribing to their KV events.
func noKVEngines(es ...*vllmsim.Engine) []gatewayEngine {
	out := make([]gatewayEngine, len(es))
	for i, e := range es {
		out[i] = gatewayEngine{dial: e.Addr()}
	}
	return out
}

// dialEngines lists engines by dial address only (stand-ins, recorders).
func dialEngines(dials ...string) []gatewayEngine {
	out := make([]gatewayEngine, len(dials))
	for i, d := range dials {
		out[i] = gatewayEngine{dial: d}
	}
	return out
}

func (g gateway) caddyfile() string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin %s\n\tskip_install_trust\n\thttp_port %d\n\thttps_port %d\n\tgrace_period 1ns\n%s", adminAddr, httpPort, httpsPort, g.global)
	if !g.noApp {
		g.writeApp(&b)
	}
	site := g.site
	if site == "" {
		site = "http://" + gatewayAddr
	}
	fmt.Fprintf(&b, "}\n\n%s {\n%s", site, g.siteExtra)
	if g.respond != "" {
		fmt.Fprintf(&b, "\trespond %q\n}\n", g.respond)
		return b.String()
	}
	if g.admission != "-" {
		fmt.Fprintf(&b, "\tllm_admission {\n%s\t}\n", g.admission)
	}
	g.writeProxy(&b)
	b.WriteString("}\n")
	return b.String()
}

// writeApp writes the llm app's global block.
func (g gateway) writeApp(b *strings.Builder) {
	poll, app := g.pollInterval, g.appExtra
	if poll == "" {
		poll = "50ms"
	}
	if g.patient && !strings.Contains(app, "tokenize_timeout") {
		// A loaded test machine must not time /tokenize out (500ms by
		// default) and push decisions the tests expect precise onto the
		// approximate tier.
		app += "\t\ttokenize_timeout 10s\n"
	}
	if g.patient && !strings.Contains(app, "poll_timeout") {
		// Nor time scrapes out (the timeout defaults to the interval),
		// which makes gauges stale and load unknown.
		app += "\t\tpoll_timeout 2s\n"
	}
	fmt.Fprintf(b, "\tllm {\n\t\tpoll_interval %s\n%s", poll, app)
	for _, e := range g.engines {
		fmt.Fprintf(b, "\t\tengine %s {\n", e.dial)
		if e.kv != "" {
			fmt.Fprintf(b, "\t\t\tkv_events %s\n", e.kv)
		}
		if e.replay != "" {
			fmt.Fprintf(b, "\t\t\tkv_replay %s\n", e.replay)
		}
		b.WriteString(e.extra + g.engineExtra + "\t\t}\n")
	}
	b.WriteString("\t}\n")
}

// writeProxy writes the site's reverse_proxy.
func (g gateway) writeProxy(b *strings.Builder) {
	b.WriteString("\treverse_proxy")
	if g.dynamic == "" {
		ups := g.upstreams
		if ups == nil {
			for _, e := range g.engines {
				ups = append(ups, e.dial)
			}
		}
		for _, u := range ups {
			b.WriteString(" " + u)
		}
	}
	b.WriteString(" {\n" + g.dynamic)
	switch {
	case g.policy == "-":
		b.WriteString("\t\tlb_policy round_robin\n")
	case strings.HasPrefix(g.policy, "lb_policy "):
		b.WriteString("\t\t" + g.policy + "\n")
	default:
		fmt.Fprintf(b, "\t\tlb_policy llm {\n%s\t\t}\n", g.policy)
	}
	fmt.Fprintf(b, "\t\tflush_interval -1\n%s\t}\n", g.proxyExtra)
}

// load loads the gateway into the shared in-process Caddy.
func (g gateway) load(t testing.TB) {
	t.Helper()
	newTester(t, g.caddyfile())
}

// newTester loads cfg into the shared in-process Caddy, then closes the
// shared client's idle connections. Every load replaces a config (the
// previous test's, if not this one's), and the old config's server closes
// its idle connections as it shuts down: a request sent on one as it
// closes fails with EOF, and Go's transport does not retry a POST. CI saw
// that fail TestFleetLifecycleClosesTokenizeConnections.
func newTester(t testing.TB, cfg string) *caddytest.Tester {
	t.Helper()
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{
		AdminPort:          adminPort,
		TestRequestTimeout: 30 * time.Second,
		LoadRequestTimeout: 30 * time.Second,
	})
	tester.InitServer(cfg, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	client.CloseIdleConnections()
	if err := settleListeners(context.Background()); err != nil {
		t.Fatal(err)
	}
	return tester
}

// settleListeners waits until the config a load replaced has closed its
// listeners. Caddy's /load answers once the old servers have begun to shut
// down, while their SO_REUSEPORT sockets still share the ports with the
// new ones: a fresh connection the kernel queues on an old socket in that
// moment is reset as it closes (CI saw TestAdmissionMetricsOutage's first
// request after a reload fail so). See package tcplisten.
func settleListeners(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tcplisten.WaitOne(ctx, httpPort, adminPort); err != nil {
		return fmt.Errorf("after a config load: %w", err)
	}
	return nil
}

// postLoad posts a Caddyfile to the admin API's /load and returns the
// answer's status and body (its first 64 KiB). It takes no testing.TB:
// callers decide whether a failure ends the test.
func postLoad(ctx context.Context, cfg string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+adminAddr+"/load", strings.NewReader(cfg))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	// Caddy replaces its admin server on every load, a refused one too
	// (the old config runs again): a kept-alive connection to the one
	// before may be reset as this request is sent on it. So may one to
	// the gateway's server, whose idle connections the shared client
	// drops after the load (as newTester does).
	req.Close = true
	defer client.CloseIdleConnections()
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 1<<16))
	return res.StatusCode, body, settleListeners(ctx)
}

// resetGateway loads a config without engines (idle_ttl 1ms) and waits until
// the shared fleet has forgotten every engine, so a test leaves no engines,
// pollers or subscriptions behind for the tests after it. It talks to the
// admin API directly: it runs in t.Cleanup, possibly after a failure.
func resetGateway(t testing.TB) {
	t.Helper()
	cfg := gateway{appExtra: "\t\tidle_ttl 1ms\n", respond: "reset"}.caddyfile()
	status, body, err := postLoad(context.Background(), cfg)
	if err != nil {
		t.Errorf("reset load: %v", err)
		return
	}
	if status != http.StatusOK {
		t.Errorf("reset load: %d %s", status, body)
		return
	}
	var all []fleet.EngineReport
	forgotten := func() bool {
		return adminJSON(t, http.MethodGet, "/llm/engines", "", &all) == http.StatusOK && len(all) == 0
	}
	for w := newWait(t, 20*time.Second, "the fleet to forget its engines"); !forgotten(); w.tick(len(all), " engines still known") {
	}
}

// client is a plain HTTP client for the gateway, without caddytest's
// 5-second default.
var client = &http.Client{Timeout: 60 * time.Second}

// chat is a chat completion request for the simulated model.
type chat struct {
	system    string // a system message first, when set: the shared prefix
	user      string // the user message
	maxTokens int    // max_tokens; default 8
	stream    bool
	usage     bool // stream_options.include_usage
}

// body is the request's JSON.
func (c chat) body() string {
	msgs := []map[string]string{}
	if c.system != "" {
		msgs = append(msgs, map[string]string{"role": "system", "content": c.system})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": c.user})
	m := map[string]any{"model": "sim-model", "stream": c.stream, "max_tokens": c.maxTokens, "messages": msgs}
	if c.maxTokens == 0 {
		m["max_tokens"] = 8
	}
	if c.usage {
		m["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// chatBody is the body of a small chat completion.
func chatBody(stream bool, content string) string {
	return chat{user: content, stream: stream}.body()
}

// reply is one answer, read to its end.
type reply struct {
	status   int
	header   http.Header
	upstream string // X-LLM-Upstream
	tier     string // X-LLM-Tier
	body     string
	data     int    // "data: {...}" SSE events
	done     bool   // "data: [DONE]" seen
	errEvent string // the data line of an "event: error", if any
	err      error  // the request failed, or reading its answer did
	readErr  error  // how reading the answer ended (nil = clean EOF)
	reused   bool   // sent on a reused keep-alive connection
	proto    int    // HTTP major version of the answer
	at       time.Time
}

// keepAliveRace reports a request that failed before any response on a
// reused keep-alive connection: the server closed the idle connection
// (as a config reload does) while the request was on its way, so it was
// never read. Clients retry these (Go's transport does for idempotent
// requests, the OpenAI SDKs for every connection error).
func (r reply) keepAliveRace() bool {
	return r.err != nil && r.status == 0 && r.reused
}

// listenerReset reports a request that failed on a fresh connection
// before any response, with EOF or a reset: Caddy's listener handover on a
// reload. It binds the new config's socket beside the old one
// (SO_REUSEPORT) and the kernel resets the connections it queued on the
// old socket as that closes (see package tcplisten and the soak's
// explainReloadResets). No gateway code ever saw the request; clients
// retry such connection errors.
func (r reply) listenerReset() bool {
	if r.err == nil || r.status != 0 || r.reused {
		return false
	}
	return errors.Is(r.err, syscall.ECONNRESET) || errors.Is(r.err, io.EOF) || strings.HasSuffix(r.err.Error(), ": EOF")
}

// complete reports a full, clean stream.
func (r reply) complete() bool {
	return r.err == nil && r.status == http.StatusOK && r.done && r.errEvent == ""
}

// cleanError reports an answer that ended cleanly with an error the client
// can see: a JSON error status, or an SSE error event.
func (r reply) cleanError() bool {
	if r.err != nil {
		return false
	}
	if r.status >= 400 {
		return json.Valid([]byte(r.body))
	}
	return r.errEvent != ""
}

// newPost is a JSON POST of body to url ("" = the gateway's chat
// completions) with the given headers.
func newPost(ctx context.Context, url, body string, header map[string]string) (*http.Request, error) {
	if url == "" {
		url = "http://" + gatewayAddr + "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return req, nil
}

// send posts body to url ("" = the gateway) and reads the answer.
func send(ctx context.Context, url, body string, header map[string]string) reply {
	req, err := newPost(ctx, url, body, header)
	if err != nil {
		return reply{err: err}
	}
	return do(nil, req, nil)
}

// do sends req on c (nil: client) and reads the answer to its end, calling
// onData(n), when set, after the n-th SSE data event.
func do(c *http.Client, req *http.Request, onData func(n int)) reply {
	if c == nil {
		c = client
	}
	var reused bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
	res, err := c.Do(req)
	if err != nil {
		return reply{err: err, reused: reused, at: time.Now()}
	}
	defer res.Body.Close()
	out := reply{status: res.StatusCode, header: res.Header, reused: reused, proto: res.ProtoMajor,
		upstream: res.Header.Get("X-LLM-Upstream"), tier: res.Header.Get("X-LLM-Tier")}
	out.readSSE(res.Body, onData)
	out.at = time.Now()
	return out
}

// readSSE reads an answer's body, counting its SSE events.
func (r *reply) readSSE(body io.Reader, onData func(n int)) {
	var raw strings.Builder
	br := bufio.NewReader(body)
	errEvent := false
	for {
		line, err := br.ReadString('\n')
		raw.WriteString(line)
		switch l := strings.TrimRight(line, "\r\n"); {
		case l == "event: error":
			errEvent = true
		case l == "data: [DONE]":
			r.done = true
		case strings.HasPrefix(l, "data: ") && errEvent:
			r.errEvent, errEvent = strings.TrimPrefix(l, "data: "), false
		case strings.HasPrefix(l, "data: "):
			r.data++
			if onData != nil {
				onData(r.data)
			}
		}
		if err != nil {
			if err != io.EOF {
				r.readErr, r.err = err, err
			}
			break
		}
	}
	r.body = raw.String()
}

// sendAsync is send in the background; the reply arrives on the channel.
func sendAsync(ctx context.Context, url, body string, header map[string]string) <-chan reply {
	ch := make(chan reply, 1)
	go func() { ch <- send(ctx, url, body, header) }()
	return ch
}

// mustSend is send that fails the test unless the answer is a whole 200.
func mustSend(t testing.TB, url, body string, header map[string]string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := send(ctx, url, body, header)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("POST %s: status %d, err %v, body %.300s", url, r.status, r.err, r.body)
	}
	return r
}

// direct sends a chat completion straight to an engine, bypassing the
// gateway (what another gateway or a direct caller would do).
func direct(t testing.TB, e *vllmsim.Engine, body string) reply {
	t.Helper()
	return mustSend(t, e.URL()+"/v1/chat/completions", body, nil)
}

// waitReply receives a reply or fails the test after d.
func waitReply(t testing.TB, ch <-chan reply, d time.Duration) reply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("no response within %v", d)
		return reply{}
	}
}

// sseStream reads an SSE answer line by line, as it arrives.
type sseStream struct {
	res   *http.Response
	lines chan string
}

// openStream posts body through the gateway and returns once the answer's
// headers are in.
func openStream(t testing.TB, ctx context.Context, body string, header map[string]string) *sseStream {
	t.Helper()
	req, err := newPost(ctx, "", body, header)
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("streaming request: %v", err)
	}
	s := &sseStream{res: res, lines: make(chan string, 1024)}
	go func() {
		defer close(s.lines)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	}()
	return s
}

// next returns the next line, or fails the test after d; ok is false at EOF.
func (s *sseStream) next(t testing.TB, d time.Duration) (string, bool) {
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
func (s *sseStream) rest(t testing.TB, d time.Duration) []string {
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

// readAll reads a response body and closes it.
func readAll(t testing.TB, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return string(b)
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

// words returns n distinct one-token words (" <tag><i>"), so a text of n
// words is about n tokens for the simulator's tokenizer.
func words(tag string, n int) string {
	var b strings.Builder
	b.Grow(n * (len(tag) + 7))
	for i := range n {
		fmt.Fprintf(&b, " %s%d", tag, i)
	}
	return b.String()
}

// longText is words one-token words cycling through 26 spellings.
func longText(words int) string {
	var b strings.Builder
	for i := range words {
		b.WriteString("token")
		b.WriteByte(byte('a' + i%26))
		b.WriteByte(' ')
	}
	return b.String()
}

// lazy is a failure detail computed only if the failure happens.
type lazy func() string

func (l lazy) String() string { return l() }

// countGoroutines counts the live goroutines whose stack contains every one
// of parts.
func countGoroutines(parts ...string) int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(g, p)
		}
		if all {
			n++
		}
	}
	return n
}

// wait paces a wait on a condition the caller checks between ticks (for
// the loops whose condition eventually's closure cannot hold as well: one
// that returns a value, or stamps the moment it holds).
type wait struct {
	t        testing.TB
	what     string
	d, every time.Duration
	deadline time.Time
}

// newWait starts a wait of at most d that looks every 10ms.
func newWait(t testing.TB, d time.Duration, what string) *wait {
	return &wait{t: t, what: what, d: d, every: 10 * time.Millisecond, deadline: time.Now().Add(d)}
}

// pace makes the wait look every d.
func (w *wait) pace(d time.Duration) *wait {
	w.every = d
	return w
}

// tick pauses until the next look; once the deadline has passed it fails
// the test, with why (what the last look found) when given.
func (w *wait) tick(why ...any) {
	w.t.Helper()
	if time.Now().After(w.deadline) {
		if len(why) > 0 {
			w.t.Fatalf("timed out after %v waiting for %s: %s", w.d, w.what, fmt.Sprint(why...))
		}
		w.t.Fatalf("timed out after %v waiting for %s", w.d, w.what)
	}
	time.Sleep(w.every)
}

// adminJSON sends an admin request and decodes a 200's answer into v.
func adminJSON(t testing.TB, method, path string, body string, v any) int {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+adminAddr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if v != nil && res.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
	return res.StatusCode
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

// metricValue scrapes the admin /metrics and returns the sum of the series
// of name whose labels include every given label (k="v" strings).
func metricValue(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for _, line := range strings.Split(scrapeMetrics(t), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}

// getEngineReports fetches /llm/engines: every engine's report.
func getEngineReports(t testing.TB) []fleet.EngineReport {
	t.Helper()
	var all []fleet.EngineReport
	adminJSON(t, http.MethodGet, "/llm/engines", "", &all)
	return all
}

// getEngineReport fetches one engine's report from /llm/engines.
func getEngineReport(t testing.TB, dial string) fleet.EngineReport {
	t.Helper()
	for _, r := range getEngineReports(t) {
		if r.Dial == dial {
			return r
		}
	}
	return fleet.EngineReport{}
}

// engineStates is a one-line summary of /llm/engines for failure messages:
// each engine's gauges, their freshness and the gateway's own accounting.
func engineStates(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	for _, r := range getEngineReports(t) {
		fmt.Fprintf(&b, "[%s known %v stale %v running %v waiting %v failed polls %d (%s) inflight %d dispatched %d finished %d breaker %s] ",
			r.Dial, r.Known, r.Stale, r.Running, r.Waiting, r.Failures, r.LastError, r.Inflight, r.Dispatched, r.Finished, r.Breaker)
	}
	return b.String()
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

// getQueue fetches GET /llm/queue.
func getQueue(t testing.TB) queueReport {
	t.Helper()
	var q queueReport
	if code := adminJSON(t, http.MethodGet, "/llm/queue", "", &q); code != http.StatusOK {
		t.Fatalf("/llm/queue: %d", code)
	}
	return q
}

// queueDepth returns the number of requests parked in a band of the default
// pool ("" for all bands).
func queueDepth(t testing.TB, band string) int {
	t.Helper()
	n := 0
	for b, r := range getQueue(t).Pools["default"] {
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
	// On a timeout, say whether admission failed open (stale or unknown
	// gauges admit instead of parking) and what the engines looked like.
	why := lazy(func() string {
		return fmt.Sprintf("queue %+v; fail-open admissions %v; engines %s", getQueue(t),
			metricValue(t, "llmgw_admission_fail_open_total"), engineStates(t))
	})
	for w := newWait(t, 10*time.Second, fmt.Sprintf("%d parked in band %q", n, band)); queueDepth(t, band) != n; w.tick(why) {
	}
}

// explainReply is POST /llm/explain's answer.
type explainReply struct {
	Pool       string             `json:"pool"`
	Candidates []explainCandidate `json:"candidates"`
	Tier       string             `json:"tier"`
	Outcome    string             `json:"outcome"`
	Tokens     int                `json:"tokens"`
	BlockSize  int                `json:"block_size"`
	Pick       *string            `json:"pick"`
}

// explainCandidate is one candidate of the explain API.
type explainCandidate struct {
	Dial          string  `json:"dial"`
	Tier          string  `json:"tier"`
	MatchedBlocks int     `json:"matched_blocks"`
	Load          float64 `json:"load"`
	Cost          float64 `json:"cost"`
	Excluded      string  `json:"excluded"`
	Adapter       string  `json:"adapter"`      // the LoRA adapter term's state
	AdapterCost   float64 `json:"adapter_cost"` // and its part of Cost
}

// explainFor returns the explain API's candidate for dial.
func explainFor(t testing.TB, body, dial string) explainCandidate {
	t.Helper()
	var ex explainReply
	if code := adminJSON(t, http.MethodPost, "/llm/explain", body, &ex); code != http.StatusOK {
		t.Fatalf("explain: %d", code)
	}
	for _, c := range ex.Candidates {
		if c.Dial == dial {
			return c
		}
	}
	t.Fatalf("explain: no candidate %s in %+v", dial, ex.Candidates)
	return explainCandidate{}
}

// explainJSON is /llm/explain's answer for body, for failure messages.
func explainJSON(t testing.TB, body string) string {
	t.Helper()
	var v any
	adminJSON(t, http.MethodPost, "/llm/explain", body, &v)
	b, _ := json.Marshal(v)
	return string(b)
}

// waitBusy waits until the gateway's view of dial (its last scrape) shows
// at least busy running+waiting requests.
func waitBusy(t testing.TB, dial string, busy int) {
	t.Helper()
	// Only a scrape taken from now on shows occupants the caller just
	// started directly: an older one may count a gateway request that has
	// finished since, whose slot admission (rightly) treats as free.
	since := time.Now()
	testwait.For(t, 10*time.Second, fmt.Sprintf("gateway sees %d busy on %s", busy, dial), func() bool {
		r := getEngineReport(t, dial)
		return r.Known && r.ScrapedAt.After(since) && r.Running+r.Waiting >= float64(busy)
	})
}

// waitKV waits until the gateway's subscription to each engine is connected.
func waitKV(t testing.TB, engines ...*vllmsim.Engine) {
	t.Helper()
	for _, e := range engines {
		testwait.For(t, 15*time.Second, "KV subscription to "+e.Addr(), func() bool {
			r := getEngineReport(t, e.Addr())
			return r.KV != nil && r.KV.Connected
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := e.WaitKVSubscribers(ctx, 1)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// waitBlocks waits until /llm/engines shows at least n blocks held by dial.
func waitBlocks(t testing.TB, dial string, n int) fleet.EngineReport {
	t.Helper()
	var r fleet.EngineReport
	testwait.For(t, 15*time.Second, fmt.Sprintf("%d KV blocks on %s", n, dial), func() bool {
		r = getEngineReport(t, dial)
		return r.KV != nil && r.KV.Blocks >= n
	})
	return r
}

// waitIdle waits until a scrape that began after the call shows dial with
// nothing running or waiting. A request sent straight to an engine (direct)
// stays in its gauges until the next scrape sees it end, and so does one of
// the gateway's own that ended while a scrape was in flight (upstreams'
// Reservation.Done: the safe side). Routing rightly weighs a holder that
// looks busy against the prefill it saves — with no max_inflight, one
// waiting request makes an engine full — so a test that asserts prefix
// routing for back-to-back requests waits for this before each.
//
// An idle report alone is not enough: it may come from a scrape older than
// the request that just ended, while one that caught that request waiting
// is still in flight and lands next. CI saw that send a request of
// TestPolicyDynamicUpstreamsAndReload away from its holder. Scrapes of an
// engine run one after another, so one that completed after another that
// completed after the call began after the call.
func waitIdle(t testing.TB, dial string) {
	t.Helper()
	call := time.Now()
	var after time.Time // the completion of the first scrape seen to complete after call
	waitGauges(t, dial, dial+" idle in a scrape begun after the call", func(r fleet.EngineReport) bool {
		if after.IsZero() {
			if r.ScrapedAt.After(call) {
				after = r.ScrapedAt
			}
			return false
		}
		return r.ScrapedAt.After(after) && idle(r)
	})
}

// idle reports whether an engine's gauges show nothing running or waiting.
func idle(r fleet.EngineReport) bool { return r.Running == 0 && r.Waiting == 0 }

// waitGauges waits until the gateway's view of dial satisfies cond.
func waitGauges(t testing.TB, dial, what string, cond func(fleet.EngineReport) bool) {
	t.Helper()
	testwait.For(t, 15*time.Second, what, func() bool { return cond(getEngineReport(t, dial)) })
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
		body := chat{user: fmt.Sprintf("occupant %d %d", i, time.Now().UnixNano()), stream: true, maxTokens: 20000}.body()
		go func() {
			defer close(o.done)
			send(ctx, e.URL()+"/v1/chat/completions", body, nil)
		}()
	}
	testwait.For(t, 10*time.Second, fmt.Sprintf("%d occupants running on the engine", n), func() bool {
		st := e.Stats()
		return st.Running+st.Waiting >= base+n
	})
	return out
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

// countUpstreams tallies replies by upstream.
func countUpstreams(rs []reply) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		m[r.upstream]++
	}
	return m
}

// parallel runs n calls of fn with at most conc at once and returns
// their results in call order. fn runs on other goroutines: it must not
// call t.Fatal (use send and check the results).
func parallel(n, conc int, fn func(i int) reply) []reply {
	out := make([]reply, n)
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = fn(i)
		}()
	}
	wg.Wait()
	return out
}

// dnsServer answers A queries for any name with ips (and nothing else), so
// `dynamic a` can discover several loopback engines under one name: this
// machine's /etc/hosts maps localhost to 127.0.0.1 only. It serves until the
// test ends and returns its "host:port".
func dnsServer(t testing.TB, ips ...string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	var answers []dnsmessage.AResource
	for _, ip := range ips {
		a := net.ParseIP(ip).To4()
		if a == nil {
			t.Fatalf("not an IPv4 address: %s", ip)
		}
		answers = append(answers, dnsmessage.AResource{A: [4]byte(a)})
	}
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var q dnsmessage.Message
			if err := q.Unpack(buf[:n]); err != nil || len(q.Questions) != 1 {
				continue
			}
			res := dnsmessage.Message{
				Header:    dnsmessage.Header{ID: q.ID, Response: true, Authoritative: true, RecursionAvailable: true},
				Questions: q.Questions,
			}
			if qq := q.Questions[0]; qq.Type == dnsmessage.TypeA {
				for _, a := range answers {
					res.Answers = append(res.Answers, dnsmessage.Resource{
						Header: dnsmessage.ResourceHeader{Name: qq.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
						Body:   &a,
					})
				}
			}
			out, err := res.Pack()
			if err != nil {
				continue
			}
			_, _ = pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String()
}

// tcpProxy forwards a local port to target until closed: a KV-event path
// the test can cut while the engine keeps running.
type tcpProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(p.close)
	return p
}

// endpoint is the proxy's ZeroMQ endpoint.
func (p *tcpProxy) endpoint() string { return "tcp://" + p.ln.Addr().String() }

// close stops accepting and cuts every forwarded connection.
func (p *tcpProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// settledGoroutines returns the goroutine count once it has settled: the
// lowest of samples taken after a GC every 20ms, once no sample has been
// lower for 300ms (goroutines that are ending have ended), or after 2s.
func settledGoroutines() int {
	n, low := runtime.NumGoroutine(), time.Now()
	for start := time.Now(); time.Since(low) < 300*time.Millisecond && time.Since(start) < 2*time.Second; {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
		if m := runtime.NumGoroutine(); m < n {
			n, low = m, time.Now()
		}
	}
	return n
}

// waitGoroutines waits until the goroutine count is at most limit, and
// fails with the goroutines that are new since base (a goroutineGroups
// snapshot) when it does not get there.
func waitGoroutines(t testing.TB, limit int, base map[string]int, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		client.CloseIdleConnections()
		n := settledGoroutines()
		if n <= limit {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines: %d, want at most %d; groups grown since the baseline:\n%s", n, limit, groupDiff(base, goroutineGroups()))
			return n
		}
	}
}

// goroutineGroups counts the live goroutines by their top function and
// the function that created them.
func goroutineGroups() map[string]int {
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

// groupDiff lists the groups that grew from a to b.
func groupDiff(a, b map[string]int) string {
	var out strings.Builder
	for k, n := range b {
		if n > a[k] {
			fmt.Fprintf(&out, "%+5d %s\n", n-a[k], k)
		}
	}
	return out.String()
}

// heapInuse returns HeapInuse after two GCs.
func heapInuse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// engineTokens asks an engine's /tokenize for the tokens of a one-message
// chat, as the gateway's policy would.
func engineTokens(t testing.TB, e *vllmsim.Engine, content string) []uint64 {
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
