package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// BenchmarkPolicyGatewayLatency is what llm_admission + lb_policy llm add
// to a request compared with Caddy's round_robin on the same engines, with
// a direct request to an engine as the floor. The engines answer almost at
// once (TimeScale 10000, one output token), so the differences are the
// gateways' own. Each sub-benchmark reports the p50 and p99 of its
// requests; timing on a shared machine is no test, hence a benchmark. For
// figures less exposed to machine noise, run it several times and compare
// with benchstat:
//
//	go test -run '^$' -bench PolicyGatewayLatency -count 6 ./caddymodule
//
// Prompts share a 1,000-token system prompt: "unique" requests differ in
// their last message (a /tokenize call each, as for new conversations),
// "repeat" requests are identical (the tokenizer cache answers).
func BenchmarkPolicyGatewayLatency(b *testing.B) {
	engines := startEngines(b, 4, vllmsim.Config{TimeScale: 10000})
	prefix := "Latency probe." + words("lat", 1000)
	for _, target := range []struct {
		name string
		g    *gateway // nil: straight to an engine
	}{
		{"direct", nil},
		{"round_robin", &gateway{patient: true, engines: kvEngines(engines...), admission: "-", policy: "-"}},
		{"llm", &gateway{patient: true, engines: kvEngines(engines...)}},
	} {
		for _, kind := range []string{"unique", "repeat"} {
			b.Run(target.name+"/"+kind, func(b *testing.B) {
				url := ""
				switch {
				case target.g == nil:
					url = engines[0].URL() + "/v1/chat/completions"
				case target.name == "llm":
					target.g.load(b)
					waitKV(b, engines...)
				default:
					target.g.load(b)
				}
				benchGatewayLatency(b, url, prefix, kind == "unique")
			})
		}
	}
}

// benchGatewayLatency sends a request per iteration to url (the gateway
// when "") and reports the percentiles of their times. The first five,
// which open connections, are not counted.
func benchGatewayLatency(b *testing.B, url, prefix string, unique bool) {
	// Unique across runs too (-count): the gateway's tokenizer cache
	// outlives a config.
	run, seq := time.Now().UnixNano(), 0
	one := func() time.Duration {
		user := "the same question every time"
		if unique {
			seq++
			user = fmt.Sprintf("question number %d of run %d", seq, run)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		r := send(ctx, url, chat{system: prefix, user: user, maxTokens: 1}.body(), nil)
		d := time.Since(t0)
		if r.err != nil || r.status != http.StatusOK {
			b.Fatalf("%d %v %.200s", r.status, r.err, r.body)
		}
		return d
	}
	for range 5 {
		one()
	}
	var ds []time.Duration
	for b.Loop() {
		ds = append(ds, one())
	}
	reportPercentiles(b, ds)
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
