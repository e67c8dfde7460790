package kvindex

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

// fillMirror stores n blocks as chains of 64 blocks of bs tokens through
// the mirror's own apply path (no decoding).
func fillMirror(tb testing.TB, m *Mirror, n, bs int, rng *rand.Rand) {
	const chain = 64
	ev := Event{Kind: EventBlockStored, BlockSize: bs, Medium: "GPU"}
	ev.TokenIDs = make([]uint64, chain*bs)
	b := &Batch{Events: []Event{ev}}
	m.wmu.Lock()
	defer m.wmu.Unlock()
	for done := 0; done < n; done += chain {
		e := &b.Events[0]
		k := min(chain, n-done)
		e.BlockHashes = e.BlockHashes[:0]
		for i := 0; i < k; i++ {
			e.BlockHashes = append(e.BlockHashes, rng.Uint64())
		}
		e.TokenIDs = e.TokenIDs[:k*bs]
		for i := range e.TokenIDs {
			e.TokenIDs[i] = uint64(rng.IntN(151000))
		}
		m.apply(uint64(done), b)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkBytesPerBlock measures the heap held per indexed block: mirror
// entry, eviction fifo and index entry, for one engine holding 256Ki
// distinct blocks (the worst case: no key shared with another engine).
func BenchmarkBytesPerBlock(b *testing.B) {
	const n = 256 << 10
	for b.Loop() {
		before := heapInUse()
		ix := NewIndex(IndexConfig{})
		m, err := ix.AddEngine("e1", MirrorConfig{})
		if err != nil {
			b.Fatal(err)
		}
		fillMirror(b, m, n, 16, rand.New(rand.NewPCG(3, 4)))
		after := heapInUse()
		if m.Stats().Blocks != n {
			b.Fatalf("%d blocks", m.Stats().Blocks)
		}
		b.ReportMetric(float64(after-before)/n, "B/block")
		runtime.KeepAlive(ix)
	}
}

// BenchmarkBytesPerBlockChurn is BenchmarkBytesPerBlock after churn: one
// engine of 256Ki blocks, filled and then made to store and evict its
// whole capacity 4 times over, with vLLM's events (a BlockRemoved per
// evicted block, prefill chunks and decode blocks) through a Feed. The
// heap counted is everything the collector frees when the index and the
// Feed are dropped, decoder included; it should stay near the no-churn
// figure, however long the churn.
func BenchmarkBytesPerBlockChurn(b *testing.B) {
	const n, cycles = 256 << 10, 4
	for b.Loop() {
		bytes, blocks := churnHeap(b, n, cycles, 3)
		if blocks != n {
			b.Fatalf("%d blocks", blocks)
		}
		b.ReportMetric(float64(bytes)/n, "B/block")
	}
}

// matchFixture is 32 engines of block size 16 holding leading parts of
// one 128Ki-token prompt, from all of it down to a quarter, plus 32Ki
// unrelated blocks each so the index is not trivially small.
func matchFixture(b *testing.B) (*Index, []uint64) {
	const engines, bs = 32, 16
	p := prompt(128<<10, 77)
	keys, err := Keys(nil, p, bs, 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	ix := NewIndex(IndexConfig{})
	sim := newEngineSim(b, "0", bs)
	hs := sim.hashes(p, nil)
	for e := 0; e < engines; e++ {
		m, err := ix.AddEngine(fmt.Sprintf("10.0.0.%d:8000", e), MirrorConfig{})
		if err != nil {
			b.Fatal(err)
		}
		fillMirror(b, m, 32<<10, bs, rand.New(rand.NewPCG(uint64(e), 5)))
		n := len(keys) - e*len(keys)/(engines*4/3)
		ev := Event{Kind: EventBlockStored, BlockSize: bs, BlockHashes: hs[:n], TokenIDs: p[:n*bs]}
		m.wmu.Lock()
		m.apply(1<<40, &Batch{Events: []Event{ev}})
		m.wmu.Unlock()
	}
	return ix, keys
}

// BenchmarkMatchKeys128k32Engines measures the lookup for a 128Ki-token
// prompt (8192 blocks) across 32 engines, hashing excluded.
func BenchmarkMatchKeys128k32Engines(b *testing.B) {
	ix, keys := matchFixture(b)
	got := ix.MatchKeys(16, 0, keys)
	if len(got) != 32 || got[0].Blocks != len(keys) {
		b.Fatalf("fixture: %d matches, first %+v", len(got), got[0])
	}
	b.ReportAllocs()
	for b.Loop() {
		ix.MatchKeys(16, 0, keys)
	}
}

// BenchmarkKeys128k measures the gateway's key hashing of a 128Ki-token
// prompt at block size 16.
func BenchmarkKeys128k(b *testing.B) {
	p := prompt(128<<10, 78)
	keys := make([]uint64, 0, len(p)/16)
	b.SetBytes(int64(len(p) * 8))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if keys, err = Keys(keys[:0], p, 16, 0, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMatch128k32Engines is Match end to end: hashing plus lookup.
func BenchmarkMatch128k32Engines(b *testing.B) {
	ix, _ := matchFixture(b)
	p := prompt(128<<10, 77)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ix.Match(Query{Tokens: p}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMatchKeys128k32EnginesPredicted is BenchmarkMatchKeys128k32Engines
// with 4 of the engines predicted to hold the whole prompt (the blocks
// past their own), so that Match walks them with their predictions.
func BenchmarkMatchKeys128k32EnginesPredicted(b *testing.B) {
	ix, keys := matchFixture(b)
	ix.SetPredictTTL(time.Hour)
	for e := 28; e < 32; e++ {
		if n := ix.Predict(fmt.Sprintf("10.0.0.%d:8000", e), 16, 0, keys); n == 0 {
			b.Fatalf("engine %d: nothing predicted", e)
		}
	}
	got := ix.MatchKeys(16, 0, keys)
	predicted := 0
	for _, m := range got {
		if m.Predicted > 0 && m.Blocks == len(keys) {
			predicted++
		}
	}
	if len(got) != 32 || predicted != 4 {
		b.Fatalf("fixture: %d matches, %d with whole predicted prompts", len(got), predicted)
	}
	b.ReportAllocs()
	for b.Loop() {
		ix.MatchKeys(16, 0, keys)
	}
}

// BenchmarkPredictRenew128k measures Predict of a 128Ki-token prompt
// (8192 blocks) already predicted on the engine: what every request of a
// burst after the first costs under the predictions' write lock.
func BenchmarkPredictRenew128k(b *testing.B) {
	ix := NewIndex(IndexConfig{})
	ix.SetPredictTTL(time.Hour)
	if _, err := ix.AddEngine("e", MirrorConfig{}); err != nil {
		b.Fatal(err)
	}
	keys, err := Keys(nil, prompt(128<<10, 79), 16, 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	if n := ix.Predict("e", 16, 0, keys); n != len(keys) {
		b.Fatalf("fixture: %d predicted", n)
	}
	b.ReportAllocs()
	for b.Loop() {
		ix.Predict("e", 16, 0, keys)
	}
}

// newPromptKeys is sets of n random keys each: the block keys of prompts
// never seen before (their keys share nothing).
func newPromptKeys(sets, n int, seed uint64) [][]uint64 {
	rng := rand.New(rand.NewPCG(seed, 11))
	out := make([][]uint64, sets)
	for i := range out {
		out[i] = make([]uint64, n)
		for j := range out[i] {
			out[i][j] = rng.Uint64()
		}
	}
	return out
}

// predictFixture is an index of 64 live engines, predictions on, already
// holding as many predicted prompts of 8192 blocks as the default bounds
// allow, so that every further Predict of a new prompt evicts as many
// entries as it inserts: the steady state of a fleet seeing new 128Ki-token
// prompts.
func predictFixture(tb testing.TB) (*Index, []string, [][]uint64) {
	ix := NewIndex(IndexConfig{})
	ix.SetPredictTTL(time.Hour)
	engines := make([]string, 64)
	for i := range engines {
		engines[i] = fmt.Sprintf("10.0.1.%d:8000", i)
		if _, err := ix.AddEngine(engines[i], MirrorConfig{}); err != nil {
			tb.Fatal(err)
		}
	}
	sets := newPromptKeys(32, 8192, 3)
	for i := range 2 * defaultMaxPredicted / 8192 {
		ix.Predict(engines[i%len(engines)], 16, 0, sets[i%len(sets)])
	}
	if st := ix.PredictionStats(); st.Live != defaultMaxPredicted {
		tb.Fatalf("fixture: %d live predictions, want %d", st.Live, defaultMaxPredicted)
	}
	return ix, engines, sets
}

// BenchmarkPredictNew128k measures Predict of a 128Ki-token prompt (8192
// blocks) never seen before, on one of 64 engines, with the predictions at
// their bound: 8192 entries in, 8192 of the oldest out. It runs under the
// predictions' write lock, in the request's decision.
func BenchmarkPredictNew128k(b *testing.B) {
	ix, engines, sets := predictFixture(b)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		if n := ix.Predict(engines[i%len(engines)], 16, 0, sets[i%len(sets)]); n != 8192 {
			b.Fatalf("%d predicted, want 8192", n)
		}
	}
}

// BenchmarkMatchBesidePredict measures Match of an 8Ki-token prompt (512
// blocks) over the 64 engines of predictFixture, alone and while another
// goroutine predicts new 128Ki-token prompts without pause: how long a
// long new prompt's Predict holds up other requests' decisions. It reports
// the Matches' p50 and p99.
func BenchmarkMatchBesidePredict(b *testing.B) {
	for _, beside := range []bool{false, true} {
		b.Run(fmt.Sprintf("predicting=%v", beside), func(b *testing.B) {
			ix, engines, sets := predictFixture(b)
			var write func(stop <-chan struct{})
			if beside {
				write = func(stop <-chan struct{}) {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						ix.Predict(engines[i%len(engines)], 16, 0, sets[1+i%(len(sets)-1)])
					}
				}
			}
			benchMatchBeside(b, ix, sets[0][:512], write)
		})
	}
}

// BenchmarkMatchBesideIngest measures Match of an 8Ki-token prompt over
// matchFixture's 32 engines while another engine's mirror applies, without
// pause, BlockStored events of chain new blocks each (none: Match alone;
// 512: a prefill chunk of 8192 tokens), at a capacity where each also
// evicts: how long events hold up decisions. It reports the Matches' p50
// and p99.
func BenchmarkMatchBesideIngest(b *testing.B) {
	for _, chain := range []int{0, 64, 512} {
		b.Run(fmt.Sprintf("chain=%d", chain), func(b *testing.B) {
			ix, keys := matchFixture(b)
			m, err := ix.AddEngine("ingest", MirrorConfig{Capacity: 1 << 16})
			if err != nil {
				b.Fatal(err)
			}
			var write func(stop <-chan struct{})
			if chain > 0 {
				write = func(stop <-chan struct{}) { ingestUntil(stop, m, chain) }
			}
			benchMatchBeside(b, ix, keys[:512], write)
		})
	}
}

// benchMatchBeside times ix.MatchKeys of keys, yielding the processor
// between matches, while write (when not nil) runs in another goroutine
// until its stop channel closes, and reports the matches' p50 and p99.
func benchMatchBeside(b *testing.B, ix *Index, keys []uint64, write func(stop <-chan struct{})) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		if write != nil {
			write(stop)
		}
	}()
	ds := make([]time.Duration, 0, 1<<16)
	for b.Loop() {
		start := time.Now()
		ix.MatchKeys(16, 0, keys)
		ds = append(ds, time.Since(start))
		runtime.Gosched()
	}
	close(stop)
	<-done
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2]), "p50-ns")
	b.ReportMetric(float64(ds[len(ds)*99/100]), "p99-ns")
}

// ingestUntil applies BlockStored events of chain new random blocks to m
// until stop is closed.
func ingestUntil(stop <-chan struct{}, m *Mirror, chain int) {
	rng := rand.New(rand.NewPCG(1, 2))
	ev := Event{Kind: EventBlockStored, BlockSize: 16, Medium: "GPU", TokenIDs: make([]uint64, chain*16)}
	for i := range ev.TokenIDs {
		ev.TokenIDs[i] = uint64(rng.IntN(151000))
	}
	batch := &Batch{Events: []Event{ev}}
	for seq := uint64(1); ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		e := &batch.Events[0]
		e.BlockHashes = e.BlockHashes[:0]
		for range chain {
			e.BlockHashes = append(e.BlockHashes, rng.Uint64())
		}
		m.wmu.Lock()
		m.apply(seq, batch)
		m.wmu.Unlock()
	}
}

// BenchmarkMatchKeys8kCold measures MatchKeys of an 8Ki-token prompt (512
// blocks) over 4 engines holding it and 64Ki other blocks each, as the
// gateway runs it between requests: with the CPU's caches flushed before
// every match (64 MiB written), the table's lines and their page-table
// entries cold. ns/op includes the flush; p50-ns is the match's own.
// pred: every engine has a speculative entry, so the walk consults them.
func BenchmarkMatchKeys8kCold(b *testing.B) {
	const engines, bs = 4, 16
	p := prompt(8<<10, 77)
	keys, err := Keys(nil, p, bs, 0, nil)
	if err != nil {
		b.Fatal(err)
	}
	ix := NewIndex(IndexConfig{})
	hs := newEngineSim(b, "0", bs).hashes(p, nil)
	for e := range engines {
		m, err := ix.AddEngine(fmt.Sprintf("10.0.0.%d:8000", e), MirrorConfig{})
		if err != nil {
			b.Fatal(err)
		}
		fillMirror(b, m, 64<<10, bs, rand.New(rand.NewPCG(uint64(e), 5)))
		m.wmu.Lock()
		m.apply(1<<40, &Batch{Events: []Event{{Kind: EventBlockStored, BlockSize: bs, BlockHashes: hs, TokenIDs: p}}})
		m.wmu.Unlock()
	}
	flush := make([]byte, 64<<20)
	for _, pred := range []bool{false, true} {
		if pred {
			ix.SetPredictTTL(time.Hour)
			for e := range engines {
				ix.Predict(fmt.Sprintf("10.0.0.%d:8000", e), bs, 0, []uint64{uint64(e) + 12345})
			}
		}
		b.Run(fmt.Sprintf("pred=%v", pred), func(b *testing.B) {
			ds := make([]time.Duration, 0, 1024)
			for b.Loop() {
				for i := 0; i < len(flush); i += 64 {
					flush[i]++
				}
				start := time.Now()
				got := ix.MatchKeys(bs, 0, keys)
				ds = append(ds, time.Since(start))
				if len(got) != engines || got[0].Blocks != len(keys) {
					b.Fatalf("fixture: %+v", got)
				}
			}
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2]), "p50-ns")
		})
	}
}
