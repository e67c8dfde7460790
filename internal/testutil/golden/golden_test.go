package golden

import (
	"encoding/binary"
	"encoding/json"
	"reflect"
	"testing"
)

// TestBigIntegersExact checks the 64-bit hashes survive decoding: the
// uint64 form of every block hash must be the last 8 bytes of its digest,
// which a float64 round trip would break for most of them.
func TestBigIntegersExact(t *testing.T) {
	f := Load(t)
	if len(f.HashCases) < 10 {
		t.Fatalf("%d hash cases", len(f.HashCases))
	}
	above53 := 0
	for _, c := range f.HashCases {
		if len(c.BlockHashes) != len(c.BlockHashesUint64) {
			t.Fatalf("%s: %d digests, %d uint64s", c.Name, len(c.BlockHashes), len(c.BlockHashesUint64))
		}
		for i, d := range c.BlockHashes {
			if u := binary.BigEndian.Uint64(d[24:]); u != c.BlockHashesUint64[i] {
				t.Errorf("%s block %d: digest ends in %d, uint64 form %d", c.Name, i, u, c.BlockHashesUint64[i])
			}
			if c.BlockHashesUint64[i] > 1<<53 {
				above53++
			}
		}
	}
	if above53 == 0 {
		t.Fatal("no hash above 2^53: the check above proves nothing")
	}
	// The decoded payloads keep their numbers as text.
	h := f.Payloads[0].Decoded[1].([]any)[0].(map[string]any)["block_hashes"].([]any)[0]
	if h != json.Number("12687895063098490012") {
		t.Fatalf("first decoded hash %#v", h)
	}
}

func TestExtraKeysTyped(t *testing.T) {
	f := Load(t)
	want := map[string][][]any{
		"bs16_seed0_32tok":      nil,
		"bs16_seed0_cache_salt": {{"tenant-a"}, nil},
		"bs16_seed42_mm_offset": {{[]any{"abc123hash", int64(5)}}, {[]any{"abc123hash", int64(-11)}}, nil},
	}
	for _, c := range f.HashCases {
		if w, ok := want[c.Name]; ok {
			if !reflect.DeepEqual(c.ExtraKeys, w) {
				t.Errorf("%s: extra keys %#v, want %#v", c.Name, c.ExtraKeys, w)
			}
			delete(want, c.Name)
		}
	}
	if len(want) != 0 {
		t.Fatalf("cases missing: %v", want)
	}
}

func TestHexDecoded(t *testing.T) {
	f := Load(t)
	z := f.ZMQ
	if string(z.Frame0) != z.Topic || binary.BigEndian.Uint64(z.Frame1) != z.Seq {
		t.Errorf("frames %q %x for topic %q seq %d", z.Frame0, z.Frame1, z.Topic, z.Seq)
	}
	if len(z.ReplayRequest) != 2 || len(z.ReplayRequest[0]) != 0 || len(z.ReplayRequest[1]) != 8 || len(z.EndSeq) != 8 {
		t.Errorf("replay frames %x, end %x", z.ReplayRequest, z.EndSeq)
	}
	for _, p := range f.Payloads {
		if len(p.Payload) != len(p.PayloadHex)/2 || len(p.Payload) == 0 {
			t.Errorf("%s: %d bytes from %d hex digits", p.Name, len(p.Payload), len(p.PayloadHex))
		}
	}
}

// TestParseIsFresh: tests may modify what they load.
func TestParseIsFresh(t *testing.T) {
	a, b := Load(t), Load(t)
	a.HashCases[0].Tokens[0] = 99
	if b.HashCases[0].Tokens[0] == 99 {
		t.Fatal("two loads share memory")
	}
}
