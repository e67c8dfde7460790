package fleet

import (
	"context"
	"testing"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// storeBlocks feeds dial's mirror one vLLM event batch (the v0.10.2+
// positional shape) storing the full 16-token blocks of toks, and no
// AllBlocksCleared ever: vLLM may publish none when an engine sleeps.
func storeBlocks(t *testing.T, f *Fleet, dial string, toks []uint64) {
	t.Helper()
	storeBlocksIn(t, f, dial, toks, "GPU")
}

// storeBlocksIn is storeBlocks into a tier of the engine's (an event's
// medium: "GPU", "CPU", "STORAGE").
func storeBlocksIn(t *testing.T, f *Fleet, dial string, toks []uint64, medium string) {
	t.Helper()
	n := len(toks) / 16
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = 0xfeed0000 + uint64(i)
	}
	feedEvents(t, f, dial, []any{"BlockStored", hashes, nil, toks[:16*n], 16, nil, medium})
	st := f.index.Mirror(dial).Stats()
	if got := st.Blocks + st.TierBlocks[kvindex.TierCPU] + st.TierBlocks[kvindex.TierStorage]; got != n {
		t.Fatalf("mirror holds %d blocks, want %d", got, n)
	}
}

// scrapeSleep records one manual scrape of dial: an idle engine at a sleep
// level.
func scrapeSleep(f *Fleet, dial string, level int) {
	f.registry.Ensure(dial).StartScrape()(upstreams.Gauges{BlockSize: 16, NumGPUBlocks: 1000, SleepLevel: level})
}

// TestSleepingEngine: an engine whose scrape shows it asleep is no
// candidate for admission or routing, loses its index entries (the
// blocks its events stored, its speculative entries) and its approximate-tree
// entries, is shown as asleep; after a scrape shows it awake it takes
// requests again, cold.
func TestSleepingEngine(t *testing.T) {
	f, _, dials := specFleet(t, 3)
	lim := Limits{KV: 0.9, MaxInflight: 4}
	for _, d := range dials {
		scrapeSleep(f, d, 0)
	}
	s := DefaultSettings()
	req := chatRequest(t, nil, "a prompt the sleeper will have seen")
	toks := tokens(3, 1024, 0)
	route := func() *Pick {
		return f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s, Tokens: toks, Explain: true})
	}
	first := route()
	sleeper := dials[first.Index]
	storeBlocks(t, f, sleeper, toks[:512])
	first.Commit(sleeper)
	f.Unrouted(req, nil).Commit(sleeper)
	if d := route(); dials[d.Index] != sleeper || d.Outcome != routing.Hit {
		t.Fatalf("before sleep: %+v, want a hit on %s", d.Decision, sleeper)
	}
	key, _ := approxKey(req, "")
	if !holds(f, key, sleeper) {
		t.Fatal("the approximate tree does not hold the prompt on the sleeper")
	}

	scrapeSleep(f, sleeper, upstreams.SleepWeightsOffload)
	if !f.IsAsleep(sleeper) || !f.OutOfService(sleeper) || f.IsDrained(sleeper) {
		t.Fatalf("asleep %v, out of service %v, drained %v", f.IsAsleep(sleeper), f.OutOfService(sleeper), f.IsDrained(sleeper))
	}
	if res, failOpen, ok := f.TryReserve([]string{sleeper}, lim); ok || failOpen || res != nil {
		t.Fatalf("admission reserved on the sleeping engine (ok %v, fail-open %v)", ok, failOpen)
	}
	for range 6 {
		res, _, ok := f.TryReserve(dials, lim)
		if !ok || res.Engine().Dial() == sleeper {
			t.Fatalf("admission: ok %v, engine %v", ok, res)
		}
		res.Done()
	}
	if f.AnyKnown([]string{sleeper}) {
		t.Fatal("a sleeping engine counts as something to wait for")
	}
	if holds(f, key, sleeper) {
		t.Fatal("the approximate tree still holds the prompt on the sleeping engine")
	}
	if n := f.index.DropPredictions(sleeper); n != 0 {
		t.Fatalf("%d speculative entries left on the sleeping engine", n)
	}
	if st := f.index.Mirror(sleeper).Stats(); st.Blocks != 0 || st.Resyncs["sleep"] != 1 {
		t.Fatalf("sleeping engine's mirror: %d blocks, resyncs %v; want none, one for sleep", st.Blocks, st.Resyncs)
	}
	d := route()
	if d.Outcome == routing.Hit {
		t.Fatalf("a hit while the holder sleeps: %+v", d.Decision)
	}
	for _, sc := range d.Scored {
		if sc.Dial == sleeper && sc.Excluded != "asleep" {
			t.Fatalf("explain shows the sleeper as %q", sc.Excluded)
		}
	}
	reported := false
	for _, r := range f.EngineReports() {
		if r.Dial == sleeper {
			reported = r.Asleep && r.SleepLevel == 1
		}
	}
	if !reported {
		t.Fatal("/llm/engines does not show the engine asleep at level 1")
	}

	scrapeSleep(f, sleeper, 0)
	if f.OutOfService(sleeper) {
		t.Fatal("awake engine still out of service")
	}
	res, _, ok := f.TryReserve([]string{sleeper}, lim)
	if !ok || res.Engine().Dial() != sleeper {
		t.Fatal("the woken engine takes no request")
	}
	res.Done()
	if m := f.index.Mirror(sleeper); m.Stats().Blocks != 0 || m.Stats().Resyncs["wake"] != 1 {
		t.Fatalf("woken mirror: %d blocks, resyncs %v; want it cold", m.Stats().Blocks, m.Stats().Resyncs)
	}
}
