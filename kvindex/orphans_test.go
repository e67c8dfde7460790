package kvindex

import (
	"context"
	"maps"
	"slices"
	"testing"
)

// newHashedFeed is newTestFeed for a mirror that knows the engines'
// hashing.
func newHashedFeed(t testing.TB, ix *Index, id string, h EngineHash) (*Mirror, *Feed) {
	t.Helper()
	m, err := ix.AddEngine(id, MirrorConfig{Hash: h})
	if err != nil {
		t.Fatal(err)
	}
	f := NewFeed(m, nil, FeedConfig{})
	t.Cleanup(f.Close)
	f.Connected()
	return m, f
}

// lateJoin is an engine that cached a 10-block system prompt before the
// gateway subscribed, then stored blocks of a request extending it (a new
// question after the prompt), which the gateway does see: an event whose
// parent it never saw.
type lateJoin struct {
	e              *engineSim
	system, first  []uint64 // the system prompt; it + the first question
	second, direct []uint64 // it + another question; it + a direct request's
}

func newLateJoin(t *testing.T) *lateJoin {
	const bs = 4
	e := newEngineSim(t, "0", bs)
	system := prompt(10*bs, 1)
	with := func(salt uint64, n int) []uint64 { return slices.Concat(system, prompt(n, salt)) }
	return &lateJoin{e: e, system: system, first: with(2, 3*bs), second: with(3, 2*bs), direct: with(4, 2*bs)}
}

func TestLateJoinRecognisesHeldPrefix(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newHashedFeed(t, ix, "e1", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	lj := newLateJoin(t)
	// Blocks 10-12 of the first request: their parent, block 9 of the
	// system prompt, was stored before the subscription.
	lj.e.msg(f, lj.e.stored(lj.first, nil, 10, 13))
	st := m.Stats()
	if st.OrphanEvents != 1 || st.Orphans != 4 || st.Blocks != 0 || st.UnknownParent != 0 {
		t.Fatalf("after the orphan event: %+v", st)
	}
	// Another question after the same system prompt: the parent names the
	// whole prompt, so the engine holds all 10 blocks.
	wantMatch(t, ix, Query{Tokens: lj.second}, map[string]int{"e1": 10})
	// The request the engine stored: up to its last block.
	wantMatch(t, ix, Query{Tokens: lj.first}, map[string]int{"e1": 13})
	st = m.Stats()
	if st.Recognized != 13 || st.Orphans != 0 || st.Blocks != 13 || ix.orphaned.Load() != 0 {
		t.Fatalf("after recognition: %+v (index orphans %d)", st, ix.orphaned.Load())
	}
	// The engine's next event chains to the adopted blocks as to any.
	lj.e.msg(f, lj.e.stored(lj.second, nil, 10, 12))
	wantMatch(t, ix, Query{Tokens: lj.second}, map[string]int{"e1": 12})
	if st := m.Stats(); st.OrphanEvents != 1 || st.Blocks != 15 {
		t.Fatalf("the chained event was not applied: %+v", st)
	}
	// And its removals remove adopted blocks.
	hs := lj.e.hashes(lj.system, nil)
	lj.e.msg(f, removed(hs[5]))
	wantMatch(t, ix, Query{Tokens: lj.second}, map[string]int{"e1": 5})
	if st := m.Stats(); st.RemovedUnknown != 0 {
		t.Fatalf("a removal of an adopted block was not found: %+v", st)
	}
}

func TestLateJoinWithoutEngineHashing(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	lj := newLateJoin(t)
	lj.e.msg(f, lj.e.stored(lj.first, nil, 10, 13))
	wantMatch(t, ix, Query{Tokens: lj.first}, map[string]int{})
	st := m.Stats()
	if st.UnknownParent != 1 || st.Unchainable != 3 || st.Orphans != 0 || st.Unapplied()["unknown_parent"] != 1 {
		t.Fatalf("orphan event not counted as unapplied: %+v", st)
	}
}

func TestOrphansOfADirectRequestChain(t *testing.T) {
	// Orphan events may chain among themselves before a prompt recognises
	// any: the direct request's later blocks, stored step by step.
	ix := NewIndex(IndexConfig{})
	m, f := newHashedFeed(t, ix, "e1", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	lj := newLateJoin(t)
	lj.e.msg(f, lj.e.stored(lj.direct, nil, 10, 11))
	lj.e.msg(f, lj.e.stored(lj.direct, nil, 11, 12))
	if st := m.Stats(); st.OrphanEvents != 2 || st.Orphans != 3 {
		t.Fatalf("%+v", st)
	}
	wantMatch(t, ix, Query{Tokens: lj.direct}, map[string]int{"e1": 12})
}

func TestOrphansRemovedClearedEvicted(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newHashedFeed(t, ix, "e1", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	lj := newLateJoin(t)
	lj.e.msg(f, lj.e.stored(lj.first, nil, 10, 13))
	hs := lj.e.hashes(lj.first, nil)
	// An evicted orphan is no longer claimed, and its removal is no
	// "removal of an unknown block".
	lj.e.msg(f, removed(hs[12]))
	if st := m.Stats(); st.Orphans != 3 || st.RemovedUnknown != 0 {
		t.Fatalf("after removing an orphan: %+v", st)
	}
	wantMatch(t, ix, Query{Tokens: lj.first}, map[string]int{"e1": 12})

	lj.e.msg(f, lj.e.stored(lj.direct, nil, 10, 12))
	lj.e.msg(f, arr{"AllBlocksCleared"})
	if st := m.Stats(); st.Orphans != 0 || ix.orphaned.Load() != 0 {
		t.Fatalf("a clear kept orphans: %+v (index %d)", st, ix.orphaned.Load())
	}
	wantMatch(t, ix, Query{Tokens: lj.direct}, map[string]int{})

	// Bounded by the engine's capacity, oldest first.
	m.SetCapacity(4)
	lj.e.msg(f, lj.e.stored(lj.first, nil, 10, 13))  // parent + 3 blocks
	lj.e.msg(f, lj.e.stored(lj.direct, nil, 10, 12)) // same parent, 2 more: evicts 2
	if st := m.Stats(); st.Orphans != 4 || st.OrphansEvicted != 2 || ix.orphaned.Load() != 4 {
		t.Fatalf("capacity: %+v (index %d)", st, ix.orphaned.Load())
	}
	ix.RemoveEngine("e1")
	if ix.orphaned.Load() != 0 {
		t.Fatalf("a removed engine left %d orphans counted", ix.orphaned.Load())
	}
}

func TestSetHashDropsOrphans(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newHashedFeed(t, ix, "e1", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	lj := newLateJoin(t)
	lj.e.msg(f, lj.e.stored(lj.first, nil, 10, 13))
	m.SetHash(EngineHash{Algo: HashSHA256CBOR, Seed: "1"})
	if st := m.Stats(); st.Orphans != 0 || ix.orphaned.Load() != 0 {
		t.Fatalf("%+v", st)
	}
	// Kept under the new (wrong) seed, they are never recognised.
	lj.e.msg(f, lj.e.stored(lj.first, nil, 10, 13))
	wantMatch(t, ix, Query{Tokens: lj.first}, map[string]int{})
}

func TestTrustedFollowsUnappliedShare(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 4)
	if !m.Trusted() {
		t.Fatal("a new mirror is not trusted")
	}
	// A late gateway without the engines' hashing: every event extends a
	// prefix stored before it subscribed.
	for i := range 20 {
		p := prompt(16, uint64(100+i))
		e.msg(f, e.stored(p, nil, 2, 4))
	}
	if m.Trusted() || m.Stats().Trusted {
		t.Fatalf("20 of 20 events unapplied, still trusted: %+v", m.Stats())
	}
	// Events that apply again (new prompts from their first block) win it
	// back once they are the larger part of the recent ones.
	for i := range 21 {
		e.msg(f, e.stored(prompt(16, uint64(200+i)), nil, 0, 4))
	}
	if !m.Trusted() {
		t.Fatalf("applied events did not restore trust: %+v", m.Stats())
	}
	// Orphans kept for recognition are not failures.
	ix2 := NewIndex(IndexConfig{})
	m2, f2 := newHashedFeed(t, ix2, "e2", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	for i := range 20 {
		e.msg(f2, e.stored(prompt(16, uint64(300+i)), nil, 2, 4))
	}
	if !m2.Trusted() {
		t.Fatalf("orphans kept for recognition made the mirror untrusted: %+v", m2.Stats())
	}
}

func TestOrphanSetBounded(t *testing.T) {
	var o orphanSet
	evicted := 0
	for i := range 10000 {
		_, ev := o.add(uint64(i), 100)
		evicted += ev
		if i%3 == 0 {
			o.remove(uint64(i))
		}
	}
	if o.len() > 100 || len(o.g.fifoH) > 2*fifoLimit(100) {
		t.Fatalf("set %d, fifo %d", o.len(), len(o.g.fifoH))
	}
	// The newest survive.
	for i := 9999; i > 9990; i-- {
		if i%3 != 0 && !o.has(uint64(i)) {
			t.Fatalf("newest entry %d evicted", i)
		}
	}
	if evicted == 0 {
		t.Fatal("nothing evicted")
	}
	if a, _ := o.add(9998, 100); a != 0 {
		t.Fatal("a present hash was added again")
	}
}

func TestRecognizeSkipsOtherBlockSizesAndGroups(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	_, f := newHashedFeed(t, ix, "e1", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	lj := newLateJoin(t)
	// An orphan in another group (a hybrid model's sliding-window layers)
	// is counted, not kept.
	ev := lj.e.stored(lj.first, nil, 10, 13)
	ev[9] = 1
	lj.e.msg(f, ev)
	if st := ix.Mirror("e1").Stats(); st.UnknownParent != 1 || st.Orphans != 0 {
		t.Fatalf("%+v", st)
	}
	wantMatch(t, ix, Query{Tokens: lj.first, Group: 1}, map[string]int{})
}

// buffered is an engine's replay buffer: every message it still holds,
// sent oldest first from the requested start, as vLLM's ROUTER does.
type buffered struct {
	msgs  map[uint64][]byte
	holes map[uint64]bool // held but not sent: a hole in the replay
}

func (b *buffered) replay(ctx context.Context, start uint64, fn func(uint64, []byte) error) error {
	seqs := slices.Sorted(maps.Keys(b.msgs))
	for _, s := range seqs {
		if s < start || b.holes[s] {
			continue
		}
		if err := fn(s, b.msgs[s]); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// TestFeedBackfill: a gateway subscribing to an engine that published
// before learns, from the replay buffer, every block stored in it and not
// removed, even when the buffer no longer starts at 0; after a hole in the
// buffer it keeps what came after the hole. Live messages the replay
// delivered already are skipped; an engine that restarted is not taken
// for them.
func TestFeedBackfill(t *testing.T) {
	for _, tc := range []struct {
		name       string
		oldest     uint64 // first seq still buffered
		hole       bool
		recognized bool // the system prompt is known by recognition, not chaining
	}{
		{"whole history buffered", 0, false, false},
		{"buffer starts later: older parents are orphans", 2, false, true},
		{"hole in the buffer: the window starts after it", 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(IndexConfig{})
			lj := newLateJoin(t)
			e := lj.e
			other := prompt(32, 99)
			buf := &buffered{msgs: map[uint64][]byte{}, holes: map[uint64]bool{}}
			// seq 0-1: the system prompt in two steps; 2: a prompt stored
			// then 3: removed; 4: the first request's blocks after it.
			buf.msgs[0] = batch(e.stored(lj.system, nil, 0, 5))
			buf.msgs[1] = batch(e.stored(lj.system, nil, 5, 10))
			buf.msgs[2] = batch(e.stored(other, nil, 0, 8))
			buf.msgs[3] = batch(removed(e.hashes(other, nil)...))
			buf.msgs[4] = batch(e.stored(lj.first, nil, 10, 13))
			for s := range tc.oldest {
				delete(buf.msgs, s)
			}
			if tc.hole {
				buf.holes[1] = true
			}
			m, err := ix.AddEngine("e1", MirrorConfig{Hash: EngineHash{Algo: HashSHA256CBOR, Seed: "0"}})
			if err != nil {
				t.Fatal(err)
			}
			f := NewFeed(m, buf.replay, FeedConfig{Backfill: true})
			defer f.Close()
			f.Connected()
			// Messages 3 and 4 were published after the subscription
			// began: they arrive live too, then the first new one.
			f.Message(nil, 3, buf.msgs[3])
			f.Message(nil, 4, buf.msgs[4])
			f.Message(nil, 5, batch(e.stored(lj.second, nil, 10, 12)))
			if got := matchOf(t, ix, Query{Tokens: lj.second})["e1"]; got != 12 {
				t.Fatalf("match %d, want 12; stats %+v", got, m.Stats())
			}
			if got := matchOf(t, ix, Query{Tokens: other})["e1"]; got != 0 {
				t.Fatalf("a block removed within the buffer is held: %d", got)
			}
			st := m.Stats()
			if st.Backfills != 1 || st.Backfilled != uint64(5-tc.oldest-map[bool]uint64{true: 1}[tc.hole]) ||
				(st.Resyncs["backfill"] == 1) != tc.hole || (st.Recognized > 0) != tc.recognized ||
				st.Resyncs["restart"] != 0 || st.LastSeq != 5 {
				t.Fatalf("backfill stats %+v", st)
			}
			// An engine restart numbers from 0 again: not a duplicate.
			f.Message(nil, 0, batch(e.stored(other, nil, 0, 2)))
			if st := m.Stats(); st.Resyncs["restart"] != 1 {
				t.Fatalf("a restart taken for a duplicate: %+v", st)
			}
		})
	}
}

func TestFeedBackfillRestartRightAfter(t *testing.T) {
	// The engine restarted between the replay and the first live
	// message: seq 1 again, another payload.
	ix := NewIndex(IndexConfig{})
	e := newEngineSim(t, "0", 4)
	p := prompt(16, 5)
	buf := &buffered{msgs: map[uint64][]byte{0: batch(e.stored(p, nil, 0, 2)), 1: batch(e.stored(p, nil, 2, 4))}}
	m, _ := ix.AddEngine("e1", MirrorConfig{})
	f := NewFeed(m, buf.replay, FeedConfig{Backfill: true})
	defer f.Close()
	f.Connected()
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 4})
	f.Message(nil, 1, batch(e.stored(prompt(16, 6), nil, 0, 1)))
	if st := m.Stats(); st.Resyncs["restart"] != 1 {
		t.Fatalf("%+v", st)
	}
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
}

// TestOrphanNotesLoRA: an adapter first seen in an orphan event is known
// to the index, so its requests are matched (and recognised) under it.
func TestOrphanNotesLoRA(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	_, f := newHashedFeed(t, ix, "e1", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	e := newEngineSim(t, "0", 4)
	p := prompt(16, 9)
	extra := RequestExtraKeys("sql-adapter", "", 4)
	ev := e.stored(p, extra, 2, 4)
	ev[7] = "sql-adapter"
	e.msg(f, ev)
	if !ix.IsLoRA("sql-adapter") {
		t.Fatal("the adapter of an orphan event is unknown to the index")
	}
	wantMatch(t, ix, Query{Tokens: p, LoRAName: "sql-adapter"}, map[string]int{"e1": 4})
}
