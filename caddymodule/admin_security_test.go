package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestSecurityAdminAPIOnlyOnAdminListener: the /llm/* routes live on
// Caddy's admin listener, never on the public one. On the gateway's public
// port the same paths are ordinary requests for the site's handlers (here
// proxied to the engine, which knows no such route); a drain attempted
// there changes nothing. The admin listener itself refuses foreign Host
// and Origin headers (Caddy's DNS-rebinding and CSRF defences), which
// matters for the mutating drain route.
func TestSecurityAdminAPIOnlyOnAdminListener(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{})[0]
	gateway{engines: kvEngines(e)}.load(t)
	t.Cleanup(func() { resetGateway(t) })

	// Control: the admin listener serves the routes.
	var engines []fleet.EngineReport
	if code := adminJSON(t, http.MethodGet, "/llm/engines", "", &engines); code != http.StatusOK || len(engines) != 1 {
		t.Fatalf("admin /llm/engines: %d, %d engines", code, len(engines))
	}

	public := "http://" + gatewayAddr
	drainPath := "/llm/engines/" + url.PathEscape(e.Addr()) + "/drain"
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodGet, "/llm/engines", ""},
		{http.MethodGet, "/llm/queue", ""},
		{http.MethodPost, "/llm/explain", chatBody(false, "hi")},
		{http.MethodPost, drainPath, ""},
		{http.MethodGet, "/metrics", ""},
		{http.MethodGet, "/config/", ""},
	} {
		req, _ := http.NewRequest(tc.method, public+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		r := do(nil, req, nil)
		if r.err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, r.err)
		}
		for _, marker := range []string{`"gauges_known"`, `"pools"`, `"candidates"`, `"drained"`, "llmgw_", `"apps"`} {
			if strings.Contains(r.body, marker) {
				t.Errorf("%s %s on the public listener answered like the admin API (%d, contains %s)", tc.method, tc.path, r.status, marker)
			}
		}
		t.Logf("public %s %s -> %d (the site's own handling)", tc.method, tc.path, r.status)
	}
	if r := getEngineReport(t, e.Addr()); r.Drained {
		t.Fatal("a drain sent to the public listener drained the engine")
	}

	// The admin listener refuses foreign hosts and origins, for reads and
	// for the drain.
	for _, tc := range []struct{ name, host, origin string }{
		{"foreign host", "evil.example:" + strings.Split(adminAddr, ":")[1], ""},
		{"foreign origin", "", "http://evil.example"},
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+adminAddr+drainPath, nil)
		if tc.host != "" {
			req.Host = tc.host
		}
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		if r := do(nil, req, nil); r.err != nil || r.status != http.StatusForbidden {
			t.Errorf("%s: drain answered %d (%v), want 403", tc.name, r.status, r.err)
		}
	}
	if r := getEngineReport(t, e.Addr()); r.Drained {
		t.Fatal("a drain with a foreign Host or Origin drained the engine")
	}
}

// relHeaderRecorder sits in front of an engine's /metrics and /tokenize:
// it records the Authorization header of every call and answers 500
// (fail) or forwards to the engine.
type relHeaderRecorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	auth map[string][]string // path -> Authorization values seen
	fail bool
}

func newRelHeaderRecorder(t *testing.T, e *vllmsim.Engine, fail bool) *relHeaderRecorder {
	t.Helper()
	target, _ := url.Parse(e.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	r := &relHeaderRecorder{auth: map[string][]string{}, fail: fail}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auth[req.URL.Path] = append(r.auth[req.URL.Path], req.Header.Get("Authorization"))
		r.mu.Unlock()
		if r.fail {
			http.Error(w, "injected failure", http.StatusInternalServerError)
			return
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *relHeaderRecorder) seen(path string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auth[path]...)
}

// TestSecurityEngineKeysAndLogs: an engine API key written as a config
// placeholder ({env.…}) reaches the engine's /metrics and /tokenize as a
// bearer token, and neither it nor a client's Authorization header
// appears in Caddy's logs (DEBUG level, access log on, while scrapes and
// tokenize calls fail and get logged), in the admin API, in the metrics,
// or in the config Caddy keeps (which holds the placeholder).
func TestSecurityEngineKeysAndLogs(t *testing.T) {
	const engineKey = "engine-key-7f3a9c"
	const clientKey = "secret-xyz-41b7"
	t.Setenv("LLMGW_TEST_VLLM_KEY", engineKey)
	e := startEngines(t, 1, vllmsim.Config{})[0]
	dir := t.TempDir()
	logFile, accessFile := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log")
	t.Cleanup(func() { resetGateway(t) }) // before the log files' directory is removed
	run := time.Now().UnixNano()          // fresh prompts: the tokenize cache outlives a test

	// The fleet may have been created under a config that logs elsewhere
	// (here: stderr); it must log where the running config says.
	gateway{engines: kvEngines(e)}.load(t)

	for _, phase := range []struct {
		name string
		fail bool
	}{{"engines answer", false}, {"engines fail", true}} {
		rec := newRelHeaderRecorder(t, e, phase.fail)
		gateway{
			global: "\tlog {\n\t\toutput file " + logFile + "\n\t\tlevel DEBUG\n\t}\n",
			engines: []gatewayEngine{{dial: e.Addr(), extra: "\t\t\tmetrics " + rec.srv.URL + "/metrics\n" +
				"\t\t\ttokenize " + rec.srv.URL + "/tokenize\n\t\t\tapi_key {env.LLMGW_TEST_VLLM_KEY}\n"}},
			siteExtra: "\tlog {\n\t\toutput file " + accessFile + "\n\t}\n",
			policy:    "\t\t\tdebug_headers\n",
		}.load(t)

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for i := range 3 {
			s := send(ctx, "", chatBody(true, fmt.Sprintf("%s %d: tell me a secret %s", phase.name, run, longText(20+i))), map[string]string{"Authorization": "Bearer " + clientKey})
			if !s.complete() {
				t.Fatalf("%s: request %d: %+v", phase.name, i, s)
			}
		}
		cancel()
		testwait.For(t, 10*time.Second, "scrapes and tokenize calls seen", func() bool {
			return len(rec.seen("/metrics")) >= 3 && len(rec.seen("/tokenize")) >= 1
		})
		t.Logf("%s: %d scrapes, %d tokenize calls", phase.name, len(rec.seen("/metrics")), len(rec.seen("/tokenize")))
		for _, path := range []string{"/metrics", "/tokenize"} {
			for _, v := range rec.seen(path) {
				if v != "Bearer "+engineKey {
					t.Fatalf("%s: %s got Authorization %q, want the engine key from the placeholder", phase.name, path, v)
				}
			}
		}
		if phase.fail {
			testwait.For(t, 10*time.Second, "scrape failures reported", func() bool {
				r := getEngineReport(t, e.Addr())
				return r.Failures >= 3 && r.LastError != ""
			})
			if v := metricValue(t, "llmgw_tokenize_failures_total"); v < 1 {
				t.Errorf("tokenize failures not counted (%v)", v)
			}
		}
	}

	// Everything the gateway exposes or writes, secrets nowhere.
	get := func(u string) string {
		res, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	config := get("http://" + adminAddr + "/config/")
	if !strings.Contains(config, "{env.LLMGW_TEST_VLLM_KEY}") {
		t.Errorf("the running config does not hold the placeholder")
	}
	var logs []byte
	testwait.For(t, 10*time.Second, "the poller's failures logged", func() bool {
		logs, _ = os.ReadFile(logFile)
		return strings.Contains(string(logs), "llm.fleet.poller") && strings.Contains(string(logs), "500")
	})
	access, err := os.ReadFile(accessFile)
	if err != nil {
		t.Fatal(err)
	}
	// Controls: the logs did record the failures and the requests (with
	// their Authorization header redacted).
	if !strings.Contains(string(access), "REDACTED") || !strings.Contains(string(access), "/v1/chat/completions") {
		t.Errorf("the access log lacks the requests or their redacted Authorization")
	}
	for name, text := range map[string]string{
		"log":           string(logs),
		"access log":    string(access),
		"/config/":      config,
		"/llm/engines":  get("http://" + adminAddr + "/llm/engines"),
		"/llm/queue":    get("http://" + adminAddr + "/llm/queue"),
		"admin metrics": get("http://" + adminAddr + "/metrics"),
	} {
		for _, secret := range []string{engineKey, clientKey} {
			if strings.Contains(text, secret) {
				i := strings.Index(text, secret)
				t.Errorf("%s contains a secret: …%s…", name, text[max(0, i-200):min(len(text), i+50)])
			}
		}
	}
	t.Logf("log %d bytes, access log %d bytes: no secret", len(logs), len(access))
}

// TestSecurityKVEndpointsOnlyConfigured: the gateway subscribes to KV
// events only where the config says: an engine without kv_events (and no
// kv_events_port) gets no subscription, even though it publishes; with
// kv_events_port the endpoint is exactly tcp://<host of the dial
// address>:<port>, for configured and discovered engines alike. Nothing
// in a request chooses an endpoint.
func TestSecurityKVEndpointsOnlyConfigured(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{})[0]
	_, port, _ := strings.Cut(strings.TrimPrefix(e.KVEndpoint(), "tcp://"), ":")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	gateway{engines: []gatewayEngine{{dial: e.Addr()}}}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	if s := send(ctx, "", chat{user: "no events configured", maxTokens: 8, stream: true}.body(), nil); !s.complete() {
		t.Fatalf("request: %+v", s)
	}
	if r := getEngineReport(t, e.Addr()); r.Dial == "" || r.KV != nil {
		t.Fatalf("engine without kv_events: report %+v, want no subscription", r.KV)
	}
	if err := e.WaitKVSubscribers(ctx, 0); err != nil {
		t.Fatal(err)
	}

	for _, configured := range []bool{true, false} {
		g := gateway{appExtra: "\t\tkv_events_port " + port + "\n", upstreams: []string{e.Addr()}}
		if configured {
			g.engines = []gatewayEngine{{dial: e.Addr()}}
		} else {
			resetGateway(t) // forget it: the engine is discovered from reverse_proxy
		}
		g.load(t)
		if s := send(ctx, "", chat{user: "derived endpoint", maxTokens: 8, stream: true}.body(), nil); !s.complete() {
			t.Fatalf("request: %+v", s)
		}
		var r fleet.EngineReport
		testwait.For(t, 10*time.Second, "derived subscription connected", func() bool {
			r = getEngineReport(t, e.Addr())
			return r.KV != nil && r.KV.Connected
		})
		if r.KV.Endpoint != e.KVEndpoint() || r.Static != configured {
			t.Fatalf("configured=%v: subscribed to %q (engine configured=%v), want %q", configured, r.KV.Endpoint, r.Static, e.KVEndpoint())
		}
	}
}
