package kvindex

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// ingestPayloads builds n batches as vLLM emits them during decoding: each
// batch holds 32 BlockStored events (one per running request) of one
// 16-token block chained to the request's previous block, with 12-element
// positional events and extra_keys [nil], encoded by msgpack/v5's Encoder
// the way msgspec encodes (compact ints, float64 ts).
func ingestPayloads(b testing.TB, n int) [][]byte {
	const reqs, bs = 32, 16
	h, err := NewHasher("0", bs)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	parents := make([]Digest, reqs)
	for i := range parents {
		parents[i] = h.Root()
	}
	tokens := make([]uint64, bs)
	out := make([][]byte, n)
	for k := range out {
		var buf bytes.Buffer
		e := msgpack.NewEncoder(&buf)
		e.UseCompactInts(true)
		must(e.EncodeArrayLen(3))
		must(e.EncodeFloat64(1.76e9 + float64(k)))
		must(e.EncodeArrayLen(reqs))
		for r := 0; r < reqs; r++ {
			for i := range tokens {
				tokens[i] = uint64(rng.IntN(151000))
			}
			d, err := h.Block(parents[r], tokens, nil)
			if err != nil {
				b.Fatal(err)
			}
			must(e.EncodeArrayLen(12))
			must(e.EncodeString("BlockStored"))
			must(e.EncodeArrayLen(1))
			must(e.EncodeUint(d.Uint64()))
			if k == 0 {
				must(e.EncodeNil())
			} else {
				must(e.EncodeUint(parents[r].Uint64()))
			}
			must(e.EncodeArrayLen(bs))
			for _, t := range tokens {
				must(e.EncodeUint(t))
			}
			must(e.EncodeUint(bs))
			must(e.EncodeNil())
			must(e.EncodeString("GPU"))
			must(e.EncodeNil())
			must(e.EncodeArrayLen(1))
			must(e.EncodeNil())
			must(e.EncodeUint(0))
			must(e.EncodeString("full_attention"))
			must(e.EncodeNil())
			parents[r] = d
		}
		must(e.EncodeUint(0))
		out[k] = buf.Bytes()
	}
	return out
}

// BenchmarkDecode32x16 measures decoding alone, per batch of 32 blocks.
func BenchmarkDecode32x16(b *testing.B) {
	ps := ingestPayloads(b, 64)
	d := NewDecoder()
	b.SetBytes(int64(len(ps[0])))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := d.Decode(ps[i%len(ps)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)*32/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkIngest32x16 measures a Feed taking messages end to end (decode,
// chain, mirror, index) on one core. The stream is a long decode phase of
// 32 requests; a capacity of 8192 blocks keeps the mirror at a steady state
// where every insert also evicts.
func BenchmarkIngest32x16(b *testing.B) {
	ps := ingestPayloads(b, 512)
	ix := NewIndex(IndexConfig{})
	m, err := ix.AddEngine("e1", MirrorConfig{Capacity: 8192})
	if err != nil {
		b.Fatal(err)
	}
	f := NewFeed(m, nil, FeedConfig{})
	defer f.Close()
	f.Connected()
	// Warm up through a full cycle so the mirror is at capacity.
	for i, p := range ps {
		f.Message(nil, uint64(i), p)
	}
	seq := uint64(len(ps))
	b.ReportAllocs()
	for b.Loop() {
		f.Message(nil, seq, ps[seq%uint64(len(ps))])
		seq++
	}
	b.ReportMetric(float64(b.N)*32/b.Elapsed().Seconds(), "blocks/s")
	st := m.Stats()
	if st.DecodeErrors != 0 || st.Blocks != 8192 || st.Malformed != 0 {
		b.Fatalf("stats %+v", st)
	}
}
