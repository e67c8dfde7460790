package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
)

// simSetup is a fleet subscribed to n simulated engines that all hold the
// same prompt prefix (worst case for matching: every block of the prompt
// has every engine's bit), learned from their KV events.
type simSetup struct {
	f      *Fleet
	dials  []string
	req    *openai.Request
	tokens []uint64
	s      Settings
}

func startSimEngines(tb testing.TB, n, promptTokens int) []*vllmsim.Engine {
	tb.Helper()
	engines := make([]*vllmsim.Engine, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			engines[i], errs[i] = vllmsim.Start(context.Background(), vllmsim.Config{
				TimeScale:    10000,
				NumGPUBlocks: promptTokens/16 + 256,
				MaxModelLen:  promptTokens + 1024,
				KVEvents:     &vllmsim.KVEventsConfig{Endpoint: "tcp://*:0"},
			})
		}()
	}
	wg.Wait()
	tb.Cleanup(func() {
		for _, e := range engines {
			if e != nil {
				_ = e.Close()
			}
		}
	})
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	return engines
}

func newSimSetup(tb testing.TB, n, promptTokens int) *simSetup {
	tb.Helper()
	return newSimSetups(tb, n, promptTokens, "")[0]
}

// newSimSetups is newSimSetup for several fleets subscribed to the same
// engines, one per tokenizeURL: "" asks each engine's own /tokenize,
// another URL replaces every engine's. The first fleet must ask the
// engines: its ids are every fleet's tokens, and only the fleets that ask
// the engines are checked to route precisely here (another URL may only
// answer once the caller knows those ids).
func newSimSetups(tb testing.TB, n, promptTokens int, tokenizeURLs ...string) []*simSetup {
	tb.Helper()
	engines := startSimEngines(tb, n, promptTokens)
	dials := make([]string, n)
	for i, e := range engines {
		dials[i] = e.Addr()
	}
	var out []*simSetup
	for _, url := range tokenizeURLs {
		cfg := testConfig()
		cfg.PollInterval, cfg.TokenizeTimeout = time.Second, 10*time.Second
		for _, e := range engines {
			cfg.Engines = append(cfg.Engines, &EngineConfig{Dial: e.Addr(), KVEvents: e.KVEndpoint(), Tokenize: url})
		}
		f := New(zap.NewNop(), Options{})
		tb.Cleanup(f.Close)
		f.Start(f.NewGeneration(cfg, zap.NewNop()))
		out = append(out, &simSetup{f: f, dials: dials, s: f.PolicySettings("default")})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := simWords("bench", promptTokens)
	// Every fleet subscribes before the warm-up: an engine announces the
	// blocks it stores once, and a cache hit stores none.
	for i, e := range engines {
		if err := e.WaitKVSubscribers(ctx, len(out)); err != nil {
			tb.Fatal(err)
		}
		simPost(tb, ctx, e.URL()+"/v1/chat/completions", simChat(prefix, "warm"))
		for _, ss := range out {
			testwait.For(tb, time.Minute, dials[i]+" mirrored and gauged", func() bool {
				m := ss.f.index.Mirror(dials[i])
				return m != nil && m.Stats().Blocks >= promptTokens/16 && m.Connected() && ss.f.registry.Ensure(dials[i]).Load().Known
			})
		}
	}
	req, err := openai.ParseRequest([]byte(simChat(prefix, "and now the question")))
	if err != nil {
		tb.Fatal(err)
	}
	for i, ss := range out {
		ss.req, ss.tokens = req, out[0].tokens
		if tokenizeURLs[i] != "" {
			continue
		}
		d := ss.f.Route(ctx, Query{Request: req, Dials: dials, Settings: ss.s})
		if d.Tokenize.Err != nil || d.Index < 0 || d.Tier != routing.Precise || d.Share < 0.99 {
			tb.Fatalf("the setup does not route precisely: %+v (tokenize %v)", d.Decision, d.Tokenize.Err)
		}
		var tr TokenizeResult
		if ss.tokens, tr = ss.f.tokenize(ctx, req, ss.f.view(dials, ss.s)); tr.Err != nil || len(ss.tokens) < promptTokens {
			tb.Fatalf("tokenizing: %d tokens, %v", len(ss.tokens), tr.Err)
		}
	}
	return out
}

// tokenize is tokenizeKeyed without the keys, for tests that only want
// the ids.
func (f *Fleet) tokenize(ctx context.Context, req *openai.Request, v view) ([]uint64, TokenizeResult) {
	tokens, _, tr := f.tokenizeKeyed(ctx, req, v)
	return tokens, tr
}

// simWords is n distinct words: about n tokens for vllmsim's tokenizer.
func simWords(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, " %s%d", tag, i)
	}
	return b.String()
}

func simChat(system, user string) string {
	b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1, "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": user}}})
	return string(b)
}

func simPost(tb testing.TB, ctx context.Context, url, body string) {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		tb.Fatalf("%s: %d %.200s", url, res.StatusCode, raw)
	}
}

// TestRoutePrecise: with live events the engine holding the prompt's
// blocks wins on the precise tier; the reservation admission made counts
// against its own engine no more; an engine whose events stop is routed
// on the approximate tier.
func TestRoutePrecise(t *testing.T) {
	ss := newSimSetup(t, 3, 2000)
	ctx := context.Background()
	// Every engine holds the prefix: the tie goes to the least loaded one.
	busy := ss.f.registry.Ensure(ss.dials[0]).Reserve()
	defer busy.Done()
	d := ss.f.Route(ctx, Query{Request: ss.req, Dials: ss.dials, Settings: ss.s, Tokens: ss.tokens})
	if d.Index == 0 || d.Tier != routing.Precise {
		t.Fatalf("decision %+v: the busier engine won, or not on the precise tier", d.Decision)
	}
	q := Query{Request: ss.req, Dials: ss.dials[:2], Settings: ss.s, Tokens: ss.tokens, Explain: true}
	if d := ss.f.Route(ctx, q); d.Scored[0].Load <= d.Scored[1].Load {
		t.Fatalf("a reservation does not count as load: %+v", d.Scored)
	}
	q.Own = ss.dials[0] // the reservation is this request's own
	if d := ss.f.Route(ctx, q); d.Scored[0].Load != d.Scored[1].Load {
		t.Fatalf("the request's own reservation counts against its engine: %+v", d.Scored)
	}
	// The events of engine 1 stop: it falls to the approximate tier.
	feedless := slices.Clone(ss.dials)
	ss.f.index.RemoveEngine(ss.dials[1])
	d = ss.f.Route(ctx, Query{Request: ss.req, Dials: feedless, Settings: ss.s, Tokens: ss.tokens, Explain: true})
	if d.Scored[1].Tier != routing.Approximate || d.Scored[0].Tier != routing.Precise {
		t.Fatalf("tiers %v %v, want approximate for the engine without a mirror", d.Scored[1].Tier, d.Scored[0].Tier)
	}
}

// BenchmarkRouteDecision is the decision latency over a pre-filled KV
// index: "decide" excludes tokenizing (the token ids are known: load
// snapshot, index match, approximate-tree match, candidates, Pick);
// "route" is the whole Route with the tokenizer's cache hit.
func BenchmarkRouteDecision(b *testing.B) {
	for _, prompt := range []int{2000, 128000} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("prompt=%dk/engines=%d", prompt/1000, n), func(b *testing.B) {
				ss := newSimSetup(b, n, prompt)
				for _, variant := range []struct {
					name   string
					tokens []uint64
				}{{"decide", ss.tokens}, {"route", nil}} {
					b.Run(variant.name, func(b *testing.B) {
						b.ReportAllocs()
						q := Query{Request: ss.req, Dials: ss.dials, Settings: ss.s, Tokens: variant.tokens}
						ds := make([]time.Duration, 0, 1<<16)
						ctx := context.Background()
						for b.Loop() {
							t0 := time.Now()
							_ = ss.f.Route(ctx, q)
							ds = append(ds, time.Since(t0))
						}
						reportPercentiles(b, ds)
					})
				}
			})
		}
	}
}

// reportPercentiles adds p50 and p99 of the per-iteration times.
func reportPercentiles(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(ds[len(ds)*99/100].Nanoseconds()), "p99-ns")
}

// TestTokenizeAvoidsFailingEngine: an engine that has gone away keeps its
// last gauges until it turns stale, and right after a reload admission may
// still list it; the prompt is tokenized on an engine whose last poll
// succeeded, so routing stays precise (regression: the first engine of
// the list was asked, failed, and the request fell to the approximate tier).
func TestTokenizeAvoidsFailingEngine(t *testing.T) {
	engines := startSimEngines(t, 2, 64)
	cfg := testConfig()
	cfg.PollInterval, cfg.StaleAfter, cfg.TokenizeTimeout = 20*time.Millisecond, 1000, 10*time.Second
	dials := []string{engines[0].Addr(), engines[1].Addr()}
	for _, e := range engines {
		cfg.Engines = append(cfg.Engines, &EngineConfig{Dial: e.Addr()})
	}
	f := New(zap.NewNop(), Options{})
	t.Cleanup(f.Close)
	f.Start(f.NewGeneration(cfg, zap.NewNop()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	testwait.For(t, time.Minute, "both engines gauged", func() bool {
		return f.registry.Ensure(dials[0]).Load().Known && f.registry.Ensure(dials[1]).Load().Known
	})
	_ = engines[0].Close()
	testwait.For(t, time.Minute, "the closed engine's poll failing", func() bool {
		l := f.registry.Ensure(dials[0]).Load()
		return l.Known && l.Failures > 0
	})
	req, err := openai.ParseRequest([]byte(simChat(simWords("tok", 64), "a question")))
	if err != nil {
		t.Fatal(err)
	}
	tokens, tr := f.tokenize(ctx, req, f.view(dials, f.PolicySettings("default")))
	if tr.Err != nil || len(tokens) < 64 {
		t.Fatalf("tokenize: %d tokens, %v (asked the engine that is gone?)", len(tokens), tr.Err)
	}
}
