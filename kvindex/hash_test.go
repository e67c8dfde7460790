package kvindex

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/fxamacker/cbor/v2"
	"github.com/llmgw/caddy-llmgw/internal/testutil/golden"
)

func TestGoldenHashCases(t *testing.T) {
	g := golden.Load(t)
	if len(g.HashCases) == 0 {
		t.Fatal("no hash cases in golden file")
	}
	for _, c := range g.HashCases {
		t.Run(c.Name, func(t *testing.T) {
			h, err := NewHasher(c.Seed, c.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			root := h.Root()
			if got := hex.EncodeToString(root[:]); got != c.NoneHashHex {
				t.Fatalf("NONE_HASH = %s, want %s", got, c.NoneHashHex)
			}
			extra := c.ExtraKeys
			got, err := h.BlockHashes(nil, c.Tokens, extra)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.BlockHashesHex) {
				t.Fatalf("%d blocks, want %d", len(got), len(c.BlockHashesHex))
			}
			for i := range got {
				if hx := hex.EncodeToString(got[i][:]); hx != c.BlockHashesHex[i] {
					t.Errorf("block %d = %s, want %s", i, hx, c.BlockHashesHex[i])
				}
				if u := got[i].Uint64(); u != c.BlockHashesUint64[i] {
					t.Errorf("block %d uint64 = %d, want %d", i, u, c.BlockHashesUint64[i])
				}
				if u := ExternalHash(got[i][:]); u != c.BlockHashesUint64[i] {
					t.Errorf("block %d ExternalHash = %d, want %d", i, u, c.BlockHashesUint64[i])
				}
			}
			if c.FirstBlockCBORHex != "" && len(c.Tokens) >= c.BlockSize {
				var first []any
				if len(extra) > 0 {
					first = extra[0]
				}
				if _, err := h.Block(root, c.Tokens[:c.BlockSize], first); err != nil {
					t.Fatal(err)
				}
				if hx := hex.EncodeToString(h.enc.buf); hx != c.FirstBlockCBORHex {
					t.Errorf("first block CBOR = %s, want %s", hx, c.FirstBlockCBORHex)
				}
			}
		})
	}
}

func TestGoldenLegacy64(t *testing.T) {
	g := golden.Load(t)
	c := g.Legacy
	if NoneHash(c.Seed).Uint64() != c.NoneHashUint64 {
		t.Fatalf("legacy NONE_HASH = %d, want %d", NoneHash(c.Seed).Uint64(), c.NoneHashUint64)
	}
	got, err := Legacy64Hashes(c.Seed, c.BlockSize, c.Tokens)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(c.BlockHashesUint64) {
		t.Fatalf("%d blocks, want %d", len(got), len(c.BlockHashesUint64))
	}
	for i := range got {
		if got[i] != c.BlockHashesUint64[i] {
			t.Errorf("block %d = %d, want %d", i, got[i], c.BlockHashesUint64[i])
		}
	}
}

func TestGoldenHybridConcat(t *testing.T) {
	g := golden.Load(t)
	c := g.Hybrid
	h, err := NewHasher("0", c.HashBlockSize)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := h.BlockHashes(nil, c.Tokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	per := c.GroupBlockSize / c.HashBlockSize
	for i := range c.GroupBlockHashesHex {
		grp := ConcatGroupHash(sub[i*per : (i+1)*per])
		if hx := hex.EncodeToString(grp); hx != c.GroupBlockHashesHex[i] {
			t.Errorf("group %d = %s, want %s", i, hx, c.GroupBlockHashesHex[i])
		}
		if u := ExternalHash(grp); u != c.GroupBlockHashesUint64[i] {
			t.Errorf("group %d uint64 = %d, want %d", i, u, c.GroupBlockHashesUint64[i])
		}
	}
}

// TestCBORMatchesLibrary proves the hand-written encoder emits exactly what
// fxamacker/cbor produces in canonical mode, for the shapes vLLM hashes.
func TestCBORMatchesLibrary(t *testing.T) {
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	parent := NoneHash("0")
	cases := []struct {
		name   string
		tokens []uint64
		extra  []any
	}{
		{"small", []uint64{0, 1, 23, 24, 255, 256, 65535, 65536}, nil},
		{"wide", []uint64{1 << 32, 1<<64 - 1, 151000}, nil},
		{"salt", []uint64{5, 6, 7}, []any{"tenant-a"}},
		{"lora+salt", []uint64{5}, []any{"sql-adapter", "tenant-a"}},
		{"mm-negative", []uint64{9, 9}, []any{[]any{"abc123hash", int64(-11)}, []any{"x", int64(-1 << 40)}}},
		{"embeds", []uint64{1}, []any{bytes.Repeat([]byte{0xab}, 32)}},
		{"long-text", []uint64{1}, []any{string(bytes.Repeat([]byte("a"), 300))}},
	}
	h, _ := NewHasher("0", 1)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := h.Block(parent, c.tokens, c.extra); err != nil {
				t.Fatal(err)
			}
			var extra any
			if len(c.extra) > 0 {
				extra = c.extra
			}
			want, err := em.Marshal([]any{parent[:], c.tokens, extra})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(h.enc.buf, want) {
				t.Fatalf("hand CBOR %x\nlibrary    %x", h.enc.buf, want)
			}
		})
	}
}

func TestHasherRejects(t *testing.T) {
	if _, err := NewHasher("0", 0); err == nil {
		t.Error("block size 0 accepted")
	}
	h, _ := NewHasher("0", 2)
	if _, err := h.BlockHashes(nil, []uint64{1, 2}, [][]any{{3.5}}); err == nil {
		t.Error("float extra key accepted")
	}
}

func TestExternalHashShortBytes(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		want uint64
	}{
		{nil, 0},
		{[]byte{1}, 1},
		{[]byte{1, 0}, 256},
		{bytes.Repeat([]byte{0xff}, 16), 1<<64 - 1},
	} {
		if got := ExternalHash(c.in); got != c.want {
			t.Errorf("ExternalHash(%x) = %d, want %d", c.in, got, c.want)
		}
	}
}

func BenchmarkHash128k(b *testing.B) {
	tokens := make([]uint64, 128*1024)
	x := uint64(12345)
	for i := range tokens {
		x = x*6364136223846793005 + 1442695040888963407
		tokens[i] = (x >> 33) % 151000
	}
	h, _ := NewHasher("0", 16)
	dst := make([]Digest, 0, len(tokens)/16)
	b.SetBytes(int64(len(tokens)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = h.BlockHashes(dst[:0], tokens, nil); err != nil {
			b.Fatal(err)
		}
	}
}
