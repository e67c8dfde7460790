package kvindex

import (
	"fmt"
	"testing"
)

// inGroup is a positional BlockStored of e.stored moved to KV-cache group
// g with spec kind kind: the 12-element array of vLLM #40984 on.
func inGroup(ev arr, g int, kind string) arr {
	out := append(arr{}, ev...)
	out[9] = g
	return append(out, kind, nil)
}

// removedIn is a BlockRemoved of group g.
func removedIn(g int, hashes ...uint64) arr {
	ev := removed(hashes...)
	ev[3] = g
	return ev
}

// asMap is a positional BlockStored as vLLM's map encoding (#42892), with
// extra key/value pairs appended.
func asMap(ev arr, extra ...any) omap {
	m := omap{"type", "BlockStored", "block_hashes", ev[1], "parent_block_hash", ev[2], "token_ids", ev[3],
		"block_size", ev[4], "lora_id", nil, "medium", ev[6], "lora_name", nil, "extra_keys", ev[8], "group_idx", ev[9]}
	return append(m, extra...)
}

// TestHybridCreditsFullAttentionGroup: a prefix counts where the engine's
// full-attention group holds it, whatever that group's index; a
// sliding-window or Mamba group holding more is never credited, and an
// engine whose events name no kind is matched on group 0 as before.
func TestHybridCreditsFullAttentionGroup(t *testing.T) {
	e := newEngineSim(t, "0", 4)
	p := prompt(32, 1) // 8 blocks
	tests := []struct {
		name   string
		events []any
		want   int // blocks credited; 0: not matched
	}{
		{"sliding window group 0, full attention group 1", []any{
			inGroup(e.stored(p, nil, 0, 6), 0, "sliding_window"),
			inGroup(e.stored(p, nil, 0, 2), 1, "full_attention")}, 2},
		{"full attention group 0, sliding window group 1", []any{
			inGroup(e.stored(p, nil, 0, 3), 0, "full_attention"),
			inGroup(e.stored(p, nil, 0, 7), 1, "sliding_window")}, 3},
		{"sliding window only", []any{inGroup(e.stored(p, nil, 0, 8), 0, "sliding_window")}, 0},
		{"mamba group 0, full attention group 2", []any{
			inGroup(e.stored(p, nil, 0, 8), 0, "mamba"),
			inGroup(e.stored(p, nil, 0, 5), 2, "full_attention")}, 5},
		{"MLA (DeepSeek) is full attention", []any{inGroup(e.stored(p, nil, 0, 4), 0, "mla_attention")}, 4},
		{"no kind (vLLM before #40984): group 0", []any{
			e.stored(p, nil, 0, 3), inGroup(e.stored(p, nil, 0, 6), 1, "")}, 3},
		{"unknown kind is as no kind", []any{inGroup(e.stored(p, nil, 0, 4), 0, "unknown")}, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewIndex(IndexConfig{})
			_, f := newTestFeed(t, ix, "h", nil)
			f.Message(nil, 0, batch(tc.events...))
			want := map[string]int{}
			if tc.want > 0 {
				want["h"] = tc.want
			}
			wantMatch(t, ix, Query{Tokens: p}, want)
		})
	}
}

// TestHybridFullAttentionEvicted: once the full-attention group's blocks
// are evicted, an engine whose sliding-window group still holds the
// prompt gets no credit, as vLLM would find no hit; a full-attention block
// evicted mid-prompt ends the credit there.
func TestHybridFullAttentionEvicted(t *testing.T) {
	e := newEngineSim(t, "0", 4)
	p := prompt(32, 1)
	hs := e.hashes(p, nil)
	ix := NewIndex(IndexConfig{})
	_, f := newTestFeed(t, ix, "h", nil)
	e.msg(f, inGroup(e.stored(p, nil, 0, 8), 0, "sliding_window"), inGroup(e.stored(p, nil, 0, 8), 1, "full_attention"))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"h": 8})
	e.msg(f, removedIn(1, hs[5]))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"h": 5})
	// The sliding-window group's removal of the same hashes changes nothing.
	e.msg(f, removedIn(0, hs[1]))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"h": 5})
	e.msg(f, removedIn(1, hs[0]))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
}

// TestHybridClearForgetsKinds: AllBlocksCleared and Reset forget the
// groups' spec kinds with their blocks (the engine may come back as
// another model or release): group 0 named sliding_window before is
// credited again once its events name no kind.
func TestHybridClearForgetsKinds(t *testing.T) {
	for _, how := range []string{"AllBlocksCleared", "Reset"} {
		t.Run(how, func(t *testing.T) {
			e := newEngineSim(t, "0", 4)
			p := prompt(32, 1)
			ix := NewIndex(IndexConfig{})
			m, f := newTestFeed(t, ix, "h", nil)
			e.msg(f, inGroup(e.stored(p, nil, 0, 4), 0, "sliding_window"))
			e.msg(f, e.stored(p, nil, 4, 6)) // no kind: the group's learnt one holds
			wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
			if how == "Reset" {
				m.Reset("")
			} else {
				e.msg(f, arr{"AllBlocksCleared"})
			}
			e.msg(f, e.stored(p, nil, 0, 3))
			wantMatch(t, ix, Query{Tokens: p}, map[string]int{"h": 3})
		})
	}
}

// TestHybridKindChangeResyncs: a group whose events name another spec kind
// than the blocks it holds was reconfigured under the mirror, which starts
// over, as for a changed block size.
func TestHybridKindChangeResyncs(t *testing.T) {
	e := newEngineSim(t, "0", 4)
	p := prompt(32, 1)
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "h", nil)
	e.msg(f, inGroup(e.stored(p, nil, 0, 6), 0, "sliding_window"))
	e.msg(f, inGroup(e.stored(p, nil, 0, 2), 0, "full_attention"))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"h": 2})
	if st := m.Stats(); st.Resyncs["spec_kind"] != 1 || st.Blocks != 2 {
		t.Fatalf("resyncs %v, blocks %d; want one spec_kind resync and 2 blocks", st.Resyncs, st.Blocks)
	}
}

// TestHybridOrphansOnlyInPrefixGroup: blocks of a sliding-window group 0
// whose parent is unknown are not kept for recognition (they would be
// adopted under the prompt's keys and credited); a full-attention group 0's
// are.
func TestHybridOrphansOnlyInPrefixGroup(t *testing.T) {
	e := newEngineSim(t, "0", 4)
	p := prompt(32, 1)
	for _, tc := range []struct {
		kind string
		want uint64 // orphan events kept
	}{{"sliding_window", 0}, {"full_attention", 1}} {
		ix := NewIndex(IndexConfig{})
		m, err := ix.AddEngine("h", MirrorConfig{Hash: EngineHash{Algo: HashSHA256CBOR, Seed: "0"}})
		if err != nil {
			t.Fatal(err)
		}
		f := NewFeed(m, nil, FeedConfig{})
		defer f.Close()
		f.Connected()
		e.msg(f, inGroup(e.stored(p, nil, 2, 4), 0, tc.kind))
		if st := m.Stats(); st.OrphanEvents != tc.want {
			t.Fatalf("%s: %d orphan events kept, want %d", tc.kind, st.OrphanEvents, tc.want)
		}
	}
}

// TestRemoteLocality: a block stored in storage REMOTE to the engine (vLLM
// #48281) is not a hit on it, on any medium, and is counted; a REMOTE
// removal does not remove the engine's own copy of the hash. LOCAL and
// absent locality are the engine's; ownership and session_id are ignored.
func TestRemoteLocality(t *testing.T) {
	e := newEngineSim(t, "0", 4)
	p := prompt(32, 1)
	hs := e.hashes(p, nil)
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "h", nil)
	e.msg(f, asMap(e.stored(p, nil, 0, 8), "locality", "REMOTE", "ownership", "SHARED", "session_id", "s1"),
		asMap(e.storedAt("STORAGE", p, 0, 8), "locality", "REMOTE"))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
	if tiers := tiersOf(t, ix, p, 4); len(tiers) != 0 {
		t.Fatalf("tiers %v after REMOTE stores, want none", tiers)
	}
	e.msg(f, asMap(e.stored(p, nil, 0, 3), "locality", "LOCAL", "session_id", nil), asMap(e.stored(p, nil, 3, 5)))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"h": 5})
	e.msg(f, omap{"type", "BlockRemoved", "block_hashes", arr{hs[1]}, "medium", "GPU", "locality", "remote"})
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"h": 5})
	st := m.Stats()
	if st.Remote != 3 || st.Unapplied()["remote"] != 3 || st.Blocks != 5 {
		t.Fatalf("remote %d (unapplied %d), blocks %d; want 3 REMOTE events and 5 blocks",
			st.Remote, st.Unapplied()["remote"], st.Blocks)
	}
	e.msg(f, omap{"type", "BlockRemoved", "block_hashes", arr{hs[1]}, "medium", "GPU", "locality", "LOCAL"})
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"h": 1})
}

// TestHybridOffloadTiers: offloaded blocks of a hybrid engine continue the
// full-attention group's prefix only; the sliding-window group's
// offloaded blocks are not credited either.
func TestHybridOffloadTiers(t *testing.T) {
	e := newEngineSim(t, "0", 4)
	p := prompt(32, 1)
	ix := NewIndex(IndexConfig{})
	_, f := newTestFeed(t, ix, "h", nil)
	e.msg(f, inGroup(e.stored(p, nil, 0, 8), 0, "sliding_window"), inGroup(e.stored(p, nil, 0, 2), 1, "full_attention"),
		inGroup(e.storedAt("STORAGE", p, 2, 5), 1, "full_attention"), inGroup(e.storedAt("STORAGE", p, 5, 8), 0, "sliding_window"))
	// g holds the prompt's first blocks in storage only, announced from
	// block 0 (no parent) in its full-attention group 1.
	_, fg := newTestFeed(t, ix, "g", nil)
	fg.Message(nil, 0, batch(inGroup(e.stored(p, nil, 0, 8), 0, "sliding_window"),
		inGroup(e.storedAt("STORAGE", p, 0, 3), 1, "full_attention"), inGroup(e.storedAt("STORAGE", p, 0, 8), 0, "sliding_window")))
	if got := fmt.Sprint(tiersOf(t, ix, p, 4)); got != "[h:2/0/3 g:0/0/3]" {
		t.Fatalf("tiers %v, want [h:2/0/3 g:0/0/3]", got)
	}
}
