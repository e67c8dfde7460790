package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestPolicyRetriesAndBreaker: one engine answers 500 (retried through
// lb_retry_match, the body replayed from request_buffers) and one upstream
// refuses connections (dial errors, always retried). With two bad replicas
// of four and two retries every request succeeds only because a retry never
// re-picks a replica that failed it. Their breakers open after
// breaker_failures, visible in llmgw_breaker_open and /llm/engines, and the
// repaired engine's breaker closes after breaker_cooldown.
//
// Admission places requests on known engines with room and never behind
// an open breaker, so placed requests reach the dead upstream (never
// scraped) only as retries of those the bad engine failed before its
// breaker opened: too few to open the dead one's. Every other request
// carries a session key, which the policy pins by hash among the
// candidates, dead or not.
func TestPolicyRetriesAndBreaker(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 200})
	bad := engines[1]
	dead := fmt.Sprintf("127.0.0.1:%d", mustFreePort(t, "127.0.0.1"))
	ups := []string{engines[0].Addr(), bad.Addr(), engines[2].Addr(), dead}
	gateway{
		patient:    true,
		engines:    kvEngines(engines...),
		upstreams:  ups,
		policy:     "\t\t\tdebug_headers\n\t\t\tcache_key_header X-Session-ID\n\t\t\tbreaker_failures 3\n\t\t\tbreaker_cooldown 10s\n",
		proxyExtra: "\t\tlb_retries 2\n\t\tlb_retry_match {\n\t\t\texpression `{rp.status_code} >= 500`\n\t\t}\n\t\trequest_buffers 1MiB\n",
	}.load(t)
	bad.SetFaults(vllmsim.Faults{Error500: true})

	breaker := func(dial string) (string, float64) {
		return getEngineReport(t, dial).Breaker, metricValue(t, "llmgw_breaker_open", `replica="`+dial+`"`)
	}
	failed0 := metricValue(t, "llmgw_responses_total", `outcome="upstream_error"`)
	opened := func() bool {
		var all []fleet.EngineReport
		adminJSON(t, http.MethodGet, "/llm/engines", "", &all)
		n := 0
		for _, r := range all {
			if (r.Dial == bad.Addr() || r.Dial == dead) && r.Breaker != "closed" {
				n++
			}
		}
		return n == 2
	}
	start := time.Now()
	n := 0
	for ; n < 100 && !opened(); n++ {
		var session map[string]string
		if n%2 == 1 {
			session = map[string]string{"X-Session-ID": fmt.Sprintf("session-%d", n)}
		}
		r := mustSend(t, "", chat{user: fmt.Sprintf("distinct prompt number %d, please answer", n), maxTokens: 2}.body(), session)
		if r.upstream == bad.Addr() || r.upstream == dead {
			t.Fatalf("request %d answered by bad replica %s", n, r.upstream)
		}
	}
	// Within the cooldown of the last failure both are open.
	for _, d := range []string{bad.Addr(), dead} {
		if st, open := breaker(d); st != "open" || open != 1 {
			t.Errorf("after %d requests in %v, breaker of %s: %q, llmgw_breaker_open %v; want open and 1", n, time.Since(start), d, st, open)
		}
	}
	for _, e := range []*vllmsim.Engine{engines[0], engines[2]} {
		if st, open := breaker(e.Addr()); st != "closed" || open != 0 {
			t.Errorf("breaker of healthy %s: %q, %v", e.Addr(), st, open)
		}
	}
	if d := metricValue(t, "llmgw_responses_total", `outcome="upstream_error"`) - failed0; d != 0 {
		t.Errorf("%v requests failed", d)
	}

	// Repair the engine: after the cooldown one request probes it, and its
	// success closes the breaker. The dead upstream stays out.
	bad.SetFaults(vllmsim.Faults{})
	testwait.For(t, 30*time.Second, "the cooldown to end", func() bool {
		st, _ := breaker(bad.Addr())
		return st == "half_open"
	})
	probed := false
	for i := 0; i < 100 && !probed; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r := send(ctx, "", chat{user: fmt.Sprintf("after the repair %d", i), maxTokens: 2}.body(), nil)
		cancel()
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d after the repair: %d %v %.200s", i, r.status, r.err, r.body)
		}
		probed = r.upstream == bad.Addr()

	}
	if !probed {
		var ex map[string]any
		adminJSON(t, http.MethodPost, "/llm/explain", chat{user: "explain me", maxTokens: 2}.body(), &ex)
		b, _ := json.MarshalIndent(ex, "", " ")
		t.Logf("/llm/explain of a fresh request: %s", b)
		var all []fleet.EngineReport
		adminJSON(t, http.MethodGet, "/llm/engines", "", &all)
		b, _ = json.MarshalIndent(all, "", " ")
		t.Logf("/llm/engines: %s", b)
		t.Fatal("no request probed the repaired engine")
	}
	// The outcome is reported when the handler returns, which may be just
	// after the client has read the whole answer.
	testwait.For(t, 5*time.Second, "the successful probe to close the breaker", func() bool {
		st, _ := breaker(bad.Addr())
		return st == "closed"
	})
	if _, open := breaker(bad.Addr()); open != 0 {
		t.Errorf("after a successful probe: llmgw_breaker_open %v, want 0", open)
	}
	if st, _ := breaker(dead); st == "closed" {
		t.Errorf("the dead upstream's breaker closed")
	}
}
