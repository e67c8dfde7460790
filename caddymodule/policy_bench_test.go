package caddymodule

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
	"github.com/llmgw/caddy-llmgw/routing"
)

// benchSetup is a fleet subscribed to n simulated engines that all hold the
// same prompt prefix (worst case for matching: every block of the prompt
// has every engine's bit), learned from their KV events.
type benchSetup struct {
	f      *fleet
	dials  []string
	req    *admission.Request
	tokens []uint64
	s      routeSettings
}

func newBenchSetup(b *testing.B, n, promptTokens int) *benchSetup {
	b.Helper()
	blocks := promptTokens/16 + 256
	engines := make([]*vllmsim.Engine, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := vllmsim.Start(context.Background(), vllmsim.Config{
				TimeScale:    10000,
				NumGPUBlocks: blocks,
				MaxModelLen:  promptTokens + 1024,
				KVEvents:     &vllmsim.KVEventsConfig{Endpoint: "tcp://*:0"},
			})
			if err != nil {
				errs <- err
				return
			}
			engines[i] = e
		}()
	}
	wg.Wait()
	b.Cleanup(func() {
		for _, e := range engines {
			if e != nil {
				_ = e.Close()
			}
		}
	})
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	f := newFleet(zap.NewNop())
	b.Cleanup(func() { _ = f.Destruct() })
	app := &App{
		PollInterval: caddy.Duration(time.Second), PollTimeout: caddy.Duration(time.Second),
		StaleAfter: 3, IdleTTL: caddy.Duration(time.Hour),
		TokenizeTimeout: caddy.Duration(10 * time.Second), TokenizeConcurrency: 8, TokenizeCacheSize: 64,
	}
	dials := make([]string, n)
	for i, e := range engines {
		dials[i] = e.Addr()
		app.Engines = append(app.Engines, &EngineConfig{Dial: e.Addr(), KVEvents: e.KVEndpoint()})
	}
	f.apply(app)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, e := range engines {
		if err := e.WaitKVSubscribers(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
	prefix := words("bench", promptTokens)
	warm := chat{system: prefix, user: "warm", maxTokens: 1}.body()
	for i, e := range engines {
		r := send(ctx, e.URL()+"/v1/chat/completions", warm, nil)
		if r.err != nil || r.status != 200 {
			b.Fatalf("warming %s: %d %v %.200s", e.Addr(), r.status, r.err, r.body)
		}
		w := newWait(b, time.Minute, e.Addr()+"'s mirror filled")
		for f.index.Mirror(dials[i]) == nil || f.index.Mirror(dials[i]).Stats().Blocks < promptTokens/16 || !f.preciseFresh(dials[i]) {
			w.tick()
		}
	}
	for _, d := range dials {
		w := newWait(b, time.Minute, d+"'s gauges known")
		for !f.registry.Ensure(d).Load().Known {
			w.tick()
		}
	}
	req, err := admission.ParseRequest([]byte(chat{system: prefix, user: "and now the question", maxTokens: 16}.body()))
	if err != nil {
		b.Fatal(err)
	}
	bs := &benchSetup{f: f, dials: dials, req: req, s: f.policySettings("default")}
	v := f.view(dials, bs.s)
	if bs.tokens, err = f.tokenize(ctx, req, v.engines, v.loads); err != nil {
		b.Fatal(err)
	}
	d := f.decide(req, dials, bs.s, false, "", v, bs.tokens).decision
	if d.Index < 0 || d.Tier != routing.Precise || d.Share < 0.99 {
		b.Fatalf("the setup does not route precisely: %+v", d)
	}
	return bs
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

// BenchmarkRouteDecision is the policy's decision latency over a pre-filled
// KV index: "decide" excludes tokenizing (the token ids are known: load
// snapshot, index match, approximate-tree match, candidates, Pick);
// "route" is the whole fleet.route with the tokenizer's cache hit.
func BenchmarkRouteDecision(b *testing.B) {
	for _, prompt := range []int{2000, 128000} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("prompt=%dk/engines=%d", prompt/1000, n), func(b *testing.B) {
				bs := newBenchSetup(b, n, prompt)
				b.Run("decide", func(b *testing.B) {
					b.ReportAllocs()
					ds := make([]time.Duration, 0, 1<<16)
					for b.Loop() {
						t0 := time.Now()
						v := bs.f.view(bs.dials, bs.s)
						_ = bs.f.decide(bs.req, bs.dials, bs.s, false, "", v, bs.tokens)
						ds = append(ds, time.Since(t0))
					}
					reportPercentiles(b, ds)
				})
				b.Run("route", func(b *testing.B) {
					b.ReportAllocs()
					ds := make([]time.Duration, 0, 1<<16)
					ctx := context.Background()
					for b.Loop() {
						t0 := time.Now()
						_ = bs.f.route(ctx, bs.req, bs.dials, bs.s, false)
						ds = append(ds, time.Since(t0))
					}
					reportPercentiles(b, ds)
				})
			})
		}
	}
}
