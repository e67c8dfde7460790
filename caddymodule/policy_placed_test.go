package caddymodule

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestSelectFollowsPlacement: Select sends a request llm_admission placed
// to the engine the placement counted it on, and when that engine is no
// longer a candidate — it failed this request, or was drained since —
// routes it among the rest and moves the reservation there, so local
// accounting follows the request.
func TestSelectFollowsPlacement(t *testing.T) {
	hot, cold, third := "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	dials := []string{hot, cold, third}
	for _, tc := range []struct {
		name  string
		apart func(f *fleet.Fleet, sel func() string) // what happens to hot after admission
	}{
		{"placed engine used", nil},
		{"placed engine failed", func(f *fleet.Fleet, sel func() string) {
			if got := sel(); got != hot {
				t.Fatalf("first attempt went to %s, want the placed %s", got, hot)
			}
		}},
		{"placed engine drained", func(f *fleet.Fleet, sel func() string) { f.SetDrained(hot, true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fleet.New(zap.NewNop(), fleet.Options{ManualScrape: true})
			defer f.Close()
			var cfg fleet.Config
			for _, d := range dials {
				cfg.Engines = append(cfg.Engines, &fleet.EngineConfig{Dial: d, MaxInflight: 4})
			}
			cfg.PollInterval, cfg.IdleTTL = time.Hour, time.Hour
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			f.Start(f.NewGeneration(cfg, zap.NewNop()))
			for _, d := range dials {
				f.Registry().Ensure(d).StartScrape()(upstreams.Gauges{})
			}
			p := testPolicy(f, &Policy{})
			s := fleet.DefaultSettings()
			s.Tokenize = false
			prompt := strings.Repeat("a shared system prompt ", 200)
			body := `{"model":"m","messages":[{"role":"user","content":"` + prompt + ` and a question"}]}`
			req, err := openai.ParseRequest([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			hotReq, _ := openai.ParseRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]}`))
			f.Unrouted(hotReq, nil).Commit(hot) // the prefix lives on hot
			place := f.Place(context.Background(), fleet.Query{Request: req, Dials: dials, Settings: s})
			res, _, ok := place.Reserve(dials, fleet.Limits{KV: 0.9}, admission.PassAny)
			if !ok || place.Engine != hot || res.Engine().Dial() != hot {
				t.Fatalf("admission placed on %q (reason %q), want %s", place.Engine, place.Reason, hot)
			}
			defer res.Done()
			r, _, cancel := testRequest(t, body)
			defer cancel()
			caddyhttp.SetVar(r.Context(), varRequest, req)
			caddyhttp.SetVar(r.Context(), varReservation, res)
			caddyhttp.SetVar(r.Context(), varPlacement, place)
			pool := testPool(dials...)
			sel := func() string {
				u := p.Select(pool, r, nil)
				if u == nil {
					t.Fatal("Select picked nothing")
				}
				return u.Dial
			}
			want := hot
			if tc.apart != nil {
				tc.apart(f, sel)
				want = ""
			}
			got := sel()
			switch {
			case want != "" && got != want:
				t.Fatalf("Select picked %s, want the placed %s", got, want)
			case want == "" && got == hot:
				t.Fatalf("Select picked the placed %s although it is no longer a candidate", hot)
			}
			if res.Engine().Dial() != got {
				t.Fatalf("the reservation counts on %s, the request went to %s", res.Engine().Dial(), got)
			}
			if n := f.Registry().Ensure(hot).Load().Inflight; got != hot && n != 0 {
				t.Fatalf("%s still counts %d in flight after the request moved to %s", hot, n, got)
			}
		})
	}
}
