package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
)

// The integration tests run one in-process Caddy (caddytest), reloaded by
// each test, in front of simulated vLLM engines on loopback. Its admin,
// HTTP and HTTPS ports are chosen when the test binary starts (see
// freePort), so that test processes of this package and of the others run
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
	port, err := freePort()
	if err != nil {
		panic(err)
	}
	return port
}

// freePort returns a TCP port that nothing listens on, on any interface or,
// when hosts are given, on each of them (IP addresses).
//
// The port is free when probed, not reserved: whoever binds it later may
// find it taken. Ports from listening on :0 would come from the kernel's
// ephemeral range, which is where it also picks every other :0 listener
// and the local port of every outgoing connection of every process — and
// the tests of the other packages, running in parallel, open thousands. So
// the port is drawn at random from below that range, where no port is ever
// assigned implicitly: it stays free until someone names it, as the test
// that closes an engine and starts it again on the same address needs.
func freePort(hosts ...string) (int, error) {
	if len(hosts) == 0 {
		hosts = []string{""}
	}
	lo, hi := 10000, ephemeralLow()
	for range 100 {
		port := lo + rand.IntN(hi-lo)
		held := make([]net.Listener, 0, len(hosts))
		for _, h := range hosts {
			ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				break
			}
			held = append(held, ln)
		}
		for _, ln := range held {
			ln.Close()
		}
		if len(held) == len(hosts) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no TCP port in [%d, %d) free on %q", lo, hi, hosts)
}

// ephemeralLow is the first port of Linux's ephemeral range (32768 where
// it cannot be read).
func ephemeralLow() int {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11000 {
				lo = v
			}
		}
	}
	return lo
}

// mustFreePort is freePort for a test.
func mustFreePort(t testing.TB, hosts ...string) int {
	t.Helper()
	port, err := freePort(hosts...)
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

// fleetConfig is the knobs of gatewayCaddyfile.
type fleetConfig struct {
	engines     []*vllmsim.Engine
	appExtra    string // lines inside llm { }
	engineExtra string // lines inside each engine { }
	noKV        bool   // do not subscribe to KV events
	admission   string // lines inside llm_admission { }; "-" omits the handler
	policy      string // lines inside lb_policy llm { }; "-" uses round_robin
	proxyExtra  string // lines inside reverse_proxy { }
}

// gatewayCaddyfile renders a Caddyfile for the test gateway.
func gatewayCaddyfile(fc fleetConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin %s\n\tskip_install_trust\n\thttp_port %d\n\thttps_port %d\n\tgrace_period 1ns\n\tllm {\n\t\tpoll_interval 50ms\n%s", adminAddr, httpPort, httpsPort, fc.appExtra)
	for _, e := range fc.engines {
		fmt.Fprintf(&b, "\t\tengine %s {\n%s", e.Addr(), fc.engineExtra)
		if !fc.noKV && e.KVEndpoint() != "" {
			fmt.Fprintf(&b, "\t\t\tkv_events %s\n", e.KVEndpoint())
			if e.ReplayEndpoint() != "" {
				fmt.Fprintf(&b, "\t\t\tkv_replay %s\n", e.ReplayEndpoint())
			}
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}\n}\n\nhttp://" + gatewayAddr + " {\n")
	if fc.admission != "-" {
		fmt.Fprintf(&b, "\tllm_admission {\n%s\t}\n", fc.admission)
	}
	b.WriteString("\treverse_proxy")
	for _, e := range fc.engines {
		b.WriteString(" " + e.Addr())
	}
	b.WriteString(" {\n")
	if fc.policy == "-" {
		b.WriteString("\t\tlb_policy round_robin\n")
	} else {
		fmt.Fprintf(&b, "\t\tlb_policy llm {\n%s\t\t}\n", fc.policy)
	}
	fmt.Fprintf(&b, "\t\tflush_interval -1\n%s\t}\n}\n", fc.proxyExtra)
	return b.String()
}

// newTester loads cfg into the shared in-process Caddy.
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
	return tester
}

// client is a plain HTTP client for the gateway, without caddytest's
// 5-second default.
var client = &http.Client{Timeout: 60 * time.Second}

func chatBody(stream bool, content string) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "sim-model",
		"stream":     stream,
		"max_tokens": 8,
		"messages":   []map[string]string{{"role": "user", "content": content}},
	})
	return string(b)
}

// post sends a chat completion through the gateway.
func post(ctx context.Context, body string, header map[string]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gatewayAddr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return client.Do(req)
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

// sseLines reads an SSE response line by line into ch until EOF.
func sseLines(res *http.Response, ch chan<- string) {
	defer close(ch)
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		ch <- sc.Text()
	}
}

// adminJSON GETs an admin route into v.
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

// metricValue scrapes the admin /metrics and returns the sum of the series
// of name whose labels include every given label (k="v" strings).
func metricValue(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	res, err := client.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatalf("scraping metrics: %v", err)
	}
	raw := readAll(t, res)
	var sum float64
	for _, line := range strings.Split(raw, "\n") {
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

// eventually polls cond every 10ms until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for w := newWait(t, d, what); !cond(); w.tick() {
	}
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

// engineReport fetches one engine's report from /llm/engines.
func getEngineReport(t testing.TB, dial string) engineReport {
	t.Helper()
	var all []engineReport
	adminJSON(t, http.MethodGet, "/llm/engines", "", &all)
	for _, r := range all {
		if r.Dial == dial {
			return r
		}
	}
	return engineReport{}
}
