package kvindex

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
)

// churnEngine is a vLLM engine at its cache capacity, publishing real
// msgpack batches the way vLLM's scheduler does: per step, one BlockRemoved
// per block evicted to make room (roughly least recently used first) and
// one BlockStored per request with new full blocks, from a single block of
// a decoding request to a whole prefill chunk. Every block it stores is
// new, so every store evicts: the most churn an engine can cause.
type churnEngine struct {
	capacity, bs int
	rng          *rand.Rand
	held         []uint64 // held[head:], oldest first
	head         int
	seq          uint64
	buf          bytes.Buffer
	enc          *msgpack.Encoder
	evs          []churnEvent
	tokens       []uint64
}

type churnEvent struct {
	removed uint64   // a BlockRemoved of this hash, if hashes is nil
	hashes  []uint64 // a BlockStored of these blocks
}

func newChurnEngine(capacity, bs int, seed uint64) *churnEngine {
	e := &churnEngine{capacity: capacity, bs: bs, rng: rand.New(rand.NewPCG(seed, 0xc4)),
		held: make([]uint64, 0, 2*capacity)}
	e.enc = msgpack.NewEncoder(&e.buf)
	e.enc.UseCompactInts(true)
	return e
}

func (e *churnEngine) holds() int { return len(e.held) - e.head }

// step returns the payload of the next batch, valid until the next call,
// and how many blocks it stored.
func (e *churnEngine) step() ([]byte, int) {
	e.evs = e.evs[:0]
	stored := 0
	// Each request's evictions come before its store, as vLLM allocates
	// then caches; the varying counts put large and small events at every
	// position of a batch.
	for r := 1 + e.rng.IntN(8); r > 0; r-- {
		k := 1
		if e.rng.IntN(4) == 0 {
			k = 1 + e.rng.IntN(128) // a prefill chunk of up to 2048 tokens
		}
		k = min(k, e.capacity)
		for e.holds()+k > e.capacity {
			// Roughly LRU: one of the oldest few.
			i := e.head + e.rng.IntN(min(8, e.holds()))
			e.held[i], e.held[e.head] = e.held[e.head], e.held[i]
			e.evs = append(e.evs, churnEvent{removed: e.held[e.head]})
			e.head++
		}
		if len(e.held)+k > cap(e.held) {
			e.held = append(e.held[:0], e.held[e.head:]...)
			e.head = 0
		}
		hs := make([]uint64, k)
		for i := range hs {
			hs[i] = e.rng.Uint64()
		}
		e.held = append(e.held, hs...)
		e.evs = append(e.evs, churnEvent{hashes: hs})
		stored += k
	}
	e.buf.Reset()
	enc := e.enc
	must(enc.EncodeArrayLen(3))
	must(enc.EncodeFloat64(1.76e9 + float64(e.seq)))
	must(enc.EncodeArrayLen(len(e.evs)))
	for _, ev := range e.evs {
		if ev.hashes == nil {
			must(enc.EncodeArrayLen(4))
			must(enc.EncodeString("BlockRemoved"))
			must(enc.EncodeArrayLen(1))
			must(enc.EncodeUint(ev.removed))
			must(enc.EncodeString("GPU"))
			must(enc.EncodeUint(0))
			continue
		}
		must(enc.EncodeArrayLen(12))
		must(enc.EncodeString("BlockStored"))
		must(enc.EncodeArrayLen(len(ev.hashes)))
		for _, h := range ev.hashes {
			must(enc.EncodeUint(h))
		}
		must(enc.EncodeNil())
		must(enc.EncodeArrayLen(len(ev.hashes) * e.bs))
		for range len(ev.hashes) * e.bs {
			must(enc.EncodeUint(uint64(e.rng.IntN(151000))))
		}
		must(enc.EncodeUint(uint64(e.bs)))
		must(enc.EncodeNil())
		must(enc.EncodeString("GPU"))
		must(enc.EncodeNil())
		must(enc.EncodeArrayLen(len(ev.hashes)))
		for range ev.hashes {
			must(enc.EncodeNil())
		}
		must(enc.EncodeUint(0))
		must(enc.EncodeString("full_attention"))
		must(enc.EncodeNil())
	}
	must(enc.EncodeUint(0))
	e.seq++
	return e.buf.Bytes(), stored
}

// heldBy returns the heap build's result holds: what the collector frees
// when it is dropped.
func heldBy(build func() any) uint64 {
	root := build()
	with := heapInUse()
	runtime.KeepAlive(root)
	without := heapInUse()
	if with < without {
		return 0
	}
	return with - without
}

// churnHeap feeds an engine of the given capacity (full first, then for
// the given number of capacity-cycles: blocks stored = cycles × capacity)
// through a Feed into an index and returns the heap the index and its Feed
// hold, decoder included, and the blocks held.
func churnHeap(tb testing.TB, capacity int, cycles float64, seed uint64) (bytes uint64, blocks int) {
	tb.Helper()
	bytes = heldBy(func() any {
		e := newChurnEngine(capacity, 16, seed)
		ix := NewIndex(IndexConfig{})
		m, err := ix.AddEngine("e1", MirrorConfig{Capacity: capacity})
		if err != nil {
			tb.Fatal(err)
		}
		f := NewFeed(m, nil, FeedConfig{})
		f.Connected()
		for m.Stats().Blocks < capacity {
			p, _ := e.step()
			f.Message(nil, e.seq-1, p)
		}
		for stored, goal := 0, int(cycles*float64(capacity)); stored < goal; {
			p, n := e.step()
			f.Message(nil, e.seq-1, p)
			stored += n
		}
		st := m.Stats()
		if st.Blocks != e.holds() || st.DecodeErrors != 0 || st.RemovedUnknown != 0 || st.Evicted != 0 {
			tb.Fatalf("mirror out of step with the engine: %d blocks, engine %d; stats %+v", st.Blocks, e.holds(), st)
		}
		blocks = st.Blocks
		f.Close()
		return f // it holds the mirror, the mirror the index
	})
	return bytes, blocks
}

// TestChurnMemoryBounded checks that the memory of an engine's mirror, its
// index entries and its Feed (decoder buffers included) is bounded by the
// blocks the engine holds, whatever the churn before: after 20 cycles of
// storing and evicting the engine's whole capacity it is about what it is
// after 2, and within a small factor of a freshly filled mirror.
func TestChurnMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("churns 200k blocks")
	}
	const capacity = 8 << 10
	fill, _ := churnHeap(t, capacity, 0, 1)
	two, _ := churnHeap(t, capacity, 2, 1)
	twenty, blocks := churnHeap(t, capacity, 20, 1)
	t.Logf("%d blocks: %.0f B/block filled, %.0f after 2 cycles, %.0f after 20",
		blocks, float64(fill)/capacity, float64(two)/capacity, float64(twenty)/capacity)
	if twenty > 2*two {
		t.Errorf("heap after 20 cycles %d > 2 × heap after 2 cycles %d: memory grows with churn", twenty, two)
	}
	if twenty > 2*fill {
		t.Errorf("heap after 20 cycles %d > 2 × heap of a freshly filled mirror %d", twenty, fill)
	}
}

// TestMirrorShrinksAfterGroupShift moves a hybrid model's blocks from one
// KV-cache group to the other and back: the group that gave way must give
// its memory back, so the mirror costs what a mirror of the blocks it
// holds costs, not the sum of every group's largest size.
func TestMirrorShrinksAfterGroupShift(t *testing.T) {
	const n, bs = 32 << 10, 4
	rng := rand.New(rand.NewPCG(5, 6))
	store := func(m *Mirror, group int, hs []uint64) {
		ev := Event{Kind: EventBlockStored, BlockSize: bs, GroupIdx: group, TokenIDs: make([]uint64, 64*bs)}
		for i := 0; i < len(hs); i += 64 {
			ev.BlockHashes = hs[i:min(i+64, len(hs))]
			ev.TokenIDs = ev.TokenIDs[:len(ev.BlockHashes)*bs]
			for j := range ev.TokenIDs {
				ev.TokenIDs[j] = rng.Uint64N(151000)
			}
			m.wmu.Lock()
			m.apply(0, &Batch{Events: []Event{ev}})
			m.wmu.Unlock()
		}
	}
	remove := func(m *Mirror, group int, hs []uint64) {
		m.wmu.Lock()
		m.apply(0, &Batch{Events: []Event{{Kind: EventBlockRemoved, GroupIdx: group, BlockHashes: hs}}})
		m.wmu.Unlock()
	}
	newHashes := func() []uint64 {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = rng.Uint64()
		}
		return hs
	}
	fill := heldBy(func() any {
		ix := NewIndex(IndexConfig{})
		m, _ := ix.AddEngine("e1", MirrorConfig{})
		store(m, 0, newHashes())
		return ix
	})
	// shift fills group 0, then moves the blocks to group 1 and back and
	// forth, in steps, as an engine evicts one group's blocks to store
	// the other's; it returns the blocks held, all in group 1.
	shift := func() (*Index, *Mirror, []uint64) {
		ix := NewIndex(IndexConfig{})
		m, _ := ix.AddEngine("e1", MirrorConfig{})
		hs := newHashes()
		store(m, 0, hs)
		for round := 0; round < 3; round++ {
			g := round % 2
			next := newHashes()
			for i := 0; i < n; i += n / 8 {
				remove(m, g, hs[i:i+n/8])
				store(m, 1-g, next[i:i+n/8])
			}
			hs = next
		}
		return ix, m, hs
	}
	shifted := heldBy(func() any {
		ix, _, _ := shift()
		return ix
	})
	// The rebuilt maps lost nothing: the index holds every block, and
	// removing them empties the mirror and the index.
	ix, m, hs := shift()
	if st := m.Stats(); st.Blocks != n || st.RemovedUnknown != 0 || ix.banks[0].len() != n {
		t.Fatalf("%d keys indexed; stats %+v", ix.banks[0].len(), st)
	}
	remove(m, 1, hs)
	if st := m.Stats(); st.Blocks != 0 || st.RemovedUnknown != 0 || ix.banks[0].len() != 0 {
		t.Errorf("after removing every block: %d keys indexed; stats %+v", ix.banks[0].len(), st)
	}
	t.Logf("%d blocks: %.0f B/block in one group, %.0f after shifting between two", n, float64(fill)/n, float64(shifted)/n)
	if shifted > fill*3/2 {
		t.Errorf("after shifting groups the mirror holds %d bytes, more than 1.5 × the %d bytes of the same blocks in one group", shifted, fill)
	}
}

// TestDecoderMemoryFollowsRecentBatches decodes batches in which a large
// BlockStored comes at a different position every time, among small
// events, then only small batches: the decoder must hold about one large
// batch's worth meanwhile, not one large event per position, and give it
// back once batches are small again.
func TestDecoderMemoryFollowsRecentBatches(t *testing.T) {
	const events, bigBlocks, bs = 200, 64, 16
	big := make([][]byte, events)
	for i := range big {
		evs := make([]any, events)
		for j := range evs {
			evs[j] = removed(uint64(j))
		}
		toks := arr{}
		for k := 0; k < bigBlocks*bs; k++ {
			toks = append(toks, 1000+k)
		}
		hs, ek := arr{}, arr{}
		for k := 0; k < bigBlocks; k++ {
			hs, ek = append(hs, k+1), append(ek, nil)
		}
		evs[i] = arr{"BlockStored", hs, nil, toks, bs, nil, "GPU", nil, ek, 0, "full_attention", nil}
		big[i] = batch(evs...)
	}
	small := batch(removed(1), arr{"BlockStored", arr{2}, 1, arr{1, 2, 3, 4}, 4, nil, "GPU", nil, arr{nil}, 0, "full_attention", nil})
	// One large batch: its events, hashes, tokens and extra keys.
	oneBatch := uint64(events*unsafe.Sizeof(Event{}) + (events+bigBlocks+bigBlocks*bs)*8 + bigBlocks*24)

	decode := func(d *Decoder, p []byte) {
		if _, err := d.Decode(p); err != nil {
			t.Fatal(err)
		}
	}
	afterBig := heldBy(func() any {
		d := NewDecoder()
		for _, p := range big {
			decode(d, p)
		}
		return d
	})
	afterSmall := heldBy(func() any {
		d := NewDecoder()
		for _, p := range big {
			decode(d, p)
		}
		for range 2 * trimWindow {
			decode(d, small)
		}
		return d
	})
	t.Logf("one large batch %d B; decoder holds %d B after large batches, %d B after small ones", oneBatch, afterBig, afterSmall)
	if afterBig > 4*oneBatch {
		t.Errorf("after %d large batches the decoder holds %d B, more than 4 × one batch (%d B)", events, afterBig, oneBatch)
	}
	if afterSmall > oneBatch/4 {
		t.Errorf("after %d small batches the decoder still holds %d B, more than a quarter of a large batch (%d B)", 2*trimWindow, afterSmall, oneBatch/4)
	}
}

// TestMirrorMultiClaimsAfterShrink stores the same token blocks under two
// sets of engine hashes (as extra keys the events do not show would), so
// every gateway key is claimed twice, then removes the first set: the
// claims must survive the multi-claim map being rebuilt smaller, and go
// with the second set.
func TestMirrorMultiClaimsAfterShrink(t *testing.T) {
	const n, bs = 4096, 2
	ix := NewIndex(IndexConfig{})
	m, err := ix.AddEngine("e1", MirrorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tokens := prompt(n*bs, 9)
	keys, err := Keys(nil, tokens, bs, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	sets := [2][]uint64{make([]uint64, n), make([]uint64, n)}
	for i := range n {
		sets[0][i], sets[1][i] = uint64(2*i+1), uint64(2*i+2)
	}
	apply := func(evs ...Event) {
		m.wmu.Lock()
		m.apply(0, &Batch{Events: evs})
		m.wmu.Unlock()
	}
	for _, hs := range sets {
		ev := Event{Kind: EventBlockStored, BlockSize: bs, BlockHashes: hs[:1], TokenIDs: tokens[:bs]}
		evs := []Event{ev}
		for i := 1; i < n; i++ {
			evs = append(evs, Event{Kind: EventBlockStored, BlockSize: bs, BlockHashes: hs[i : i+1], Parent: hs[i-1], HasParent: true, TokenIDs: tokens[i*bs : (i+1)*bs]})
		}
		apply(evs...)
	}
	if got := len(m.multi); got != n {
		t.Fatalf("%d multi-claimed keys, want %d", got, n)
	}
	held := func() int {
		got := ix.MatchKeys(bs, 0, keys)
		if len(got) == 0 {
			return 0
		}
		return got[0].Blocks
	}
	// Remove the first set from the tail, so every prefix stays held.
	for i := n - 1; i >= 0; i-- {
		apply(Event{Kind: EventBlockRemoved, BlockHashes: sets[0][i : i+1]})
		if i%512 == 0 {
			if got := held(); got != n {
				t.Fatalf("after removing %d blocks of the first set, %d of %d blocks held", n-i, got, n)
			}
		}
	}
	if len(m.multi) != 0 || m.multiHi >= n {
		t.Fatalf("multi-claim map: %d entries, high-water %d: not rebuilt", len(m.multi), m.multiHi)
	}
	apply(Event{Kind: EventBlockRemoved, BlockHashes: sets[1]})
	if got, st := held(), m.Stats(); got != 0 || st.Blocks != 0 || st.RemovedUnknown != 0 || ix.banks[0].len() != 0 {
		t.Fatalf("after removing both sets: %d blocks matched, %d keys indexed; stats %+v", got, ix.banks[0].len(), st)
	}
}
