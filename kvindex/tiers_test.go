package kvindex

import (
	"fmt"
	"testing"
)

// digests are the engine's raw block digests of tokens, which the
// OffloadingConnector's events carry as bytes (never converted to ints).
func (e *engineSim) digests(tokens []uint64) arr {
	ds, err := e.h.BlockHashes(nil, tokens, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	out := arr{}
	for _, d := range ds {
		out = append(out, d[:])
	}
	return out
}

// storedAt is e.stored on another medium.
func (e *engineSim) storedAt(medium string, tokens []uint64, from, to int) arr {
	ev := e.stored(tokens, nil, from, to)
	ev[6] = medium
	return ev
}

// offloaded is an OffloadingConnector BlockStored of older releases: raw
// digests, no parent, no tokens, block size 0.
func offloaded(medium string, digests ...any) arr {
	return arr{"BlockStored", arr(digests), nil, arr{}, 0, nil, medium, nil}
}

// tiersOf is MatchTiers for prompt p as "engine:gpu/cpu/storage" strings.
func tiersOf(t *testing.T, ix *Index, p []uint64, bs int) []string {
	t.Helper()
	keys, err := RequestKeys(nil, p, KeySpec{BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ix.MatchTiers(bs, 0, keys) {
		out = append(out, fmt.Sprintf("%s:%d/%d/%d", m.Engine, m.Blocks[TierGPU], m.Blocks[TierCPU], m.Blocks[TierStorage]))
	}
	return out
}

// TestMirrorTiers: one engine's prefix moves from its GPU cache to its CPU
// tier and to storage, as vLLM's events report it, in both the
// OffloadingConnector's token-less form (applied by engine hash where the
// block is known, counted otherwise) and the self-describing one; the
// lookup continues the GPU prefix through the lower tiers.
func TestMirrorTiers(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 4)
	p := prompt(32, 11) // 8 blocks
	hs, ds := e.hashes(p, nil), e.digests(p)
	steps := []struct {
		name   string
		events []any
		want   []string
		cpu    int // blocks in e1's CPU tier after the step
		unk    uint64
	}{
		{"GPU stores blocks 0-3", []any{e.stored(p, nil, 0, 4)}, []string{"e1:4/0/0"}, 0, 0},
		{"CPU copies of 0-3 without tokens", []any{offloaded("CPU", ds[0], ds[1], ds[2], ds[3])}, []string{"e1:4/0/0"}, 4, 0},
		{"GPU evicts 2-3", []any{removed(hs[2], hs[3])}, []string{"e1:2/2/0"}, 4, 0},
		{"self-describing CPU store of 4-5", []any{e.storedAt("CPU", p, 4, 6)}, []string{"e1:2/4/0"}, 6, 0},
		{"FS (v0.26 storage) store of 6", []any{e.storedAt("FS", p, 6, 7)}, []string{"e1:2/4/1"}, 6, 0},
		{"token-less CPU store of an unknown block", []any{offloaded("cpu", ds[7])}, []string{"e1:2/4/1"}, 6, 1},
		{"CPU removes 3", []any{arr{"BlockRemoved", arr{ds[3]}, "CPU", 0}}, []string{"e1:2/1/0"}, 5, 1},
		{"GPU stores 3 again", []any{e.stored(p, nil, 3, 4)}, []string{"e1:2/1/0"}, 5, 1},
	}
	for _, s := range steps {
		e.msg(f, s.events...)
		checkTiers(t, ix)
		got := tiersOf(t, ix, p, 4)
		st := m.Stats()
		if fmt.Sprint(got) != fmt.Sprint(s.want) || st.TierBlocks[TierCPU] != s.cpu || st.TierUnknown != s.unk {
			t.Fatalf("%s: tiers %v, CPU blocks %d, unknown %d; want %v, %d, %d", s.name, got, st.TierBlocks[TierCPU], st.TierUnknown, s.want, s.cpu, s.unk)
		}
	}
	// The GPU count is MatchKeys's, unchanged by the lower tiers.
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 2})
	if st := m.Stats(); st.TierBlocks[TierStorage] != 1 || st.OtherTier != 0 || st.Unapplied()["tier_unknown_block"] != 1 {
		t.Fatalf("stats %+v", st)
	}

	// A medium nobody defined is not guessed at.
	e.msg(f, e.storedAt("LMCACHE_REMOTE", p, 0, 1))
	if st := m.Stats(); st.OtherTier != 1 {
		t.Fatalf("unknown medium: OtherTier %d", st.OtherTier)
	}

	// An engine holding the prefix only on CPU is listed too.
	_, f2 := newTestFeed(t, ix, "e2", nil)
	e2 := newEngineSim(t, "0", 4)
	e2.msg(f2, e2.storedAt("CPU", p, 0, 8))
	if got := tiersOf(t, ix, p, 4); fmt.Sprint(got) != fmt.Sprint([]string{"e1:2/1/0", "e2:0/8/0"}) {
		t.Fatalf("with a CPU-only engine: %v", got)
	}
	// Match, what routing asks, reports the same continuations, from the
	// tokens as from the keys.
	keys, err := Keys(nil, p, 4, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []Query{{Tokens: p}, {Tokens: p, Keys: keys, KeysBlockSize: 4}} {
		found, err := ix.Match(q)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, x := range found {
			got = append(got, fmt.Sprintf("%s:%d/%d/%d", x.Engine, x.Blocks, x.CPUBlocks, x.StorageBlocks))
		}
		if fmt.Sprint(got) != fmt.Sprint([]string{"e1:2/1/0", "e2:0/8/0"}) {
			t.Fatalf("Match(keys %v): %v", q.Keys != nil, got)
		}
	}

	// A reset drops the lower tiers with the rest.
	e.msg(f, arr{"AllBlocksCleared"})
	if st := m.Stats(); st.TierBlocks != [numTiers]int{} || st.Blocks != 0 {
		t.Fatalf("after AllBlocksCleared: %+v", st.TierBlocks)
	}
	if got := tiersOf(t, ix, p, 4); fmt.Sprint(got) != fmt.Sprint([]string{"e2:0/8/0"}) {
		t.Fatalf("after e1's reset: %v", got)
	}
}

func TestTierOf(t *testing.T) {
	for _, c := range []struct {
		medium string
		want   Tier
		ok     bool
	}{
		{"", TierGPU, true}, {"GPU", TierGPU, true}, {"gpu", TierGPU, true},
		{"CPU", TierCPU, true}, {"cpu", TierCPU, true},
		{"STORAGE", TierStorage, true}, {"FS", TierStorage, true}, {"OBJ", TierStorage, true},
		{"LocalDisk", 0, false}, {"nvme?", 0, false},
	} {
		if got, ok := tierOf(c.medium); got != c.want || ok != c.ok {
			t.Errorf("tierOf(%q) = %v, %v; want %v, %v", c.medium, got, ok, c.want, c.ok)
		}
	}
}

// checkTiers fails unless every mirror's offload tiers agree with
// themselves: each block's key counted once in byKey, nothing else there,
// and no tier over its bound.
func checkTiers(t *testing.T, ix *Index) {
	t.Helper()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for _, m := range ix.slots {
		if m == nil {
			continue
		}
		for i := range m.tiers {
			set := &m.tiers[i]
			want := make(map[uint64]uint32)
			for _, e := range set.byHash {
				if e.refs == 0 {
					t.Fatalf("%s tier %d: an entry without references", m.id, i+1)
				}
				want[e.key]++
			}
			if fmt.Sprint(want) != fmt.Sprint(set.byKey) || set.len() > maxLowerBlocks {
				t.Fatalf("%s tier %d: byKey %v, entries give %v", m.id, i+1, set.byKey, want)
			}
			claimed := 0
			ix.tierBanks[i][m.bank].each(func(k, bits uint64) {
				if bits&m.bit != 0 {
					claimed++
					if set.byKey[k] == 0 {
						t.Fatalf("%s tier %d: the bank claims key %#x the tier lacks", m.id, i+1, k)
					}
				}
			})
			if claimed != len(set.byKey) {
				t.Fatalf("%s tier %d: the bank claims %d keys, the tier holds %d", m.id, i+1, claimed, len(set.byKey))
			}
		}
	}
}

// BenchmarkMatchTiers128k32Engines is BenchmarkMatchKeys128k32Engines
// with each engine's matched prefix half on GPU and half offloaded to
// its CPU tier (announced the OffloadingConnector's way, by hash): the
// cost of the per-tier lookup over the GPU one.
func BenchmarkMatchTiers128k32Engines(b *testing.B) {
	ix, keys := matchFixture(b)
	sim := newEngineSim(b, "0", 16)
	hs := sim.hashes(prompt(128<<10, 77), nil)
	for _, m := range ix.slots {
		if m == nil {
			continue
		}
		n := 0
		for _, g := range ix.MatchKeys(16, 0, keys) {
			if g.Engine == m.id {
				n = g.Blocks
			}
		}
		cpu := Event{Kind: EventBlockStored, BlockHashes: hs[:n], Medium: "CPU"}
		gone := Event{Kind: EventBlockRemoved, BlockHashes: hs[n/2 : n], Medium: "GPU"}
		m.wmu.Lock()
		m.apply(1<<41, &Batch{Events: []Event{cpu, gone}})
		m.wmu.Unlock()
	}
	got := ix.MatchTiers(16, 0, keys)
	if len(got) != 32 || got[0].Total() != len(keys) || got[0].Blocks[TierCPU] != len(keys)-len(keys)/2 {
		b.Fatalf("fixture: %d matches, first %+v", len(got), got[0])
	}
	b.ReportAllocs()
	for b.Loop() {
		ix.MatchTiers(16, 0, keys)
	}
}

// TestMatchTiersOracle: across banks of engines (70 engines: two banks),
// with GPU prefixes, CPU and storage runs of many lengths, MatchTiers
// agrees with a walk of each engine's own tier maps.
func TestMatchTiersOracle(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	p := prompt(4*24, 5) // 24 blocks
	for i := range 70 {
		_, f := newTestFeed(t, ix, fmt.Sprintf("e%02d", i), nil)
		e := newEngineSim(t, "0", 4)
		g, c, s := i%5, (i/5)%4*3, i%3*2
		if g > 0 {
			e.msg(f, e.stored(p, nil, 0, g))
		}
		if c > 0 && i%2 == 0 {
			e.msg(f, e.storedAt("CPU", p, g, g+c))
		}
		if s > 0 {
			e.msg(f, e.storedAt("STORAGE", p, g+c, min(g+c+s, 24)))
		}
	}
	keys, err := RequestKeys(nil, p, KeySpec{BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][numTiers]int{}
	for _, m := range ix.MatchTiers(4, 0, keys) {
		got[m.Engine] = m.Blocks
	}
	gpu := map[string]int{}
	for _, m := range ix.MatchKeys(4, 0, keys) {
		gpu[m.Engine] = m.Blocks
	}
	want := map[string][numTiers]int{}
	ix.mu.RLock()
	for _, m := range ix.slots {
		if m == nil {
			continue
		}
		var b [numTiers]int
		b[TierGPU] = gpu[m.id]
		i := b[TierGPU]
		for tr := TierCPU; tr < numTiers; tr++ {
			for i < len(keys) && m.lower(tr).byKey[keys[i]] > 0 {
				i++
				b[tr]++
			}
		}
		if b != [numTiers]int{} {
			want[m.id] = b
		}
	}
	ix.mu.RUnlock()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("MatchTiers %v\nwant %v", got, want)
	}
	if len(want) < 40 {
		t.Fatalf("only %d engines hold anything: the test shows little", len(want))
	}
}
