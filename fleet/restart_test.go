package fleet

import (
	"errors"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestRestartClosesBreaker: the requests an engine's restart aborts open
// its breaker, and the first scrape of the new process — its counters
// lower than before — closes it again, instead of keeping a healthy
// engine out of routing for the cooldown (and the pool's load on the
// rest). Scrapes whose counters only grew leave an open breaker open.
func TestRestartClosesBreaker(t *testing.T) {
	dial := deadDials[0]
	f := manualFleet(t, &EngineConfig{Dial: dial, MaxInflight: 16})
	f.SetBreaker(routing.BreakerConfig{Failures: 5, Cooldown: time.Hour})
	old := upstreams.Gauges{Running: 16, Waiting: 4, PromptTokens: 90000, CachedTokens: 30000, PrefillSeconds: 12}
	scrape(f, dial, old)
	for range 20 { // one restart aborts everything in flight at once
		f.Proxied(dial).Outcome(errors.New("upstream stream ended abruptly"), 200)
	}
	if st := f.Breaker().State(dial, time.Now()); st != routing.StateOpen {
		t.Fatalf("after the aborts the breaker is %s, want open", st)
	}
	old.PromptTokens += 4000
	old.PrefillSeconds++
	scrape(f, dial, old)
	if st := f.Breaker().State(dial, time.Now()); st != routing.StateOpen {
		t.Fatalf("a scrape of the same process made the breaker %s, want open", st)
	}
	scrape(f, dial, upstreams.Gauges{PromptTokens: 0, CachedTokens: 0, PrefillSeconds: 0})
	if st := f.Breaker().State(dial, time.Now()); st != routing.StateClosed {
		t.Fatalf("after the engine restarted the breaker is %s, want closed", st)
	}
}
