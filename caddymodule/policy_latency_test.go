package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
)

// TestPolicyGatewayLatency measures what llm_admission + lb_policy llm add
// to a request compared with Caddy's round_robin on the same engines in the
// same run: the two configs alternate (three rounds each) so machine noise
// hits both alike, and a direct request to an engine is the floor. The
// engines answer almost at once (TimeScale 10000, one output token), so the
// differences are the gateways' own. Figures are logged, not asserted
// (timing on a shared machine is no test); every request must succeed.
//
// Prompts share a 1,000-token system prompt: "unique" requests differ in
// their last message (a /tokenize call each, as for new conversations),
// "repeat" requests are identical (the tokenizer cache answers).
func TestPolicyGatewayLatency(t *testing.T) {
	engines := startEngines(t, 4, vllmsim.Config{TimeScale: 10000})
	configs := []struct {
		name string
		g    policyGateway
	}{
		{"round_robin", policyGateway{engines: engines, admission: "-", policy: "-"}},
		{"llm", policyGateway{engines: engines}},
	}
	prefix := "Latency probe." + polWords("lat", 1000)
	const perRound, rounds = 60, 3
	type key struct{ config, kind string }
	got := map[key][]time.Duration{}
	seq := 0
	measure := func(k key, url string) {
		t.Helper()
		for i := range perRound + 5 {
			user := "the same question every time"
			if k.kind == "unique" {
				seq++
				user = fmt.Sprintf("question number %d", seq)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			t0 := time.Now()
			r := polSend(ctx, url, polChat(prefix, user, 1, false), nil)
			d := time.Since(t0)
			cancel()
			if r.err != nil || r.status != http.StatusOK {
				t.Fatalf("%v: %d %v %.200s", k, r.status, r.err, r.body)
			}
			if i >= 5 { // the first ones open connections
				got[k] = append(got[k], d)
			}
		}
	}
	for round := range rounds {
		for _, c := range configs {
			c.g.load(t)
			if c.name == "llm" {
				polWaitKV(t, engines...)
			}
			for _, kind := range []string{"unique", "repeat"} {
				measure(key{c.name, kind}, "")
			}
		}
		for _, kind := range []string{"unique", "repeat"} {
			measure(key{"direct", kind}, engines[round%len(engines)].URL()+"/v1/chat/completions")
		}
	}
	pct := func(ds []time.Duration, p int) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)*p/100]
	}
	for _, kind := range []string{"unique", "repeat"} {
		d50, d99 := pct(got[key{"direct", kind}], 50), pct(got[key{"direct", kind}], 99)
		r50, r99 := pct(got[key{"round_robin", kind}], 50), pct(got[key{"round_robin", kind}], 99)
		l50, l99 := pct(got[key{"llm", kind}], 50), pct(got[key{"llm", kind}], 99)
		t.Logf("%s prompts (%d requests each): direct p50 %v p99 %v | round_robin p50 %v p99 %v | llm p50 %v p99 %v | llm over round_robin: p50 %+v p99 %+v",
			kind, perRound*rounds, d50, d99, r50, r99, l50, l99, l50-r50, l99-r99)
	}
}
