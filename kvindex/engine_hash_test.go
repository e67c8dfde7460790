package kvindex

import (
	"bytes"
	"encoding/json"
	"hash/fnv"
	"os"
	"slices"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

func TestEngineHashVLLMIsTheEventsHash(t *testing.T) {
	p := prompt(37, 5)
	for _, tc := range []struct{ lora, salt string }{{"", ""}, {"sql-adapter", ""}, {"", "tenant-a"}, {"sql-adapter", "tenant-a"}} {
		e := newEngineSim(t, "42", 4)
		want := e.hashes(p, RequestExtraKeys(tc.lora, tc.salt, len(p)/4))
		got, err := EngineHash{Algo: HashSHA256CBOR, Seed: "42"}.BlockHashes(nil,
			HashedPrompt{Tokens: p, BlockSize: 4, Model: "ignored by vLLM", LoRAName: tc.lora, CacheSalt: tc.salt})
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("lora %q salt %q: %x %v, want %x", tc.lora, tc.salt, got, err, want)
		}
	}
}

// llmdVector is one case of testdata/llmd_hash_vectors.json, computed with
// llm-d-kv-cache v0.9.0's own kvblock.ChunkedTokenDatabase
// (TokensToKVBlockKeys from kvblock.EmptyBlockHash), the hashing of
// llm-d-inference-sim v0.10.2's events, outside this repository.
type llmdVector struct {
	Name      string   `json:"name"`
	Seed      string   `json:"seed"`
	Model     string   `json:"model"`
	BlockSize int      `json:"block_size"`
	Tokens    []uint64 `json:"tokens"`
	Hashes    []uint64 `json:"hashes"`
}

func TestEngineHashLLMDVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/llmd_hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []llmdVector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) < 5 {
		t.Fatalf("%d vectors, want 5", len(vs))
	}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			got, err := EngineHash{Algo: HashLLMDFNV64aCBOR, Seed: v.Seed}.BlockHashes(nil,
				HashedPrompt{Tokens: v.Tokens, BlockSize: v.BlockSize, Model: v.Model, LoRAName: "not hashed", CacheSalt: "not hashed"})
			if err != nil || !slices.Equal(got, v.Hashes) {
				t.Fatalf("got %d %v\nwant %d", got, err, v.Hashes)
			}
		})
	}
}

// TestLLMDCBORMatchesLibrary: the hand-written CBOR of llm-d's hash input
// is what fxamacker/cbor's canonical mode (llm-d's encoder) writes for the
// same Go values: a nil []uint32 as null, uint32 ids, a uint64 parent.
func TestLLMDCBORMatchesLibrary(t *testing.T) {
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	var e cborEncoder
	cases := []struct {
		parent uint64
		tokens []uint32
		extra  any
	}{
		{14695981039346656037, nil, "Qwen/Qwen3-0.6B"},
		{1<<64 - 1, []uint32{0, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1}, nil},
		{0, []uint32{}, nil},
	}
	for _, c := range cases {
		var toks []uint64
		if c.tokens != nil {
			toks = make([]uint64, len(c.tokens))
			for i, x := range c.tokens {
				toks[i] = uint64(x)
			}
		}
		model, withModel := c.extra.(string)
		got := llmdBlock(&e, c.parent, toks, model, withModel)
		want, err := em.Marshal([]any{c.parent, c.tokens, c.extra})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(e.buf, want) {
			t.Fatalf("hand CBOR %x\nlibrary    %x", e.buf, want)
		}
		f := fnv.New64a()
		f.Write(want)
		if got != f.Sum64() {
			t.Fatalf("hash %x, want %x", got, f.Sum64())
		}
	}
}

func TestEngineHashRejects(t *testing.T) {
	if err := (EngineHash{Algo: "sha256"}).Validate(); err == nil {
		t.Fatal("pickle-based sha256 accepted: the gateway cannot reproduce it")
	}
	if _, err := (EngineHash{}).BlockHashes(nil, HashedPrompt{Tokens: []uint64{1}, BlockSize: 1}); err == nil {
		t.Fatal("hashing without an algorithm")
	}
	if _, err := (EngineHash{Algo: HashLLMDFNV64aCBOR}).BlockHashes(nil, HashedPrompt{Tokens: []uint64{1 << 32}, BlockSize: 1}); err == nil {
		t.Fatal("an id beyond uint32 hashed the llm-d way")
	}
	if _, err := (EngineHash{Algo: HashSHA256CBOR}).BlockHashes(nil, HashedPrompt{Tokens: []uint64{1}}); err == nil {
		t.Fatal("block size 0 accepted")
	}
}

// BenchmarkEngineHashes is what Match adds per prompt while some engine
// keeps orphans: the engines' hashes of an 8k-token prompt.
func BenchmarkEngineHashes(b *testing.B) {
	p := prompt(8192, 3)
	for _, algo := range []string{HashSHA256CBOR, HashLLMDFNV64aCBOR} {
		b.Run(algo, func(b *testing.B) {
			h := EngineHash{Algo: algo, Seed: "0"}
			dst := make([]uint64, 0, 512)
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = h.BlockHashes(dst[:0], HashedPrompt{Tokens: p, BlockSize: 16, Model: "m"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
