package kvindex

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// golden mirrors testdata/vllm_golden.json, vectors computed independently
// with Python's cbor2/hashlib/msgpack and cross-checked against vLLM.
type golden struct {
	HashCases []struct {
		Name             string          `json:"name"`
		BlockSize        int             `json:"block_size"`
		Seed             string          `json:"seed"`
		Tokens           []uint64        `json:"tokens"`
		ExtraKeys        json.RawMessage `json:"extra_keys"`
		NoneHashHex      string          `json:"none_hash_hex"`
		FirstBlockCBOR   string          `json:"first_block_cbor_hex"`
		BlockHashesHex   []string        `json:"block_hashes_hex"`
		BlockHashesUint6 []uint64        `json:"block_hashes_uint64"`
	} `json:"hash_cases"`
	Legacy struct {
		BlockSize   int      `json:"block_size"`
		Seed        string   `json:"seed"`
		Tokens      []uint64 `json:"tokens"`
		NoneHash    uint64   `json:"none_hash_uint64"`
		BlockHashes []uint64 `json:"block_hashes_uint64"`
	} `json:"legacy_64bit_case"`
	Hybrid struct {
		HashBlockSize  int      `json:"hash_block_size"`
		GroupBlockSize int      `json:"group_block_size"`
		Tokens         []uint64 `json:"tokens"`
		GroupHex       []string `json:"group_block_hashes_hex"`
		GroupUint64    []uint64 `json:"group_block_hashes_uint64"`
	} `json:"hybrid_case"`
	Payloads []struct {
		Name       string          `json:"name"`
		PayloadHex string          `json:"payload_hex"`
		Decoded    json.RawMessage `json:"decoded"`
	} `json:"msgpack_payloads"`
}

func loadGolden(t testing.TB) golden {
	t.Helper()
	raw, err := os.ReadFile("testdata/vllm_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&g); err != nil {
		t.Fatal(err)
	}
	return g
}

// jsonExtraKeys turns the golden file's extra_keys (JSON arrays standing for
// Python tuples, numbers for ints) into the per-block []any form.
func jsonExtraKeys(t *testing.T, raw json.RawMessage) [][]any {
	t.Helper()
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v []any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var conv func(any) any
	conv = func(x any) any {
		switch y := x.(type) {
		case json.Number:
			n, err := y.Int64()
			if err != nil {
				t.Fatalf("extra key %v: %v", y, err)
			}
			return n
		case []any:
			out := make([]any, len(y))
			for i := range y {
				out[i] = conv(y[i])
			}
			return out
		default:
			return y
		}
	}
	out := make([][]any, len(v))
	for i, b := range v {
		if b == nil {
			continue
		}
		out[i] = conv(b).([]any)
	}
	return out
}

func TestGoldenHashCases(t *testing.T) {
	g := loadGolden(t)
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
			extra := jsonExtraKeys(t, c.ExtraKeys)
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
				if u := got[i].Uint64(); u != c.BlockHashesUint6[i] {
					t.Errorf("block %d uint64 = %d, want %d", i, u, c.BlockHashesUint6[i])
				}
				if u := ExternalHash(got[i][:]); u != c.BlockHashesUint6[i] {
					t.Errorf("block %d ExternalHash = %d, want %d", i, u, c.BlockHashesUint6[i])
				}
			}
			if c.FirstBlockCBOR != "" && len(c.Tokens) >= c.BlockSize {
				var first []any
				if len(extra) > 0 {
					first = extra[0]
				}
				if _, err := h.Block(root, c.Tokens[:c.BlockSize], first); err != nil {
					t.Fatal(err)
				}
				if hx := hex.EncodeToString(h.enc.buf); hx != c.FirstBlockCBOR {
					t.Errorf("first block CBOR = %s, want %s", hx, c.FirstBlockCBOR)
				}
			}
		})
	}
}

func TestGoldenLegacy64(t *testing.T) {
	g := loadGolden(t)
	c := g.Legacy
	if NoneHash(c.Seed).Uint64() != c.NoneHash {
		t.Fatalf("legacy NONE_HASH = %d, want %d", NoneHash(c.Seed).Uint64(), c.NoneHash)
	}
	got, err := Legacy64Hashes(c.Seed, c.BlockSize, c.Tokens)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(c.BlockHashes) {
		t.Fatalf("%d blocks, want %d", len(got), len(c.BlockHashes))
	}
	for i := range got {
		if got[i] != c.BlockHashes[i] {
			t.Errorf("block %d = %d, want %d", i, got[i], c.BlockHashes[i])
		}
	}
}

func TestGoldenHybridConcat(t *testing.T) {
	g := loadGolden(t)
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
	for i := range c.GroupHex {
		grp := ConcatGroupHash(sub[i*per : (i+1)*per])
		if hx := hex.EncodeToString(grp); hx != c.GroupHex[i] {
			t.Errorf("group %d = %s, want %s", i, hx, c.GroupHex[i])
		}
		if u := ExternalHash(grp); u != c.GroupUint64[i] {
			t.Errorf("group %d uint64 = %d, want %d", i, u, c.GroupUint64[i])
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
