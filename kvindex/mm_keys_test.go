package kvindex

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/testutil/golden"
)

// mmCase is one case of testdata/mm_block_hashes.json, which
// testdata/mm_vectors.py computes with hashlib and its own CBOR encoder.
type mmCase struct {
	Name      string   `json:"name"`
	BlockSize int      `json:"block_size"`
	Seed      string   `json:"seed"`
	Tokens    []uint64 `json:"tokens"`
	Items     []struct {
		ID     string `json:"id"`
		Offset int    `json:"offset"`
		Length int    `json:"length"`
	} `json:"items"`
	LoRA      string   `json:"lora"`
	Salt      string   `json:"salt"`
	ExtraKeys []any    `json:"extra_keys"`
	Hex       []string `json:"block_hashes_hex"`
	Uint64    []uint64 `json:"block_hashes_uint64"`
}

func (c mmCase) spec() KeySpec {
	s := KeySpec{BlockSize: c.BlockSize, LoRAName: c.LoRA, CacheSalt: c.Salt}
	for _, it := range c.Items {
		s.MM = append(s.MM, MMItem{ID: it.ID, Offset: it.Offset, Length: it.Length})
	}
	return s
}

func loadMMCases(t *testing.T) []mmCase {
	t.Helper()
	b, err := os.ReadFile("testdata/mm_block_hashes.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Cases []mmCase `json:"cases"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&f); err != nil {
		t.Fatal(err)
	}
	if len(f.Cases) == 0 {
		t.Fatal("no cases")
	}
	return f.Cases
}

// jsonForm is v as the vectors file writes it, for comparison.
func jsonForm(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMMBlockHashVectors: the extra keys derived from each case's items,
// and the engine's block hashes over them, equal the independently
// computed vectors byte for byte.
func TestMMBlockHashVectors(t *testing.T) {
	for _, c := range loadMMCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			s := c.spec()
			n := len(c.Tokens) / c.BlockSize
			extra, err := s.ExtraKeys(n)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := jsonForm(t, extra), jsonForm(t, c.ExtraKeys); got != want {
				t.Fatalf("extra keys\n got %s\nwant %s", got, want)
			}
			h, err := NewHasher(c.Seed, c.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			ds, err := h.BlockHashes(nil, c.Tokens, extra)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) != len(c.Hex) {
				t.Fatalf("%d hashes, want %d", len(ds), len(c.Hex))
			}
			for i, d := range ds {
				if got := hex.EncodeToString(d[:]); got != c.Hex[i] {
					t.Errorf("block %d: %s, want %s", i, got, c.Hex[i])
				}
			}
			eh := EngineHash{Algo: HashSHA256CBOR, Seed: c.Seed}
			u, err := eh.BlockHashes(nil, HashedPrompt{Tokens: c.Tokens, BlockSize: c.BlockSize, LoRAName: c.LoRA, CacheSalt: c.Salt, MM: s.MM})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(u, c.Uint64) {
				t.Errorf("event hashes %v, want %v", u, c.Uint64)
			}
		})
	}
}

// TestMMGoldenNegativeOffset: the shared golden file's multimodal case
// (item "abc123hash" at token 5, 20 tokens long) is what its item gives.
func TestMMGoldenNegativeOffset(t *testing.T) {
	var gc *golden.HashCase
	for i, c := range golden.Load(t).HashCases {
		if c.Name == "bs16_seed42_mm_offset" {
			gc = &golden.Load(t).HashCases[i]
		}
	}
	if gc == nil {
		t.Fatal("golden case bs16_seed42_mm_offset missing")
	}
	s := KeySpec{BlockSize: gc.BlockSize, MM: []MMItem{{ID: "abc123hash", Offset: 5, Length: 20}}}
	extra, err := s.ExtraKeys(len(gc.Tokens) / gc.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(extra, gc.ExtraKeys) {
		t.Fatalf("extra keys %v, want %v", extra, gc.ExtraKeys)
	}
	u, err := EngineHash{Algo: HashSHA256CBOR, Seed: gc.Seed}.BlockHashes(nil, HashedPrompt{Tokens: gc.Tokens, BlockSize: gc.BlockSize, MM: s.MM})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(u, gc.BlockHashesUint64) {
		t.Fatalf("hashes %v, want %v", u, gc.BlockHashesUint64)
	}
}

// TestMMGatewayKeys: a prompt's gateway keys with items equal Keys over
// the per-block extra keys (the form events carry), whole or continued;
// the blocks before the first item keep their text-only keys, and the
// ones it covers differ by identifier.
func TestMMGatewayKeys(t *testing.T) {
	tokens := make([]uint64, 64)
	for i := range tokens {
		tokens[i] = uint64(i % 7)
	}
	s := KeySpec{BlockSize: 8, LoRAName: "ad", MM: []MMItem{{ID: "img", Offset: 19, Length: 20}}}
	extra, err := s.ExtraKeys(8)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Keys(nil, tokens, 8, 0, extra)
	if err != nil {
		t.Fatal(err)
	}
	got, err := RequestKeys(nil, tokens, s)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("RequestKeys %v, want %v", got, want)
	}
	cont, err := ContinueRequestKeys(firstKeys(want, 3), tokens, s)
	if err != nil || !reflect.DeepEqual(cont, want) {
		t.Fatalf("ContinueRequestKeys %v (%v), want %v", cont, err, want)
	}
	text, err := RequestKeys(nil, tokens, KeySpec{BlockSize: 8, LoRAName: "ad"})
	if err != nil {
		t.Fatal(err)
	}
	other := s
	other.MM = []MMItem{{ID: "img2", Offset: 19, Length: 20}}
	otherKeys, err := RequestKeys(nil, tokens, other)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		covered := i >= MMBlocks(s.MM, 8, len(tokens))
		if (want[i] != text[i]) != covered || (want[i] != otherKeys[i]) != covered {
			t.Errorf("block %d (covered %v): keys %x text %x other %x", i, covered, want[i], text[i], otherKeys[i])
		}
	}
	if MMBlocks(s.MM, 8, len(tokens)) != 2 {
		t.Fatalf("MMBlocks %d, want 2", MMBlocks(s.MM, 8, len(tokens)))
	}
}

func firstKeys(k []uint64, n int) []uint64 { return append([]uint64(nil), k[:n]...) }

// TestMMItemsRejected: items vLLM would not produce are an error, not
// keys.
func TestMMItemsRejected(t *testing.T) {
	for name, items := range map[string][]MMItem{
		"no id":       {{Offset: 0, Length: 4}},
		"zero length": {{ID: "a", Offset: 0}},
		"negative":    {{ID: "a", Offset: -1, Length: 4}},
		"unsorted":    {{ID: "a", Offset: 8, Length: 2}, {ID: "b", Offset: 0, Length: 2}},
		"overlapping": {{ID: "a", Offset: 0, Length: 5}, {ID: "b", Offset: 4, Length: 2}},
	} {
		s := KeySpec{BlockSize: 4, MM: items}
		if _, err := RequestKeys(nil, make([]uint64, 16), s); !errors.Is(err, errMMItems) {
			t.Errorf("%s: RequestKeys error %v", name, err)
		}
		if _, err := (EngineHash{Algo: HashSHA256CBOR}).BlockHashes(nil, HashedPrompt{Tokens: make([]uint64, 16), BlockSize: 4, MM: items}); !errors.Is(err, errMMItems) {
			t.Errorf("%s: BlockHashes error %v", name, err)
		}
	}
}

// TestMMMatchAndRecognize: an engine's blocks stored with an image's extra
// keys match a query with the image's item, at a block size the query has
// no keys for, whether its events chain or are orphans recognised by the
// engine's hashing; without the item the match stops before the image.
func TestMMMatchAndRecognize(t *testing.T) {
	const bs = 4
	tokens := prompt(12*bs, 5)
	items := []MMItem{{ID: "photo", Offset: 3*bs + 1, Length: 5 * bs}}
	extra, err := KeySpec{BlockSize: bs, MM: items}.ExtraKeys(12)
	if err != nil {
		t.Fatal(err)
	}
	ix := NewIndex(IndexConfig{})
	_, chained := newHashedFeed(t, ix, "chained", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	_, late := newHashedFeed(t, ix, "late", EngineHash{Algo: HashSHA256CBOR, Seed: "0"})
	e := newEngineSim(t, "0", bs)
	e.msg(chained, e.stored(tokens, extra, 0, 12))
	e.msg(late, e.stored(tokens, extra, 2, 12)) // blocks 0-1 cached before the gateway
	wantMatch(t, ix, Query{Tokens: tokens}, map[string]int{"chained": 3, "late": 3})
	wantMatch(t, ix, Query{Tokens: tokens, MM: items}, map[string]int{"chained": 12, "late": 12})
}
