package kvindex

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
)

const specBS = 16

// specFixture is an index with predictions on (TTL 2s, a fake clock) and
// two live engines: "a", which has stored an unrelated block (its block
// size is known), and "b", which has stored nothing.
type specFixture struct {
	t     *testing.T
	clk   *testclock.Clock
	ix    *Index
	feeds map[string]*Feed
	p     []uint64 // a prompt of 16 blocks
	keys  []uint64
}

func newSpecFixture(t *testing.T, cfg IndexConfig) *specFixture {
	t.Helper()
	clk := testclock.New(time.Unix(1000, 0))
	cfg.Now = clk.Now
	x := &specFixture{t: t, clk: clk, ix: NewIndex(cfg), feeds: map[string]*Feed{}, p: prompt(16*specBS, 41)}
	x.ix.SetPredictTTL(2 * time.Second)
	for _, id := range []string{"a", "b"} {
		m, err := x.ix.AddEngine(id, MirrorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		x.feeds[id] = NewFeed(m, nil, FeedConfig{})
		x.feeds[id].Connected()
	}
	x.store("a", prompt(specBS, 99), 0, 1, 1<<40)
	var err error
	if x.keys, err = RequestKeys(nil, x.p, KeySpec{BlockSize: specBS}); err != nil || len(x.keys) != 16 {
		t.Fatalf("keys: %d, %v", len(x.keys), err)
	}
	return x
}

// store applies a BlockStored of blocks [from, to) of p on engine id, the
// engine's hash of block i being base+i.
func (x *specFixture) store(id string, p []uint64, from, to int, base uint64) {
	ev := Event{Kind: EventBlockStored, BlockSize: specBS, Medium: "GPU", TokenIDs: p[from*specBS : to*specBS]}
	for i := from; i < to; i++ {
		ev.BlockHashes = append(ev.BlockHashes, base+uint64(i))
	}
	if from > 0 {
		ev.HasParent, ev.Parent = true, base+uint64(from-1)
	}
	x.apply(id, ev)
}

func (x *specFixture) apply(id string, evs ...Event) {
	m := x.ix.Mirror(id)
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.apply(0, &Batch{Events: evs})
}

// match returns what Match says id holds of the fixture's prompt.
func (x *specFixture) match(id string) EngineMatch {
	x.t.Helper()
	ms, err := x.ix.Match(Query{Tokens: x.p})
	if err != nil {
		x.t.Fatal(err)
	}
	for _, m := range ms {
		if m.Engine == id {
			return m
		}
	}
	return EngineMatch{}
}

// stats returns the counters, checking that every entry is accounted for.
func (x *specFixture) stats() PredictionStats {
	x.t.Helper()
	st := x.ix.PredictionStats()
	if st.Inserted != st.Confirmed+st.Expired+st.Dropped+uint64(st.Live) {
		x.t.Fatalf("entries unaccounted for: %+v", st)
	}
	return st
}

// TestPredictMatch: a prediction counts as held, on an engine whose block
// size is known and on one that has stored nothing; confirmed blocks are
// the engine's own from then on.
func TestPredictMatch(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	for _, id := range []string{"a", "b"} {
		if n := x.ix.Predict(id, specBS, 0, x.keys); n != 16 {
			t.Fatalf("Predict(%s) recorded %d keys, want 16", id, n)
		}
		if got := x.match(id); got.Blocks != 16 || got.Predicted != 16 || got.Tokens != 16*specBS {
			t.Fatalf("%s after Predict: %+v, want 16 blocks, all predicted", id, got)
		}
	}
	x.store("a", x.p, 0, 4, 1)
	if got := x.match("a"); got.Blocks != 16 || got.Predicted != 12 {
		t.Fatalf("a after storing 4 blocks: %+v, want 16 blocks, 12 predicted", got)
	}
	if st := x.stats(); st.Inserted != 32 || st.Confirmed != 4 || st.Live != 28 {
		t.Fatalf("stats %+v, want 32 inserted, 4 confirmed, 28 live", st)
	}
	// The precomputed keys give the same answer as hashing.
	ms, err := x.ix.Match(Query{Tokens: x.p, Keys: x.keys, KeysBlockSize: specBS})
	if err != nil || len(ms) != 2 || ms[0].Predicted+ms[1].Predicted != 28 {
		t.Fatalf("Match with keys: %+v, %v", ms, err)
	}
	// Held keys are not predicted again.
	x.store("a", x.p, 4, 16, 1)
	if n := x.ix.Predict("a", specBS, 0, x.keys); n != 0 {
		t.Fatalf("Predict recorded %d keys the engine holds", n)
	}
}

// TestPredictionNeverStoredEnds is the acceptance test of speculative
// entries: they never make routing wrong for longer than their TTL. The
// predicted engine never stores the blocks (the request failed): Match
// stops counting them once the TTL has passed, and at once when the
// failure is reported (DropPredictions).
func TestPredictionNeverStoredEnds(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	x.ix.Predict("a", specBS, 0, x.keys)
	x.clk.Advance(time.Second)
	x.ix.Predict("b", specBS, 0, x.keys)
	x.clk.Advance(999 * time.Millisecond)
	if x.match("a").Blocks != 16 {
		t.Fatal("a's prediction ended before its TTL")
	}
	x.clk.Advance(time.Millisecond)
	if got := x.match("a"); got.Blocks != 0 {
		t.Fatalf("a's prediction outlived its TTL: %+v", got)
	}
	if x.match("b").Blocks != 16 {
		t.Fatal("b's younger prediction ended with a's")
	}
	if n := x.ix.DropPredictions("b"); n != 16 {
		t.Fatalf("DropPredictions dropped %d entries, want 16", n)
	}
	if got := x.match("b"); got.Blocks != 0 {
		t.Fatalf("b's prediction survived the failure report: %+v", got)
	}
	if st := x.stats(); st.Expired != 16 || st.Dropped != 16 || st.Live != 0 {
		t.Fatalf("stats %+v, want 16 expired, 16 dropped", st)
	}
}

// TestPredictionNotRenewed: predicting an entry again does not extend its
// life. An engine that never confirms a prefix it draws requests for
// (prefix caching off, extra keys the gateway does not see) is predicted
// to hold it for one TTL from the first prediction, however often the
// prediction is repeated.
func TestPredictionNotRenewed(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	if n := x.ix.Predict("a", specBS, 0, x.keys); n != 16 {
		t.Fatalf("first Predict recorded %d keys, want 16", n)
	}
	for i := 1; i <= 30; i++ {
		x.clk.Advance(time.Second)
		// Every 2s (one TTL) the entries of 2s ago have ended, however
		// often they were predicted since; Predict then inserts them anew.
		if got := x.match("a").Blocks; (i%2 == 0) != (got == 0) {
			t.Fatalf("at %ds, before Predict: %d blocks", i, got)
		}
		x.ix.Predict("a", specBS, 0, x.keys)
		if st := x.stats(); st.Live != 16 {
			t.Fatalf("at %ds: stats %+v, want 16 live", i, st)
		}
	}
	st := x.stats()
	// Inserted anew every 2s (one TTL): at 0, 2, …, 30s.
	if st.Inserted != 16*16 || st.Expired != 15*16 {
		t.Fatalf("stats %+v, want 256 inserted and 240 expired: the entries were renewed", st)
	}
	x.clk.Advance(time.Second) // 31s: the entries of 30s are 1s old
	if x.match("a").Blocks != 16 {
		t.Fatal("the entries of the last insertion ended early")
	}
	x.clk.Advance(time.Second) // 32s: a TTL after they were first predicted
	if got := x.match("a"); got.Blocks != 0 {
		t.Fatalf("a TTL after the last insertion: %+v, want nothing", got)
	}
}

// TestPredictionFrozenClock: predicting the same prompt again and again
// in the same instant keeps one queue item per entry.
func TestPredictionFrozenClock(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	for range 2000 {
		x.ix.Predict("a", specBS, 0, x.keys)
	}
	x.ix.spec.mu.RLock()
	s := &x.ix.spec.slots[x.ix.Mirror("a").slot]
	n := len(s.fifoK) - s.head
	x.ix.spec.mu.RUnlock()
	if n != 16 {
		t.Fatalf("%d queue items for 16 entries", n)
	}
	if st := x.stats(); st.Inserted != 16 || st.Live != 16 {
		t.Fatalf("stats %+v, want 16 inserted and live", st)
	}
}

// TestPredictionEnds: every way an engine's cache is reset, or the engine
// goes, drops its predictions at once; a confirmed block that the engine
// then removes is not held by prediction either.
func TestPredictionEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(x *specFixture)
	}{
		{"stored then removed", func(x *specFixture) {
			x.store("a", x.p, 0, 16, 1)
			ev := Event{Kind: EventBlockRemoved, Medium: "GPU"}
			for i := range 16 {
				ev.BlockHashes = append(ev.BlockHashes, 1+uint64(i))
			}
			x.apply("a", ev)
		}},
		{"all blocks cleared", func(x *specFixture) { x.apply("a", Event{Kind: EventAllBlocksCleared}) }},
		{"reset", func(x *specFixture) { x.ix.Mirror("a").Reset("") }},
		{"resubscribed", func(x *specFixture) { x.feeds["a"].Connected() }},
		{"disconnected", func(x *specFixture) { x.feeds["a"].Disconnected(nil) }},
		{"sequence restart", func(x *specFixture) {
			x.feeds["a"].Message(nil, 5, batch())
			x.feeds["a"].Message(nil, 1, batch())
		}},
		{"engine removed", func(x *specFixture) { x.ix.RemoveEngine("a") }},
		{"predictions off", func(x *specFixture) { x.ix.SetPredictTTL(0) }},
		{"failure reported", func(x *specFixture) { x.ix.DropPredictions("a") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newSpecFixture(t, IndexConfig{})
			x.ix.Predict("a", specBS, 0, x.keys)
			tc.end(x)
			if got := x.match("a"); got.Blocks != 0 {
				t.Fatalf("a still matches: %+v", got)
			}
			if st := x.stats(); st.Live != 0 || st.Expired != 0 {
				t.Fatalf("stats %+v, want nothing live or expired", st)
			}
		})
	}
}

// TestPredictRefused: nothing is recorded for bad input, an unknown
// engine, a block size the engine does not use, or with predictions off.
func TestPredictRefused(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	for name, n := range map[string]int{
		"no keys":             x.ix.Predict("a", specBS, 0, nil),
		"block size 0":        x.ix.Predict("a", 0, 0, x.keys),
		"negative block size": x.ix.Predict("a", -1, 0, x.keys),
		"unknown engine":      x.ix.Predict("zz", specBS, 0, x.keys),
		"other block size":    x.ix.Predict("a", 2*specBS, 0, x.keys),
	} {
		if n != 0 {
			t.Errorf("%s: %d keys recorded", name, n)
		}
	}
	x.ix.SetPredictTTL(-time.Second)
	if n := x.ix.Predict("a", specBS, 0, x.keys); n != 0 || x.ix.PredictTTL() != 0 {
		t.Fatalf("predictions off: %d keys recorded, TTL %v", n, x.ix.PredictTTL())
	}
	if x.ix.DropPredictions("zz") != 0 {
		t.Fatal("dropped entries of an unknown engine")
	}
}

// TestPredictionBounds: an engine keeps at most MaxPredictedPerEngine
// entries, the index MaxPredicted, the oldest dropped first.
func TestPredictionBounds(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{MaxPredictedPerEngine: 8, MaxPredicted: 12})
	if n := x.ix.Predict("a", specBS, 0, x.keys); n != 8 {
		t.Fatalf("recorded %d of a 16-block prompt, want the leading 8", n)
	}
	if got := x.match("a"); got.Blocks != 8 {
		t.Fatalf("a: %+v, want its 8 leading blocks", got)
	}
	x.clk.Advance(time.Millisecond)
	other, _ := RequestKeys(nil, prompt(4*specBS, 7), KeySpec{BlockSize: specBS})
	x.ix.Predict("a", specBS, 0, other)
	if got := x.match("a"); got.Blocks != 4 {
		t.Fatalf("a after a newer prediction: %+v, want the leading 4 blocks kept", got)
	}
	x.clk.Advance(time.Millisecond)
	x.ix.Predict("b", specBS, 0, x.keys) // 8 more: 16 > 12, a's oldest go
	if got := x.match("b"); got.Blocks != 8 {
		t.Fatalf("b: %+v, want 8", got)
	}
	st := x.stats()
	if st.Live != 12 || st.Dropped != 8 {
		t.Fatalf("stats %+v, want 12 live (the bound), 8 dropped", st)
	}
	if got := x.match("a"); got.Blocks != 0 {
		t.Fatalf("a's oldest entries survived the bound: %+v", got)
	}
}

// TestPredictionsConcurrent exercises every path at once, for -race.
func TestPredictionsConcurrent(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{MaxPredicted: 64})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 200 {
				id := []string{"a", "b"}[rng.IntN(2)]
				switch rng.IntN(5) {
				case 0:
					x.ix.Predict(id, specBS, 0, x.keys[:rng.IntN(16)])
				case 1:
					x.ix.DropPredictions(id)
				case 2:
					x.clk.Advance(time.Duration(rng.IntN(500)) * time.Millisecond)
				case 3:
					if g == 0 {
						x.store("a", x.p, 0, 1+i%15, uint64(i)<<20)
					}
				default:
					if _, err := x.ix.Match(Query{Tokens: x.p}); err != nil {
						panic(fmt.Sprint(err))
					}
				}
			}
		}()
	}
	wg.Wait()
	if st := x.stats(); st.Live > 64 {
		t.Fatalf("%d entries live, over the bound", st.Live)
	}
}

// TestPredictionNotInherited: a Predict that lands while an engine is
// being removed (after its mirror was cleared, before its slot is freed)
// leaves nothing for the engine that takes the slot next; nor does any
// entry a free slot still carries.
func TestPredictionNotInherited(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	m := x.ix.Mirror("a")
	m.wmu.Lock()
	m.clear("removed") // RemoveEngine, up to freeing the slot
	if n := x.ix.Predict("a", specBS, 0, x.keys); n != 16 {
		m.wmu.Unlock()
		t.Fatalf("Predict during the removal recorded %d keys: the test shows nothing", n)
	}
	x.ix.free(m)
	m.wmu.Unlock()
	if _, err := x.ix.AddEngine("c", MirrorConfig{}); err != nil {
		t.Fatal(err)
	}
	if x.ix.Mirror("c").slot != m.slot {
		t.Fatal("c did not take a's slot: the test shows nothing")
	}
	if got := x.match("c"); got.Blocks != 0 {
		t.Fatalf("c inherited a's predictions: %+v", got)
	}
	if st := x.stats(); st.Live != 0 {
		t.Fatalf("stats %+v, want nothing live", st)
	}

	// A free slot carrying entries (however they got there) is emptied
	// when an engine takes it.
	x.ix.RemoveEngine("c")
	x.ix.mu.RLock()
	x.ix.spec.addStep(&predictRun{slot: m.slot, blockSize: specBS}, x.keys, x.ix.banks[0])
	x.ix.mu.RUnlock()
	if _, err := x.ix.AddEngine("d", MirrorConfig{}); err != nil {
		t.Fatal(err)
	}
	if got := x.match("d"); got.Blocks != 0 {
		t.Fatalf("d inherited its slot's entries: %+v", got)
	}
}

// TestPredictionTotalBelowPerEngine: a total bound below the per-engine
// one holds, for one engine alone and for several.
func TestPredictionTotalBelowPerEngine(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{MaxPredicted: 4, MaxPredictedPerEngine: 8})
	if n := x.ix.Predict("a", specBS, 0, x.keys); n > 4 {
		t.Fatalf("recorded %d keys, over the total bound of 4", n)
	}
	if st := x.stats(); st.Live > 4 {
		t.Fatalf("one engine: %d entries live, over the total bound of 4", st.Live)
	}
	x.clk.Advance(time.Millisecond)
	x.ix.Predict("b", specBS, 0, x.keys)
	if st := x.stats(); st.Live > 4 {
		t.Fatalf("two engines: %d entries live, over the total bound of 4", st.Live)
	}
	if got := x.match("b"); got.Blocks != 4 {
		t.Fatalf("b: %+v, want its 4 leading blocks", got)
	}
}

// TestPredictionTotalEvictsOldestFirst: with the whole set full, room is
// made from the oldest entries overall, whichever engine holds them, also
// when one add needs many evictions across engines (makeRoomLocked's scan
// is kept across one add's inserts, while it still names the oldest).
func TestPredictionTotalEvictsOldestFirst(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{MaxPredicted: 12, MaxPredictedPerEngine: 12})
	keysOf := func(salt uint64, blocks int) []uint64 {
		k, err := RequestKeys(nil, prompt(blocks*specBS, salt), KeySpec{BlockSize: specBS})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	p1, p2, p3, p4 := keysOf(1, 4), keysOf(2, 4), keysOf(3, 4), keysOf(4, 6)
	held := func(id string, keys []uint64) int {
		for _, m := range x.ix.MatchKeys(specBS, 0, keys) {
			if m.Engine == id {
				return m.Blocks
			}
		}
		return 0
	}
	x.ix.Predict("a", specBS, 0, p1) // the oldest
	x.clk.Advance(time.Millisecond)
	x.ix.Predict("b", specBS, 0, p2)
	x.clk.Advance(time.Millisecond)
	x.ix.Predict("a", specBS, 0, p3) // full: 12 entries
	x.clk.Advance(time.Millisecond)
	// 6 evictions: all of p1 (on a), then the two oldest of p2 (on b,
	// its tail: a prompt's blocks go in last first), none of p3 although
	// a still holds the oldest entries when p1 is gone.
	x.ix.Predict("b", specBS, 0, p4)
	if st := x.stats(); st.Live != 12 || st.Dropped != 6 {
		t.Fatalf("stats %+v, want 12 live and 6 dropped", st)
	}
	for _, c := range []struct {
		id   string
		keys []uint64
		want int
	}{{"a", p1, 0}, {"b", p2, 2}, {"a", p3, 4}, {"b", p4, 6}} {
		if got := held(c.id, c.keys); got != c.want {
			t.Errorf("%s holds %d blocks of its prompt, want %d", c.id, got, c.want)
		}
	}
}

// TestPredictionClockStepBack: a clock without Go's monotonic reading (a
// fake here) that steps back does not keep entries alive for the step:
// time stands still across it, from the first reading after it, and
// entries of before the step do not hold back the expiry of those after.
func TestPredictionClockStepBack(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	x.ix.Predict("a", specBS, 0, x.keys[:8])
	x.clk.Advance(-time.Hour)
	if got := x.match("a"); got.Blocks != 8 {
		t.Fatalf("after the step back: %+v, want the 8 entries", got)
	}
	x.clk.Advance(time.Millisecond)
	x.ix.Predict("a", specBS, 0, x.keys[8:]) // behind the first 8 in a's queue
	x.clk.Advance(2*time.Second - time.Millisecond)
	if got := x.match("a"); got.Blocks != 0 {
		t.Fatalf("a TTL after the step back: %+v, want the first 8 ended", got)
	}
	if st := x.stats(); st.Live != 8 || st.Expired != 8 {
		t.Fatalf("stats %+v, want the first 8 expired", st)
	}
	x.clk.Advance(time.Millisecond)
	if st := x.stats(); st.Live != 0 || st.Expired != 16 {
		t.Fatalf("stats %+v, want all 16 expired", st)
	}
}

// TestPredictWhileHidden: nothing is recorded for an engine hidden from
// queries while its mirror is being cleared (the live bit Predict checks).
func TestPredictWhileHidden(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	m := x.ix.Mirror("a")
	x.ix.mu.Lock()
	x.ix.live[m.bank] &^= m.bit // as clear does while it withdraws the claims
	x.ix.mu.Unlock()
	if n := x.ix.Predict("a", specBS, 0, x.keys); n != 0 {
		t.Fatalf("Predict recorded %d keys for a hidden engine", n)
	}
}

// TestPredictStepsLetOthersIn: a long prompt's Predict, and the expiry of
// its entries, take the locks a step of lockStep keys at a time, and
// between steps hold none, so that other requests' Matches and the
// engines' events are not held up for the whole prompt. Meanwhile a Match
// finds no leading run from a half-recorded prompt (its end goes first),
// and once it is done, the result is the same as in one step.
func TestPredictStepsLetOthersIn(t *testing.T) {
	clk := testclock.New(time.Unix(1000, 0))
	ix := NewIndex(IndexConfig{Now: clk.Now})
	ix.SetPredictTTL(2 * time.Second)
	for _, id := range []string{"a", "b"} {
		if _, err := ix.AddEngine(id, MirrorConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := RequestKeys(nil, prompt((4*lockStep+10)*specBS, 7), KeySpec{BlockSize: specBS})
	if err != nil {
		t.Fatal(err)
	}
	steps := 0
	ix.spec.betweenSteps = func() {
		steps++
		requireUnlocked(t, ix, "between Predict's steps")
		for _, m := range ix.MatchKeys(specBS, 0, keys) {
			t.Errorf("after %d steps, a match from a half-recorded prompt: %+v", steps, m)
		}
	}
	if n := ix.Predict("a", specBS, 0, keys); n != len(keys) {
		t.Fatalf("recorded %d keys, want %d", n, len(keys))
	}
	if want := (len(keys)+lockStep-1)/lockStep - 1; steps != want {
		t.Fatalf("%d pauses between steps, want %d", steps, want)
	}
	got := ix.MatchKeys(specBS, 0, keys)
	if len(got) != 1 || got[0].Engine != "a" || got[0].Blocks != len(keys) || got[0].Predicted != len(keys) {
		t.Fatalf("after Predict: %+v, want a holding all %d blocks, predicted", got, len(keys))
	}

	steps = 0
	ix.spec.betweenSteps = func() {
		steps++
		requireUnlocked(t, ix, "between expire's steps")
	}
	clk.Advance(2 * time.Second)
	if got := ix.MatchKeys(specBS, 0, keys); len(got) != 0 {
		t.Fatalf("after the TTL: %+v, want no match", got)
	}
	if want := (len(keys)+lockStep-1)/lockStep - 1; steps != want {
		t.Fatalf("expiry: %d pauses between steps, want %d", steps, want)
	}
	if st := ix.PredictionStats(); st.Live != 0 || st.Expired != uint64(len(keys)) {
		t.Fatalf("stats %+v, want all %d expired", st, len(keys))
	}
}

// TestDropPredictionsInSteps: an engine's entries go lockStep at a time
// when a request there failed (DropPredictions) and when its mirror is
// reset, with no lock held in between, so that an engine with thousands
// of them does not hold up every Match; all of them go either way.
func TestDropPredictionsInSteps(t *testing.T) {
	clk := testclock.New(time.Unix(1000, 0))
	ix := NewIndex(IndexConfig{Now: clk.Now})
	ix.SetPredictTTL(2 * time.Second)
	if _, err := ix.AddEngine("a", MirrorConfig{}); err != nil {
		t.Fatal(err)
	}
	keys, err := RequestKeys(nil, prompt((3*lockStep+5)*specBS, 9), KeySpec{BlockSize: specBS})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		drop func() int
	}{
		{"DropPredictions", func() int { return ix.DropPredictions("a") }},
		{"Reset", func() int { ix.Mirror("a").Reset("test"); return len(keys) }},
	} {
		ix.spec.betweenSteps = nil
		if n := ix.Predict("a", specBS, 0, keys); n != len(keys) {
			t.Fatalf("%s: recorded %d keys, want %d", c.name, n, len(keys))
		}
		before := ix.PredictionStats()
		pauses := 0
		ix.spec.betweenSteps = func() {
			pauses++
			requireUnlocked(t, ix, c.name+", between steps")
		}
		if n := c.drop(); n != len(keys) {
			t.Fatalf("%s: dropped %d, want %d", c.name, n, len(keys))
		}
		if pauses != 3 {
			t.Fatalf("%s: %d pauses, want 3", c.name, pauses)
		}
		if st := ix.PredictionStats(); st.Live != 0 || st.Dropped-before.Dropped != uint64(len(keys)) {
			t.Fatalf("%s: stats %+v after %+v, want all %d dropped", c.name, st, before, len(keys))
		}
	}
}

// requireUnlocked fails the test if the index's lock or the predictions'
// is held, when a step's pause should have released both.
func requireUnlocked(t *testing.T, ix *Index, when string) {
	t.Helper()
	if !ix.mu.TryLock() {
		t.Fatalf("%s: the index's lock is held", when)
	}
	ix.mu.Unlock()
	if !ix.spec.mu.TryLock() {
		t.Fatalf("%s: the predictions' lock is held", when)
	}
	ix.spec.mu.Unlock()
}

// TestPredictionSlotReused: a slot whose entries have all ended keeps its
// key table and fifos for the next ones, so predicting the same keys again
// allocates nothing. A new 10 KiB table each time a slot emptied was the
// largest allocation on a small request's path (events confirm a small
// prompt's few blocks before the next request comes).
func TestPredictionSlotReused(t *testing.T) {
	x := newSpecFixture(t, IndexConfig{})
	cycle := func() {
		if n := x.ix.Predict("b", specBS, 0, x.keys); n != 16 {
			t.Fatalf("Predict recorded %d keys, want 16", n)
		}
		x.ix.DropPredictions("b")
	}
	cycle()
	if allocs := testing.AllocsPerRun(20, cycle); allocs != 0 {
		t.Errorf("a cycle of predicting and dropping allocates %v times, want 0", allocs)
	}
	if st := x.stats(); st.Live != 0 || st.Inserted != 22*16 {
		t.Errorf("stats %+v, want 352 inserted, none live", st)
	}
}
