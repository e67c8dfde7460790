package kvindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestKeys(t *testing.T) {
	p := prompt(40, 1)
	k16, err := Keys(nil, p, 16, 0, nil)
	if err != nil || len(k16) != 2 {
		t.Fatalf("Keys = %v, %v; want 2 keys (partial tail not keyed)", k16, err)
	}
	if _, err := Keys(nil, p, 0, 0, nil); err == nil {
		t.Fatal("block size 0 accepted")
	}
	if _, err := Keys(nil, p, 16, 0, [][]any{{struct{}{}}}); err == nil {
		t.Fatal("unkeyable extra key accepted")
	}
	distinct := map[uint64]string{}
	note := func(name string, keys []uint64) {
		for _, k := range keys[:1] {
			if other, dup := distinct[k]; dup {
				t.Errorf("%s and %s share a first key", name, other)
			}
			distinct[k] = name
		}
	}
	note("plain", k16)
	for name, extra := range map[string][][]any{
		"lora":      RequestExtraKeys("a", "", 2),
		"salt":      RequestExtraKeys("", "s", 2), // vLLM's keys are untagged: a salt "a" would equal lora "a"
		"lora+salt": RequestExtraKeys("a", "b", 2),
		"salt+lora": RequestExtraKeys("b", "a", 2),
		"int":       {{int64(5)}},
		"bytes":     {{[]byte("a")}},
		"nested":    {{[]any{"a"}}},
		"two":       {{"a", "a"}},
		"nil":       {{nil}},
	} {
		k, err := Keys(nil, p, 16, 0, extra)
		if err != nil {
			t.Fatal(err)
		}
		note(name, k)
	}
	g1, _ := Keys(nil, p, 16, 1, nil)
	note("group 1", g1)
	// Equal values of different Go integer types key alike, as vLLM's CBOR
	// hashes them alike.
	a, _ := Keys(nil, p, 16, 0, [][]any{{int64(7), "x"}})
	b, _ := Keys(nil, p, 16, 0, [][]any{{uint64(7), "x"}})
	c, _ := Keys(nil, p, 16, 0, [][]any{{7, "x"}})
	if a[0] != b[0] || a[0] != c[0] {
		t.Fatal("int64/uint64/int extra keys key differently")
	}
	// An empty extra tuple is no extra keys, as in vLLM.
	e, _ := Keys(nil, p, 16, 0, [][]any{{}})
	if e[0] != k16[0] || e[1] != k16[1] {
		t.Fatal("empty extra keys changed the key")
	}
	for _, c := range [][2]string{{"", ""}, {"l", ""}, {"", "s"}, {"l", "s"}} {
		want, _ := Keys(nil, p, 8, 2, RequestExtraKeys(c[0], c[1], len(p)/8))
		got, err := RequestKeys(nil, p, KeySpec{BlockSize: 8, Group: 2, LoRAName: c[0], CacheSalt: c[1]})
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("requestKeys%v = %v, %v; Keys gives %v", c, got, err, want)
		}
	}
	if got := RequestExtraKeys("", "", 3); got != nil {
		t.Fatalf("RequestExtraKeys without lora or salt = %v", got)
	}
	// Continuing from any number of known keys gives the whole prompt's.
	for _, c := range [][2]string{{"", ""}, {"l", "s"}} {
		whole, _ := RequestKeys(nil, p, KeySpec{BlockSize: 8, Group: 2, LoRAName: c[0], CacheSalt: c[1]})
		for k := 0; k <= len(whole); k++ {
			got, err := ContinueRequestKeys(append([]uint64(nil), whole[:k]...), p, KeySpec{BlockSize: 8, Group: 2, LoRAName: c[0], CacheSalt: c[1]})
			if err != nil || fmt.Sprint(got) != fmt.Sprint(whole) {
				t.Fatalf("%v from %d known keys: %v, %v; want %v", c, k, got, err, whole)
			}
		}
		if _, err := ContinueRequestKeys(append(whole, 1), p, KeySpec{BlockSize: 8, Group: 2, LoRAName: c[0], CacheSalt: c[1]}); err == nil {
			t.Fatalf("%v: more keys known than the prompt has blocks was accepted", c)
		}
	}
}

// modelEngine is the reference a mirror must agree with: the set of
// engine block hashes with reference counts, fed by the same operations.
type modelEngine struct {
	refs map[uint64]int
}

// TestIndexAgainstModel applies random stores, removals and clears from
// prompts sharing prefixes to several engines, concurrently with queries,
// and checks the index against a straightforward model afterwards.
func TestIndexAgainstModel(t *testing.T) {
	const engines, prompts, blocks, bs = 4, 12, 10, 4
	ix := NewIndex(IndexConfig{})
	// Prompts share prefixes of 0-5 blocks with prompt 0.
	base := prompt(blocks*bs, 999)
	ps := make([][]uint64, prompts)
	for j := range ps {
		ps[j] = append(append([]uint64{}, base[:(j%6)*bs]...), prompt((blocks-j%6)*bs, uint64(j))...)
	}
	sim := newEngineSim(t, "0", bs)
	hs := make([][]uint64, prompts)
	for j := range ps {
		hs[j] = sim.hashes(ps[j], nil)
	}
	models := make([]*modelEngine, engines)
	var writers, readers sync.WaitGroup
	var stop atomic.Bool
	for r := 0; r < 3; r++ {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for i := 0; !stop.Load(); i++ {
				q := Query{Tokens: ps[i%prompts]}
				if _, err := ix.Match(q); err != nil {
					t.Error(err)
					return
				}
				_ = ix.Stats()
			}
		}()
	}
	for w := 0; w < engines; w++ {
		md := &modelEngine{refs: map[uint64]int{}}
		models[w] = md
		_, f := newTestFeed(t, ix, fmt.Sprintf("e%d", w), nil)
		writers.Add(1)
		go func() {
			defer writers.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			e := newEngineSim(t, "0", bs)
			for op := 0; op < 1500; op++ {
				j := rng.IntN(prompts)
				switch r := rng.IntN(1000); {
				case r < 600:
					// Half the stores start at the root, so most chain.
					from := 0
					if rng.IntN(2) == 0 {
						from = rng.IntN(blocks)
					}
					to := from + 1 + rng.IntN(blocks-from)
					e.msg(f, e.stored(ps[j], nil, from, to))
					if from == 0 || md.refs[hs[j][from-1]] > 0 {
						for _, h := range hs[j][from:to] {
							md.refs[h]++
						}
					}
				case r < 995:
					// Half the removals hit a held block, often one
					// stored more than once.
					h := hs[j][rng.IntN(blocks)]
					if rng.IntN(2) == 0 {
						for k, c := range md.refs {
							if c > 0 {
								h = k
								break
							}
						}
					}
					e.msg(f, removed(h))
					if md.refs[h] > 0 {
						md.refs[h]--
					}
				default:
					e.msg(f, arr{"AllBlocksCleared"})
					clear(md.refs)
				}
			}
		}()
	}
	writers.Wait()
	stop.Store(true)
	readers.Wait()
	checkConsistent(t, ix)
	nonEmpty := 0
	for j := range ps {
		want := map[string]int{}
		for w, md := range models {
			n := 0
			for n < blocks && md.refs[hs[j][n]] > 0 {
				n++
			}
			if n > 0 {
				want[fmt.Sprintf("e%d", w)] = n
			}
		}
		wantMatch(t, ix, Query{Tokens: ps[j]}, want)
		nonEmpty += len(want)
	}
	// Guard against a vacuous run: the random ops must leave engines
	// holding prefixes.
	if nonEmpty < engines {
		t.Fatalf("only %d (engine, prompt) matches: the test exercises nothing", nonEmpty)
	}
	t.Logf("%d (engine, prompt) pairs matched", nonEmpty)
	for w, md := range models {
		held := 0
		for _, r := range md.refs {
			if r > 0 {
				held++
			}
		}
		if st := ix.Mirror(fmt.Sprintf("e%d", w)).Stats(); st.Blocks != held {
			t.Errorf("e%d holds %d blocks, model %d", w, st.Blocks, held)
		}
	}
}

// TestIndexNoStaleClaimsAfterReset checks the index itself (not only
// Match) is left without a claim of a reset engine.
func TestIndexNoStaleClaimsAfterReset(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	_, f2 := newTestFeed(t, ix, "e2", nil)
	e := newEngineSim(t, "0", 2)
	p := prompt(20000, 3) // 10000 blocks: more than one clearing chunk
	e.msg(f, e.stored(p, nil, 0, 10000))
	e.msg(f2, e.stored(p, nil, 0, 3))
	m.Reset("")
	ix.mu.RLock()
	n, keys := 0, 0
	for _, bank := range ix.banks {
		bank.each(func(_, v uint64) {
			if v&m.bit != 0 {
				n++
			}
		})
		keys += bank.len()
	}
	ix.mu.RUnlock()
	if keys != 3 {
		t.Errorf("index holds %d keys, want e2's 3", keys)
	}
	if n != 0 {
		t.Fatalf("%d claims of a reset engine left", n)
	}
	if st := m.Stats(); st.Resyncs["manual"] != 1 || st.Blocks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMirrorBlockSizeChange(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	p := prompt(64, 4)
	e16 := newEngineSim(t, "0", 16)
	e16.msg(f, e16.stored(p, nil, 0, 4))
	e8 := newEngineSim(t, "0", 8)
	e8.seq = e16.seq
	e8.msg(f, e8.stored(p, nil, 0, 8))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 8})
	if st := m.Stats(); st.BlockSize != 8 || st.Resyncs["block_size"] != 1 || st.Blocks != 8 {
		t.Fatalf("stats %+v", st)
	}
}

// TestMirrorEventStepsLetReadersIn: a mirror applies a long event lockStep
// blocks at a time and releases the index's lock in between, so that a
// prefill's event does not hold up every Match; readers meanwhile see the
// event in part, as if the engine had sent it in pieces. Stores and
// removals alike; the result is that of the whole event.
func TestMirrorEventStepsLetReadersIn(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 16)
	n := 3*lockStep + 5
	p := prompt(n*16, 5)
	q := Query{Tokens: p}
	var seen []int
	ix.betweenSteps = func() {
		if !ix.mu.TryRLock() {
			t.Fatal("the index's lock is held between an event's steps")
		}
		ix.mu.RUnlock()
		seen = append(seen, matchOf(t, ix, q)["e1"])
	}
	e.msg(f, e.stored(p, nil, 0, n))
	if want := []int{lockStep, 2 * lockStep, 3 * lockStep}; !slices.Equal(seen, want) {
		t.Fatalf("blocks matched at the pauses of the store: %v, want %v", seen, want)
	}
	if got := matchOf(t, ix, q)["e1"]; got != n {
		t.Fatalf("after the store: %d blocks matched, want %d", got, n)
	}
	seen = nil
	hs := e.hashes(p, nil)
	e.msg(f, removed(hs[n-2*lockStep-1:]...)) // the last 2*lockStep+1 blocks
	if len(seen) != 2 {
		t.Fatalf("%d pauses in a removal of %d blocks, want 2", len(seen), 2*lockStep+1)
	}
	if got := matchOf(t, ix, q)["e1"]; got != n-2*lockStep-1 {
		t.Fatalf("after the removal: %d blocks matched, want %d", got, n-2*lockStep-1)
	}
	if st := m.Stats(); st.Blocks != n-2*lockStep-1 {
		t.Fatalf("stats %+v", st)
	}
}
