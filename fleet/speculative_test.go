package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// specFleet is a fleet of n engines whose KV events are live (their
// mirrors' feeds connected) but have announced nothing yet: no engine
// holds a block of anything, as right after the first request of a new
// prefix was sent and before its BlockStored arrived.
func specFleet(t *testing.T, n int) (*Fleet, *testclock.Clock, []string) {
	t.Helper()
	clk := testclock.New(time.Unix(5000, 0))
	f := New(zap.NewNop(), Options{ManualScrape: true, Now: clk.Now})
	t.Cleanup(f.Close)
	dials := make([]string, n)
	for i := range dials {
		dials[i] = fmt.Sprintf("10.0.0.%d:8000", i+1)
		m, err := f.index.AddEngine(dials[i], kvindex.MirrorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		kvindex.NewFeed(m, nil, kvindex.FeedConfig{}).Connected()
	}
	return f, clk, dials
}

// tokens is a prompt of the shared prefix (n tokens of seed) and a
// suffix of its own.
func tokens(seed uint64, n int, own uint64) []uint64 {
	out := make([]uint64, 0, n+64)
	for i := range n {
		out = append(out, (seed*7919+uint64(i)*104729)%151000)
	}
	for i := range 64 {
		out = append(out, (own*31+uint64(i))%151000)
	}
	return out
}

// burst routes 16 requests sharing a 4096-token prefix within 48ms, each
// dispatched and none finished, and returns how many engines they went to.
func burst(t *testing.T, f *Fleet, clk *testclock.Clock, dials []string) int {
	t.Helper()
	used := map[string]int{}
	s := DefaultSettings()
	for i := range 16 {
		req := chatRequest(t, nil, fmt.Sprintf("request %d", i))
		d := f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s, Tokens: tokens(1, 4096, uint64(i))})
		if d.Index < 0 {
			t.Fatalf("request %d: no pick (%+v)", i, d.Decision)
		}
		d.Commit(dials[d.Index]).Dispatch(nil)
		used[dials[d.Index]]++
		clk.Advance(3 * time.Millisecond)
	}
	t.Logf("engines used: %v", used)
	return len(used)
}

// TestSpeculativeBurst: 16 requests sharing a long prefix arrive within
// 50ms on 8 engines, before any engine's events say it holds the prefix.
// With speculative entries they go where the first went, and where load
// sends the overflow: at most 2 engines. Without, each finds nobody holding
// the prefix and load spreads them.
func TestSpeculativeBurst(t *testing.T) {
	f, clk, dials := specFleet(t, 8)
	with := burst(t, f, clk, dials)
	if with > 2 {
		t.Errorf("with speculative entries the burst used %d engines, want at most 2", with)
	}
	st := f.index.PredictionStats()
	if st.Inserted == 0 || st.Live == 0 {
		t.Errorf("no speculative entries: %+v", st)
	}

	f, clk, dials = specFleet(t, 8)
	off := time.Duration(0)
	f.Start(f.NewGeneration(Config{SpeculativeTTL: &off}, zap.NewNop()))
	without := burst(t, f, clk, dials)
	t.Logf("burst of 16 on 8 engines: %d engines with speculative entries, %d without", with, without)
	if without <= 2 {
		t.Errorf("without speculative entries the burst used %d engines: the test shows nothing", without)
	}
}

// TestSpeculativeNeverStored is the acceptance test at the fleet's level:
// a prediction for an engine that never stores the blocks (the request
// failed) stops drawing requests after the TTL, and at once when the
// failure is reported.
func TestSpeculativeNeverStored(t *testing.T) {
	f, clk, dials := specFleet(t, 4)
	s := DefaultSettings()
	req := chatRequest(t, nil, "first")
	toks := tokens(2, 1024, 0)
	route := func() *Pick {
		return f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s, Tokens: toks, Explain: true})
	}
	first := route()
	if first.Outcome != routing.Miss {
		t.Fatalf("the first request found a holder: %+v", first.Decision)
	}
	dial := dials[first.Index]
	first.Commit(dial)
	d := route()
	if d.Index != first.Index || d.Tier != routing.Precise || d.Outcome != routing.Hit {
		t.Fatalf("after Routed: %+v, want a precise hit on %s", d.Decision, dial)
	}
	if sc := d.Scored[d.Index]; sc.SpeculativeBlocks != 68 || sc.MatchedBlocks != 68 {
		t.Fatalf("explain shows %+v, want 68 speculative blocks of 68 (1088 tokens)", sc)
	}

	clk.Advance(DefaultSpeculativeTTL)
	if d := route(); d.Outcome != routing.Miss {
		t.Fatalf("after the TTL: %+v, want nobody holding the prefix", d.Decision)
	}

	first.Commit(dial).Outcome(nil, 502)
	if d := route(); d.Outcome != routing.Miss {
		t.Fatalf("after a failure report: %+v, want nobody holding the prefix", d.Decision)
	}
	first.Commit(dial).Failed() // the policy's retry path
	if d := route(); d.Outcome != routing.Miss {
		t.Fatalf("after a retry elsewhere: %+v, want nobody holding the prefix", d.Decision)
	}
	st := f.index.PredictionStats()
	if st.Expired != 68 || st.Dropped != 136 || st.Live != 0 {
		t.Fatalf("stats %+v, want 68 expired, 136 dropped", st)
	}
}

// TestSpeculativeOnlyWhenLive: an engine whose events are not live gets no
// prediction (nothing would confirm or refute it), nor does a request
// whose tokens are unknown; a success report keeps predictions.
func TestSpeculativeOnlyWhenLive(t *testing.T) {
	f, _, dials := specFleet(t, 2)
	kvindex.NewFeed(f.index.Mirror(dials[1]), nil, kvindex.FeedConfig{}).Disconnected(nil)
	s := DefaultSettings()
	req := chatRequest(t, nil, "hello")
	d := f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s, Tokens: tokens(3, 256, 0)})
	d.Commit(dials[1])
	s.Tokenize = false
	f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s}).Commit(dials[0])
	if st := f.index.PredictionStats(); st.Inserted != 0 {
		t.Fatalf("predicted: %+v", st)
	}
	d.Commit(dials[0])
	f.Proxied(dials[0]).Outcome(nil, 200)
	if st := f.index.PredictionStats(); st.Live != 20 {
		t.Fatalf("after a success: %+v, want the 20 entries", st)
	}
}

// TestSpeculativeTTLConfig: nil is the default, 0 disables, negative is
// refused.
func TestSpeculativeTTLConfig(t *testing.T) {
	f, _, _ := specFleet(t, 1)
	ttl := func(d *time.Duration) time.Duration {
		f.Start(f.NewGeneration(Config{SpeculativeTTL: d}, zap.NewNop()))
		return f.index.PredictTTL()
	}
	zero, five, neg := time.Duration(0), 5*time.Second, -time.Second
	if got := f.index.PredictTTL(); got != DefaultSpeculativeTTL {
		t.Fatalf("new fleet: %v", got)
	}
	for _, tc := range []struct {
		in   *time.Duration
		want time.Duration
	}{{&five, five}, {&zero, 0}, {nil, DefaultSpeculativeTTL}} {
		if got := ttl(tc.in); got != tc.want {
			t.Errorf("SpeculativeTTL %v: TTL %v, want %v", tc.in, got, tc.want)
		}
	}
	if err := (&Config{SpeculativeTTL: &neg}).Validate(); err == nil {
		t.Fatal("a negative TTL validated")
	}
}

// TestPlacedNotWaitingForPrediction: an engine that only speculative
// entries make the prefix's holder is no holder worth waiting for when it
// is full: a parked request keeps its placement, and the guess may end
// (TTL, a failure) while it waits. The prediction still counts among
// engines with room.
func TestPlacedNotWaitingForPrediction(t *testing.T) {
	f, clk, dials := specFleet(t, 2)
	hot, cold := dials[0], dials[1]
	s := DefaultSettings()
	toks := tokens(4, 8192, 0)
	req := chatRequest(t, nil, "first")
	query := Query{Request: req, Dials: dials, Settings: s, Tokens: toks}
	drain(f, clk, hot, 50) // 5/s: the wait is ~0.2 s against ~0.8 s of prefill saved
	f.Route(context.Background(), query).Commit(hot)
	lim := Limits{KV: 0.9, MaxInflight: 4}
	scrape(f, hot, upstreams.Gauges{Running: 4})
	scrape(f, cold, upstreams.Gauges{Running: 0})
	p := f.Place(context.Background(), query)
	if p.Holder != hot {
		t.Fatalf("holder %q, want the predicted %s", p.Holder, hot)
	}
	res, _, ok := p.Reserve(dials, lim, admission.PassAny)
	if !ok || res.Engine().Dial() != cold || p.Reason != ReasonMoved {
		t.Fatalf("reserved on %v (ok %v, reason %q, wait %v), want %s: moved, not waiting for a guess",
			res.Engine().Dial(), ok, p.Reason, p.Wait, cold)
	}
	res.Done()
	if res, _, ok := p.Reserve(dials, lim, admission.PassPreferred); ok {
		t.Fatalf("PassPreferred reserved on %s: a prediction made it a holder", res.Engine().Dial())
	}

	scrape(f, hot, upstreams.Gauges{Running: 3}) // room at the predicted engine
	p = f.Place(context.Background(), query)
	res, _, ok = p.Reserve(dials, lim, admission.PassAny)
	if !ok || res.Engine().Dial() != hot || p.Reason != ReasonHit {
		t.Fatalf("with room: reserved on %v (ok %v, reason %q), want %s: the prediction counts", res.Engine().Dial(), ok, p.Reason, hot)
	}
	res.Done()
}

// TestRoutedPredictsPastStoredRun: on engines whose events say they hold
// a prompt's leading blocks, Routed predicts only the rest, and the next
// decision sees the whole prompt held there; a decision whose run had
// predicted blocks in it predicts them again, as they may have ended
// before Routed (here a failure report drops them).
func TestRoutedPredictsPastStoredRun(t *testing.T) {
	ss := newSimSetup(t, 2, 2000)
	ctx := context.Background()
	route := func() (*Pick, routing.Scored) {
		d := ss.f.Route(ctx, Query{Request: ss.req, Dials: ss.dials, Settings: ss.s, Tokens: ss.tokens, Explain: true})
		if d.Index < 0 {
			t.Fatalf("no pick: %+v", d.Decision)
		}
		return d, d.Scored[d.Index]
	}
	d, sc := route()
	total := len(d.keys)
	if sc.SpeculativeBlocks != 0 || sc.MatchedBlocks == 0 || sc.MatchedBlocks >= total {
		t.Fatalf("setup: %+v of %d blocks, want a stored run short of the prompt's end", sc, total)
	}
	stored, dial := sc.MatchedBlocks, ss.dials[d.Index]
	a := d.Commit(dial)
	if got := ss.f.index.PredictionStats().Inserted; got != uint64(total-stored) {
		t.Fatalf("Routed predicted %d blocks, want the %d past the stored run", got, total-stored)
	}
	again, sc := route()
	if again.Index != d.Index || sc.MatchedBlocks != total || sc.SpeculativeBlocks != total-stored {
		t.Fatalf("after Routed: %s holds %+v, want all %d blocks, %d of them predicted", ss.dials[again.Index], sc, total, total-stored)
	}
	a.Outcome(nil, 502) // drops dial's predictions
	again.Commit(dial)
	if got := ss.f.index.PredictionStats().Inserted; got != 2*uint64(total-stored) {
		t.Fatalf("Routed with a partly predicted run: %d blocks predicted in all, want %d", got, 2*(total-stored))
	}
}
