package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestPolicyColdSpread: prompts nobody holds spread over every replica.
// llm_admission reserves each request on some engine before the policy
// runs; that reservation must not make its engine look busier than its
// peers, or the engine admission prefers would never win a tie.
func TestPolicyColdSpread(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 500})
	gateway{patient: true, engines: kvEngines(engines...), policy: "\t\t\tdebug_headers\n"}.load(t)
	rs := make([]reply, 60)
	for i := range rs {
		rs[i] = send(context.Background(), "", chat{user: fmt.Sprintf("cold prompt %d about topic %d", i, i*7), maxTokens: 1}.body(), nil)
		if rs[i].err != nil || rs[i].status != http.StatusOK {
			t.Fatalf("request %d: %d %v", i, rs[i].status, rs[i].err)
		}
	}
	got := countUpstreams(rs)
	for _, e := range engines {
		if got[e.Addr()] < 5 {
			t.Errorf("engine %s got %d of 60 cold requests (all: %v)", e.Addr(), got[e.Addr()], got)
		}
	}
	t.Logf("cold spread: %v", got)
}
