package caddymodule

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Unit tests of Policy.Select without Caddy: a fleet of its own, upstreams
// built as reverse_proxy builds them, requests prepared as Caddy's server
// prepares them. The dials are closed loopback ports, so gauges stay
// unknown and /tokenize fails (the approximate tier).

// polLeakCheck returns the check, to defer, that the test left no goroutine
// behind. The shared Caddy of the integration tests keeps polling engines of
// earlier tests meanwhile: HTTP client goroutines (dials, connections,
// deadline timers) are theirs, never this test's own.
func polLeakCheck(t *testing.T) func() {
	opts := []goleak.Option{
		goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("net/http.(*Transport).dialConnFor"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("context.WithDeadlineCause.func2"),
	}
	return func() { goleak.VerifyNone(t, opts...) }
}

// deadDials are loopback addresses nothing listens on.
var deadDials = []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}

// testFleet is a fleet following a config with the given engines, as
// App.Start would start it.
func testFleet(engines ...*fleet.EngineConfig) *fleet.Fleet {
	return startedFleet(fleet.Config{
		PollInterval:        time.Second,
		PollTimeout:         time.Second,
		StaleAfter:          3,
		IdleTTL:             time.Minute,
		TokenizeTimeout:     time.Second,
		TokenizeConcurrency: 8,
		TokenizeCacheSize:   64,
		Engines:             engines,
	})
}

// startedFleet is a new fleet running one generation of cfg.
func startedFleet(cfg fleet.Config) *fleet.Fleet {
	f := fleet.New(zap.NewNop(), fleet.Options{})
	f.Start(f.NewGeneration(cfg, zap.NewNop()))
	return f
}

func testPolicy(f *fleet.Fleet, p *Policy) *Policy {
	p.setup(zap.NewNop(), f)
	return p
}

func testPool(dials ...string) reverseproxy.UpstreamPool {
	var pool reverseproxy.UpstreamPool
	for _, d := range dials {
		pool = append(pool, &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: d})
	}
	return pool
}

// testRequest is a POST prepared like Caddy's server does (vars, replacer),
// with a context the test ends.
func testRequest(t *testing.T, body string) (*http.Request, *caddy.Replacer, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	repl := caddy.NewReplacer()
	return caddyhttp.PrepareRequest(r, repl, nil, &caddyhttp.Server{}), repl, cancel
}

func readBody(t *testing.T, r *http.Request) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPolicySelectBody: without llm_admission the policy parses the body
// itself, never writes to a nil ResponseWriter, and gives the upstream the
// whole body: parsed, too large, or not JSON; and again on a retry.
func TestPolicySelectBody(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Close()
	big := chatBody(false, strings.Repeat("long ", 100))
	cases := []struct {
		name, body string
		maxBody    int64
		parsed     bool
	}{
		{"chat", chatBody(false, "hello there"), 0, true},
		{"over max_body", big, 64, false},
		{"not json", "model=x&prompt=y", 0, false},
		{"empty", "", 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testPolicy(f, &Policy{MaxBody: c.maxBody, DebugHeaders: true})
			r, _, cancel := testRequest(t, c.body)
			defer cancel()
			u := p.Select(testPool(deadDials...), r, nil)
			if u == nil {
				t.Fatal("no upstream picked")
			}
			req, _ := caddyhttp.GetVar(r.Context(), varRequest).(*openai.Request)
			if (req != nil) != c.parsed {
				t.Fatalf("parsed %v, want %v", req != nil, c.parsed)
			}
			if c.parsed && req.Model != "sim-model" {
				t.Errorf("model %q", req.Model)
			}
			if got := readBody(t, r); got != c.body {
				t.Fatalf("upstream would get %d bytes %.40q, want %d", len(got), got, len(c.body))
			}
			// A retry (the first attempt consumed the body) sends it again
			// when the policy holds it.
			u2 := p.Select(testPool(deadDials...), r, nil)
			if u2 == nil || u2.Dial == u.Dial {
				t.Fatalf("retry picked %v after %s", u2, u.Dial)
			}
			if got := readBody(t, r); c.parsed && got != c.body {
				t.Errorf("retry body %d bytes, want %d", len(got), len(c.body))
			}
		})
	}
}

// TestPolicySelectRetriesAndBreaker: a second Select for one request means
// the first pick failed: it is never picked again for the request, and the
// failure counts against its breaker. With every upstream tried, nil.
func TestPolicySelectRetriesAndBreaker(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Close()
	p := testPolicy(f, &Policy{BreakerFailures: 1, BreakerCooldown: caddy.Duration(time.Hour)})
	r, _, cancel := testRequest(t, chatBody(false, "retry me"))
	defer cancel()
	pool := testPool(deadDials...)
	seen := map[string]bool{}
	for i := range len(pool) {
		u := p.Select(pool, r, nil)
		if u == nil {
			t.Fatalf("attempt %d: no upstream", i)
		}
		if seen[u.Dial] {
			t.Fatalf("attempt %d re-picked %s", i, u.Dial)
		}
		seen[u.Dial] = true
	}
	if u := p.Select(pool, r, nil); u != nil {
		t.Fatalf("every upstream failed, yet %s was picked", u.Dial)
	}
	for d := range seen {
		if st := f.Breaker().State(d, time.Now()); st != routing.StateOpen {
			t.Errorf("breaker of %s is %s after its failure, want open", d, st)
		}
	}

	// A new request: every breaker is open, yet the upstreams are
	// available, so the policy still picks one (the last resort).
	r2, _, cancel2 := testRequest(t, chatBody(false, "next"))
	defer cancel2()
	if u := p.Select(pool, r2, nil); u == nil {
		t.Error("nil while upstreams are available (breakers open)")
	}
}

// TestPolicySelectSecondHandler: another reverse_proxy handler serving the
// same request (its own clone, the same vars) starts a fresh series of
// attempts: the first handler's pick is neither a failure nor excluded.
func TestPolicySelectSecondHandler(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Close()
	p := testPolicy(f, &Policy{BreakerFailures: 1, BreakerCooldown: caddy.Duration(time.Hour)})
	pool := testPool(deadDials[0])
	r, _, cancel := testRequest(t, chatBody(false, "two proxies"))
	defer cancel()
	if u := p.Select(pool, r, nil); u == nil {
		t.Fatal("first handler: no pick")
	}
	r2 := r.Clone(r.Context())
	if u := p.Select(pool, r2, nil); u == nil {
		t.Fatal("second handler: its first attempt found the upstream excluded")
	}
	if st := f.Breaker().State(deadDials[0], time.Now()); st != routing.StateClosed {
		t.Fatalf("the first handler's pick counted as a failure: %s", st)
	}
	if u := p.Select(pool, r2, nil); u != nil {
		t.Fatalf("the second handler's retry re-picked %s", u.Dial)
	}
	if st := f.Breaker().State(deadDials[0], time.Now()); st != routing.StateOpen {
		t.Fatalf("the second handler's retry did not count a failure: %s", st)
	}
}

// TestPolicySelectReportsOutcome: without llm_admission, the policy feeds
// the breaker with the final status when the request ends; with it (a
// reservation in the vars), the handler does and the policy stays silent.
func TestPolicySelectReportsOutcome(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Close()
	p := testPolicy(f, &Policy{BreakerFailures: 1, BreakerCooldown: caddy.Duration(time.Hour)})
	for _, admitted := range []bool{false, true} {
		r, repl, cancel := testRequest(t, chatBody(false, "status"))
		if admitted {
			caddyhttp.SetVar(r.Context(), varReservation, f.Registry().Ensure(deadDials[0]).Reserve())
		}
		u := p.Select(testPool(deadDials...), r, nil)
		repl.Set(statusPlaceholder, http.StatusInternalServerError)
		cancel()
		if admitted {
			// Ending the request (cancel) starts a report registered with
			// context.AfterFunc before cancel returns: once no such
			// goroutine is left, any report has run.
			testwait.For(t, 5*time.Second, "the end-of-request report, if any, to have run", func() bool {
				return countGoroutines("created by context.(*afterFuncCtx).cancel", "caddymodule.(*Policy)") == 0
			})
			if st := f.Breaker().State(u.Dial, time.Now()); st != routing.StateClosed {
				t.Errorf("with llm_admission the policy reported too: breaker %s", st)
			}
			continue
		}
		testwait.For(t, 5*time.Second, "the 500 to open the breaker", func() bool {
			return f.Breaker().State(u.Dial, time.Now()) == routing.StateOpen
		})
		f.SetBreaker(routing.BreakerConfig{Failures: 2, Cooldown: time.Hour}) // fresh breakers
	}
}

// TestPolicySelectDrainAndSaturation: drained replicas get no new requests
// even as a last resort; a fleet whose every replica is saturated still
// gets a pick (least_conn), never nil while an upstream is available.
func TestPolicySelectDrainAndSaturation(t *testing.T) {
	defer polLeakCheck(t)()
	engines := make([]*fleet.EngineConfig, len(deadDials))
	for i, d := range deadDials {
		engines[i] = &fleet.EngineConfig{Dial: d, MaxInflight: 1}
	}
	f := testFleet(engines...)
	defer f.Close()
	p := testPolicy(f, &Policy{})
	pool := testPool(deadDials...)

	f.SetDrained(deadDials[0], true)
	f.SetDrained(deadDials[1], true)
	for i := range 20 {
		r, _, cancel := testRequest(t, chatBody(false, "drain "+strings.Repeat("x", i)))
		u := p.Select(pool, r, nil)
		cancel()
		if u == nil || u.Dial != deadDials[2] {
			t.Fatalf("request %d went to %v, want the only undrained %s", i, u, deadDials[2])
		}
	}
	f.SetDrained(deadDials[2], true)
	r, _, cancel := testRequest(t, chatBody(false, "all drained"))
	if u := p.Select(pool, r, nil); u != nil {
		t.Errorf("every replica drained, yet %s was picked", u.Dial)
	}
	cancel()
	for _, d := range deadDials {
		f.SetDrained(d, false)
	}

	// Saturate every replica (max_inflight 1, one request each).
	var held []*upstreams.Reservation
	for _, d := range deadDials {
		held = append(held, f.Registry().Ensure(d).Reserve())
	}
	defer func() {
		for _, h := range held {
			h.Done()
		}
	}()
	req, err := openai.ParseRequest([]byte(chatBody(false, "saturated")))
	if err != nil {
		t.Fatal(err)
	}
	if d := f.Route(context.Background(), fleet.Query{Request: req, Dials: deadDials, Settings: p.settings()}); d.Index != -1 {
		t.Fatalf("routing picked %d in a saturated fleet: the fallback is not exercised", d.Index)
	}
	r, _, cancel = testRequest(t, chatBody(false, "saturated"))
	defer cancel()
	w := httptest.NewRecorder()
	p.DebugHeaders = true
	u := p.Select(pool, r, w)
	if u == nil {
		t.Fatal("nil while every replica is available (saturated)")
	}
	if got := w.Header().Get("X-LLM-Upstream"); got != u.Dial || w.Header().Get("X-LLM-Tier") != routing.LoadOnly.String() {
		t.Errorf("debug headers %v for %s", w.Header(), u.Dial)
	}
}

// TestPolicySelectCacheKey: the cache-key header pins a key to one replica
// among the candidates; a drained replica's keys move, the others' stay.
func TestPolicySelectCacheKey(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Close()
	p := testPolicy(f, &Policy{CacheKeyHeader: "X-Session-ID"})
	pool := testPool(deadDials...)
	pick := func(key string) string {
		r, _, cancel := testRequest(t, chatBody(false, "k"))
		defer cancel()
		r.Header.Set("X-Session-ID", key)
		u := p.Select(pool, r, nil)
		if u == nil {
			t.Fatal("no pick")
		}
		return u.Dial
	}
	home := map[string]string{}
	for i := range 60 {
		k := "session-" + string(rune('a'+i%26)) + strings.Repeat("z", i/26)
		home[k] = pick(k)
		if again := pick(k); again != home[k] {
			t.Fatalf("key %s moved from %s to %s", k, home[k], again)
		}
	}
	f.SetDrained(deadDials[1], true)
	moved := 0
	for k, d := range home {
		got := pick(k)
		switch {
		case d == deadDials[1] && got == d:
			t.Errorf("key %s stayed on the drained replica", k)
		case d == deadDials[1]:
			moved++
		case got != d:
			t.Errorf("key %s moved from %s to %s though its replica stayed", k, d, got)
		}
	}
	if moved == 0 {
		t.Error("no key lived on the drained replica: the test proves nothing")
	}
}

// TestPolicySelectPredictedHeader: with debug_headers a routed pick names
// its predicted time to first token, the figure /llm/explain shows for the
// chosen candidate, so a client can pair it with the TTFT it observes.
func TestPolicySelectPredictedHeader(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Close()
	body := chatBody(false, "how long until my first token?")
	req, err := openai.ParseRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	p := testPolicy(f, &Policy{DebugHeaders: true})
	d := f.Route(context.Background(), fleet.Query{Request: req, Dials: deadDials, Settings: p.settings()})
	if d.Index < 0 || d.Predicted <= 0 {
		t.Fatalf("routing made no prediction (index %d, predicted %g)", d.Index, d.Predicted)
	}
	r, _, cancel := testRequest(t, body)
	defer cancel()
	w := httptest.NewRecorder()
	if u := p.Select(testPool(deadDials...), r, w); u == nil {
		t.Fatal("no upstream picked")
	}
	got, err := strconv.ParseFloat(w.Header().Get("X-LLM-Predicted-TTFT"), 64)
	if err != nil {
		t.Fatalf("X-LLM-Predicted-TTFT %q: %v", w.Header().Get("X-LLM-Predicted-TTFT"), err)
	}
	if math.Abs(got-d.Predicted) > 1e-3 {
		t.Errorf("X-LLM-Predicted-TTFT %g, the same idle fleet predicts %g", got, d.Predicted)
	}
}
