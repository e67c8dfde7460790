package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
)

// TestPolicyMatchesFleetSim pins the fleet simulation to the gateway: for
// every llm decision of a short simulated run under overload, Select —
// given the same fleet, the prompt as token ids, and the request's
// admission reservation and placement — picks the engine the simulation
// picked, on the same tier: for a placed request the engine admission
// counted it on. Where Route had no pick, both fall back to least_conn, whose
// counters are Caddy's (Select's) or modelled (the simulation's): then the
// tier must be load_only on both sides.
func TestPolicyMatchesFleetSim(t *testing.T) {
	var p *Policy
	checked, fallbacks, placed := 0, 0, 0
	params := fleetsim.Params{
		Engines: 8, KVBlocks: 384,
		Model:  fleetsim.Model{MaxNumSeqs: 16, BlockSize: 16, PrefillTokensPerSec: 10000, DecodeStepSeconds: 0.02, MaxBatchedTokens: 8192},
		Groups: 40, SystemTokens: 512, QuestionTokens: 64, OutputTokens: 32,
		// 140/s: since routing weighs tokens (issue 39) the fleet keeps
		// up with 110/s without a refusal, and the run must overload.
		Requests: 1500, Rate: 140, Policy: fleetsim.PolicyLLM, MaxInflight: 16,
		KVLimit: 0.9, PollInterval: 0.25, MaxPark: 60, QueueSize: 1024, Seed: 7,
		Decided: func(d fleetsim.Decided) error {
			if p == nil {
				p = testPolicy(d.Fleet, &Policy{})
			}
			body, err := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 32, "prompt": d.Query.Tokens})
			if err != nil {
				return err
			}
			req, err := openai.ParseRequest(body)
			if err != nil {
				return err
			}
			r, _, cancel := testRequest(t, string(body))
			defer cancel()
			caddyhttp.SetVar(r.Context(), varRequest, req)
			caddyhttp.SetVar(r.Context(), varReservation, d.Reservation)
			if d.Placement != nil {
				caddyhttp.SetVar(r.Context(), varPlacement, d.Placement)
				placed++
			}
			u := p.Select(testPool(d.Query.Dials...), r, nil)
			tier, _ := caddyhttp.GetVar(r.Context(), "llm.tier").(string)
			checked++
			switch {
			case u == nil:
				return fmt.Errorf("decision %d: Select picked nothing; the simulation picked %s", checked, d.Chosen)
			case d.Decision.Index < 0:
				fallbacks++
				if tier != routing.LoadOnly.String() {
					return fmt.Errorf("decision %d: the simulation fell back to least_conn, Select routed on %s", checked, tier)
				}
			case u.Dial != d.Chosen || tier != d.Decision.Tier.String():
				return fmt.Errorf("decision %d: Select picked %s on %s, the simulation %s on %s", checked, u.Dial, tier, d.Chosen, d.Decision.Tier)
			}
			return nil
		},
	}
	res, err := fleetsim.Run(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 || checked != len(res.DecisionNs) {
		t.Fatalf("%d decisions checked of %d made", checked, len(res.DecisionNs))
	}
	if res.Refusals == 0 || res.CachedTokens == 0 {
		t.Fatalf("the run is not the overloaded, cache-hitting one meant (refusals %d, cached tokens %d)", res.Refusals, res.CachedTokens)
	}
	if placed == 0 {
		t.Fatal("no request was placed by admission")
	}
	t.Logf("%d decisions agree (%d placed, %d least_conn fallbacks); %d refusals; hit rate %.2f",
		checked, placed, fallbacks, res.Refusals, float64(res.CachedTokens)/float64(res.PromptTokens))
}
