package kvindex

import "testing"

// TestMirrorRank: a mirror following data-parallel rank 1 applies batches
// of rank 1 and batches without a rank, and counts (without applying) a
// batch of another rank, as when its port reaches rank 0's publisher. A
// mirror without a rank applies every batch, whatever its rank.
func TestMirrorRank(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, err := ix.AddEngine("e#1", MirrorConfig{Rank: 1, HasRank: true})
	if err != nil {
		t.Fatal(err)
	}
	f := NewFeed(m, nil, FeedConfig{})
	t.Cleanup(f.Close)
	f.Connected()
	any0, fa := newTestFeed(t, ix, "any", nil)
	e := newEngineSim(t, "0", 4)
	p := prompt(16, 5) // 4 blocks
	ranked := func(rank any, events ...any) []byte { return payload(arr{1.0, arr(events), rank}) }
	steps := []struct {
		rank      any
		from, to  int
		wantRank  int // blocks matched on e#1 after the batch
		wantWrong uint64
	}{
		{rank: 0, from: 0, to: 1, wantRank: 0, wantWrong: 1},
		{rank: 1, from: 0, to: 2, wantRank: 2, wantWrong: 1},
		{rank: nil, from: 2, to: 3, wantRank: 3, wantWrong: 1},
		{rank: 2, from: 3, to: 4, wantRank: 3, wantWrong: 2},
	}
	for i, s := range steps {
		ev := e.stored(p, nil, s.from, s.to)
		f.Message([]byte("kv"), uint64(i), ranked(s.rank, ev))
		fa.Message([]byte("kv"), uint64(i), ranked(s.rank, ev))
		got := matchOf(t, ix, Query{Tokens: p})
		if got["e#1"] != s.wantRank {
			t.Fatalf("step %d (rank %v): e#1 matches %d blocks, want %d", i, s.rank, got["e#1"], s.wantRank)
		}
		if st := m.Stats(); st.WrongRank != s.wantWrong || st.Unapplied()["wrong_rank"] != s.wantWrong || st.LastSeq != uint64(i) {
			t.Fatalf("step %d: stats %+v, want %d wrong-rank batches", i, st, s.wantWrong)
		}
	}
	if got := matchOf(t, ix, Query{Tokens: p})["any"]; got != 4 {
		t.Fatalf("rank-less mirror matches %d blocks", got)
	}
	if st := any0.Stats(); st.WrongRank != 0 || st.Stored != 4 {
		t.Fatalf("rank-less mirror stats %+v", st)
	}
}
