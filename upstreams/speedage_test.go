package upstreams

import (
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
)

// TestSpeedAge: Load.SpeedAge is how long before the latest scrape the
// prefill rate last took in new prefill, in the warm-up's pooled windows
// and in the smoothed ones after: scrapes without new prefill, a window
// held open for its prefill time and a restart do not refresh it; time
// between scrapes does not age it.
func TestSpeedAge(t *testing.T) {
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	r := NewRegistry(Options{ManualScrape: true, Now: clk.Now})
	defer r.Close()
	e := r.Ensure("127.0.0.1:1")
	// c is the engine's cumulative counters: uncached prompt tokens,
	// prefill seconds, first tokens and ended prefills.
	type c struct{ tok, secs, firsts, ended float64 }
	steps := []struct {
		name    string
		advance time.Duration
		scrape  *c // nil: no scrape
		want    time.Duration
		rate    bool // the rate is known
	}{
		{"baseline: no rate, no age", 0, &c{0, 0, 0, 0}, 0, false},
		{"first prefill", 2 * time.Second, &c{2000, 0.25, 1, 1}, 0, true},
		{"idle scrape", 2 * time.Second, &c{2000, 0.25, 1, 1}, 2 * time.Second, true},
		{"time without a scrape does not age it", time.Second, nil, 2 * time.Second, true},
		{"another idle scrape", time.Second, &c{2000, 0.25, 1, 1}, 4 * time.Second, true},
		{"new prefill refreshes it", 2 * time.Second, &c{4000, 0.5, 2, 2}, 0, true},
		{"past the warm-up", 2 * time.Second, &c{84000, 20.5, 42, 42}, 0, true},
		{"smoothed: idle", 2 * time.Second, &c{84000, 20.5, 42, 42}, 2 * time.Second, true},
		{"tokens without their prefill time: the window stays open", 2 * time.Second, &c{86000, 20.5, 43, 42}, 4 * time.Second, true},
		{"the time arrives", 2 * time.Second, &c{86000, 21, 43, 43}, 0, true},
		{"restart: counters down, no sample", 2 * time.Second, &c{0, 0, 0, 0}, 2 * time.Second, true},
		{"after the restart, new prefill", 2 * time.Second, &c{2000, 0.25, 1, 1}, 0, true},
	}
	for _, s := range steps {
		clk.Advance(s.advance)
		if s.scrape != nil {
			e.StartScrape()(Gauges{PromptTokens: s.scrape.tok, PrefillSeconds: s.scrape.secs, PrefillCount: s.scrape.ended,
				FirstTokens: s.scrape.firsts, TTFTSeconds: s.scrape.secs})
		}
		l := e.Load()
		if l.SpeedAge != s.want || (l.PrefillRate > 0) != s.rate {
			t.Fatalf("%s: SpeedAge %v, rate %v; want %v, rate known %v", s.name, l.SpeedAge, l.PrefillRate, s.want, s.rate)
		}
	}
}
