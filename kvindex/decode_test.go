package kvindex

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/testutil/golden"
	"github.com/vmihailenco/msgpack/v5"
)

// goldenEvent builds the expected Event from a golden "decoded" event, an
// independent reading of the JSON the Python reference produced: arrays by
// position, maps by key, {"bytes_hex": ...} for bin hashes.
func goldenEvent(t *testing.T, v any) (Event, bool) {
	t.Helper()
	var ev Event
	get := map[string]any{}
	switch x := v.(type) {
	case []any:
		tag := x[0].(string)
		var names []string
		switch tag {
		case "BlockStored":
			names = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
				"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
		case "BlockRemoved":
			names = []string{"block_hashes", "medium", "group_idx"}
		}
		get["type"] = tag
		for i, n := range names {
			if i+1 < len(x) {
				get[n] = x[i+1]
			}
		}
	case map[string]any:
		get = x
	default:
		t.Fatalf("golden event %T", v)
	}
	switch get["type"] {
	case "BlockStored":
		ev.Kind = EventBlockStored
	case "BlockRemoved":
		ev.Kind = EventBlockRemoved
	case "AllBlocksCleared":
		ev.Kind = EventAllBlocksCleared
	default:
		return ev, false
	}
	hash := func(v any) uint64 {
		switch h := v.(type) {
		case json.Number:
			return jsonUint64(t, h)
		case map[string]any:
			b, err := hex.DecodeString(h["bytes_hex"].(string))
			if err != nil {
				t.Fatal(err)
			}
			return ExternalHash(b)
		}
		t.Fatalf("golden hash %T", v)
		return 0
	}
	for k, val := range get {
		if val == nil {
			continue
		}
		switch k {
		case "block_hashes":
			for _, h := range val.([]any) {
				ev.BlockHashes = append(ev.BlockHashes, hash(h))
			}
		case "parent_block_hash":
			ev.Parent, ev.HasParent = hash(val), true
		case "token_ids":
			for _, tok := range val.([]any) {
				ev.TokenIDs = append(ev.TokenIDs, jsonUint64(t, tok.(json.Number)))
			}
		case "block_size":
			ev.BlockSize = int(jsonUint64(t, val.(json.Number)))
		case "lora_id":
			n, _ := val.(json.Number).Int64()
			ev.LoRAID, ev.HasLoRAID = n, true
		case "medium":
			ev.Medium = val.(string)
		case "lora_name":
			ev.LoRAName = val.(string)
		case "extra_keys":
			ev.ExtraKeys = [][]any{}
			for _, e := range val.([]any) {
				if e == nil {
					ev.ExtraKeys = append(ev.ExtraKeys, nil)
				} else {
					ev.ExtraKeys = append(ev.ExtraKeys, jsonValue(t, e).([]any))
				}
			}
		case "group_idx":
			ev.GroupIdx = int(jsonUint64(t, val.(json.Number)))
		case "kv_cache_spec_kind":
			ev.SpecKind = val.(string)
		case "kv_cache_spec_sliding_window":
			ev.SlidingWindow = int(jsonUint64(t, val.(json.Number)))
		}
	}
	return ev, true
}

func jsonUint64(t *testing.T, n json.Number) uint64 {
	t.Helper()
	if i, err := n.Int64(); err == nil {
		return uint64(i)
	}
	var u uint64
	if err := json.Unmarshal([]byte(n.String()), &u); err != nil {
		t.Fatalf("number %s: %v", n, err)
	}
	return u
}

func jsonValue(t *testing.T, v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		return jsonUint64(t, x)
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = jsonValue(t, x[i])
		}
		return out
	}
	return v
}

// normEvent makes empty and nil hash/token slices compare equal; ExtraKeys
// keeps the nil/empty distinction (absent vs present).
func normEvent(ev Event) Event {
	if len(ev.BlockHashes) == 0 {
		ev.BlockHashes = nil
	}
	if len(ev.TokenIDs) == 0 {
		ev.TokenIDs = nil
	}
	return ev
}

func TestDecodeGoldenPayloads(t *testing.T) {
	g := golden.Load(t)
	if len(g.Payloads) < 7 {
		t.Fatalf("%d golden payloads, want 7", len(g.Payloads))
	}
	dec := NewDecoder()
	for _, p := range g.Payloads {
		t.Run(p.Name, func(t *testing.T) {
			raw, want := p.Payload, p.Decoded
			for _, b := range []func() (*Batch, error){
				func() (*Batch, error) { return DecodeBatch(raw) },
				func() (*Batch, error) { return dec.Decode(raw) }, // reused decoder
			} {
				got, err := b()
				if err != nil {
					t.Fatal(err)
				}
				ts, _ := want[0].(json.Number).Float64()
				if got.TS != ts {
					t.Errorf("ts = %v, want %v", got.TS, ts)
				}
				if len(want) >= 3 && want[2] != nil {
					r, _ := want[2].(json.Number).Int64()
					if !got.HasDPRank || got.DPRank != int(r) {
						t.Errorf("dp rank = %d/%v, want %d", got.DPRank, got.HasDPRank, r)
					}
				} else if got.HasDPRank {
					t.Errorf("dp rank %d present, want absent", got.DPRank)
				}
				wevs := want[1].([]any)
				if len(got.Events) != len(wevs) || got.Unknown != 0 {
					t.Fatalf("%d events (%d unknown), want %d", len(got.Events), got.Unknown, len(wevs))
				}
				for i, wv := range wevs {
					we, ok := goldenEvent(t, wv)
					if !ok {
						t.Fatalf("golden event %d has an unknown type", i)
					}
					if ge := normEvent(got.Events[i]); !reflect.DeepEqual(ge, normEvent(we)) {
						t.Errorf("event %d:\n got %+v\nwant %+v", i, ge, normEvent(we))
					}
				}
			}
		})
	}
}

// enc builds msgpack payloads for tests with msgpack/v5's own encoder.
type enc struct {
	buf bytes.Buffer
	e   *msgpack.Encoder
}

func newEnc() *enc {
	x := &enc{}
	x.e = msgpack.NewEncoder(&x.buf)
	x.e.UseCompactInts(true)
	return x
}

func (x *enc) v(vals ...any) *enc {
	for _, v := range vals {
		switch y := v.(type) {
		case arr:
			must(x.e.EncodeArrayLen(len(y)))
			x.v(y...)
		case omap:
			must(x.e.EncodeMapLen(len(y) / 2))
			x.v(y...)
		case raw:
			x.buf.Write(y)
		default:
			must(x.e.Encode(v))
		}
	}
	return x
}

func (x *enc) bytes() []byte { return bytes.Clone(x.buf.Bytes()) }

type (
	arr  []any // encoded as an array
	omap []any // key, value, ... encoded as a map in this order
	raw  []byte
)

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func payload(vals ...any) []byte { return newEnc().v(vals...).bytes() }

var tok32 = func() []any {
	out := make([]any, 32)
	for i := range out {
		out[i] = i
	}
	return out
}()

func TestDecodeArrayLengths(t *testing.T) {
	hashes := arr{uint64(12687895063098490012), int64(-5)}
	base := []any{"BlockStored", hashes, nil, arr(tok32), 16}
	tail := []any{7, "GPU", "my-lora", arr{nil, arr{"s", int64(-3)}}, 2, "full_attention", 128}
	for n := 5; n <= 12; n++ {
		ev := append(append([]any{}, base...), tail[:n-5]...)
		p := payload(arr{1.5, arr{arr(ev)}, 0})
		b, err := DecodeBatch(p)
		if err != nil {
			t.Fatalf("%d elements: %v", n, err)
		}
		if len(b.Events) != 1 {
			t.Fatalf("%d elements: %d events", n, len(b.Events))
		}
		e := b.Events[0]
		want := Event{Kind: EventBlockStored, BlockHashes: []uint64{12687895063098490012, math.MaxUint64 - 4},
			TokenIDs: make([]uint64, 32), BlockSize: 16}
		for i := range want.TokenIDs {
			want.TokenIDs[i] = uint64(i)
		}
		if n > 5 {
			want.LoRAID, want.HasLoRAID = 7, true
		}
		if n > 6 {
			want.Medium = "GPU"
		}
		if n > 7 {
			want.LoRAName = "my-lora"
		}
		if n > 8 {
			want.ExtraKeys = [][]any{nil, {"s", int64(-3)}}
		}
		if n > 9 {
			want.GroupIdx = 2
		}
		if n > 10 {
			want.SpecKind = "full_attention"
		}
		if n > 11 {
			want.SlidingWindow = 128
		}
		if !reflect.DeepEqual(e, want) {
			t.Errorf("%d elements:\n got %+v\nwant %+v", n, e, want)
		}
	}
	// Future versions append fields: ignored.
	p := payload(arr{1.5, arr{arr(append(append(append([]any{}, base...), tail...), "future", arr{1, 2}))}, 0})
	if b, err := DecodeBatch(p); err != nil || len(b.Events) != 1 || b.Events[0].SlidingWindow != 128 {
		t.Errorf("13 elements: %v", err)
	}
	for n, ev := range map[int]arr{
		2: {"BlockRemoved", arr{1, 2}},
		3: {"BlockRemoved", arr{1, 2}, "CPU"},
		4: {"BlockRemoved", arr{1, 2}, "cpu", 3},
	} {
		b, err := DecodeBatch(payload(arr{1.5, arr{ev}}))
		if err != nil || len(b.Events) != 1 {
			t.Fatalf("BlockRemoved %d: %v", n, err)
		}
		e := b.Events[0]
		if e.Kind != EventBlockRemoved || !reflect.DeepEqual(e.BlockHashes, []uint64{1, 2}) {
			t.Errorf("BlockRemoved %d: %+v", n, e)
		}
		if (n >= 3) != (e.Medium != "") || (n == 4) != (e.GroupIdx == 3) {
			t.Errorf("BlockRemoved %d: medium %q group %d", n, e.Medium, e.GroupIdx)
		}
	}
	b, err := DecodeBatch(payload(arr{1.5, arr{arr{"AllBlocksCleared"}}}))
	if err != nil || len(b.Events) != 1 || b.Events[0].Kind != EventAllBlocksCleared || b.HasDPRank {
		t.Fatalf("AllBlocksCleared in 2-element batch: %+v %v", b, err)
	}
}

func TestDecodeMapForms(t *testing.T) {
	stored := omap{
		"future_key", arr{1, omap{"x", 2}},
		"block_size", 2,
		"type", "BlockStored",
		"token_ids", arr{1, 2, 3, 4},
		"block_hashes", arr{[]byte{1, 2}, bytes.Repeat([]byte{0xab}, 40)},
		"medium", "CPU",
		"group_idx", 1,
		7, "non-string key",
	}
	removed := omap{"block_hashes", arr{int64(math.MinInt64)}, "type", "BlockRemoved"}
	cleared := omap{"type", "AllBlocksCleared", "ownership", nil}
	unknown := omap{"type", "BlockMoved", "block_hashes", arr{1}}
	for name, p := range map[string][]byte{
		"array batch": payload(arr{int64(3), arr{stored, removed, cleared, unknown}, nil}),
		"map batch":   payload(omap{"events", arr{stored, removed, cleared, unknown}, "ts", int64(3), "other", 1}),
	} {
		b, err := DecodeBatch(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b.TS != 3 || b.HasDPRank || b.Unknown != 1 || len(b.Events) != 3 {
			t.Fatalf("%s: %+v", name, b)
		}
		want := Event{Kind: EventBlockStored, BlockSize: 2, TokenIDs: []uint64{1, 2, 3, 4},
			BlockHashes: []uint64{0x0102, 0xabababababababab}, Medium: "CPU", GroupIdx: 1}
		if !reflect.DeepEqual(b.Events[0], want) {
			t.Errorf("%s stored:\n got %+v\nwant %+v", name, b.Events[0], want)
		}
		if e := b.Events[1]; e.Kind != EventBlockRemoved || e.BlockHashes[0] != 1<<63 {
			t.Errorf("%s removed: %+v", name, e)
		}
		if b.Events[2].Kind != EventAllBlocksCleared {
			t.Errorf("%s cleared: %+v", name, b.Events[2])
		}
	}
}

// TestDecodeMapBatchNonStringKey: an entry with a non-string key is skipped
// whole. The batch map used to skip only the key and read its value as the
// next key (found by FuzzDecodeBatch's oracle).
func TestDecodeMapBatchNonStringKey(t *testing.T) {
	for name, p := range map[string][]byte{
		"value looks like a key": payload(omap{1, "ts", "events", arr{arr{"AllBlocksCleared"}}}),
		"value is a container":   payload(omap{"events", arr{arr{"AllBlocksCleared"}}, arr{1}, omap{"ts", 9}, "ts", 2}),
	} {
		b, err := DecodeBatch(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(b.Events) != 1 || b.Events[0].Kind != EventAllBlocksCleared || b.TS == 9 {
			t.Fatalf("%s: %+v", name, b)
		}
	}
}

func TestDecodeHashWidths(t *testing.T) {
	for _, c := range []struct {
		v    any
		want uint64
	}{
		{int64(-1), math.MaxUint64},
		{int64(-100), math.MaxUint64 - 99},
		{int64(-40000), math.MaxUint64 - 39999},
		{int64(-3000000000), math.MaxUint64 - 2999999999},
		{int64(math.MinInt64), 1 << 63},
		{uint64(math.MaxUint64), math.MaxUint64},
		{uint64(200), 200},
		{uint64(70000), 70000},
		{[]byte{}, 0},
		{[]byte{0xff}, 0xff},
		{bytes.Repeat([]byte{1}, 64), 0x0101010101010101},
	} {
		b, err := DecodeBatch(payload(arr{0.0, arr{arr{"BlockRemoved", arr{c.v}}}}))
		if err != nil {
			t.Fatalf("%v: %v", c.v, err)
		}
		if got := b.Events[0].BlockHashes[0]; got != c.want {
			t.Errorf("hash %v = %#x, want %#x", c.v, got, c.want)
		}
	}
	// Token ids: any non-negative 64-bit value, in any int encoding.
	p := payload(arr{0.0, arr{arr{"BlockStored", arr{1}, nil, arr{uint64(math.MaxUint64), int64(5), int64(math.MaxInt64)}, 3, nil}}})
	b, err := DecodeBatch(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Events[0].TokenIDs; !reflect.DeepEqual(got, []uint64{math.MaxUint64, 5, math.MaxInt64}) {
		t.Errorf("tokens = %v", got)
	}
	// Every integer encoding another encoder might choose for a token.
	tokBytes := raw{0x9a, 0x05, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xce, 0, 1, 0, 0, 0xcf, 1, 0, 0, 0, 0, 0, 0, 0,
		0xd0, 0x7f, 0xd1, 0x7f, 0xff, 0xd2, 0x7f, 0xff, 0xff, 0xff, 0xd3, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00}
	p = payload(raw{0x92}, 0.0, raw{0x91, 0x96}, "BlockStored", arr{1}, nil, tokBytes, 10, nil)
	b, err = DecodeBatch(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{5, 255, 256, 65536, 1 << 56, 127, 32767, math.MaxInt32, math.MaxInt64, 0}
	if got := b.Events[0].TokenIDs; !reflect.DeepEqual(got, want) {
		t.Errorf("tokens = %v, want %v", got, want)
	}
	for _, neg := range []raw{{0xff}, {0xd0, 0x80}, {0xd1, 0xff, 0xff}, {0xd2, 0x80, 0, 0, 0}, {0xd3, 0xff, 0, 0, 0, 0, 0, 0, 0}, {0xcd, 0x01}} {
		p := payload(raw{0x92}, 0.0, raw{0x91, 0x96}, "BlockStored", arr{1}, nil, raw{0x91}, neg, 1, nil)
		if _, err := DecodeBatch(p); err == nil {
			t.Errorf("token %x accepted", neg)
		}
	}
}

func TestDecodeHostile(t *testing.T) {
	huge32 := func(code byte) []byte { return []byte{code, 0xff, 0xff, 0xff, 0xff} }
	cases := map[string][]byte{
		"empty":                {},
		"not a batch":          payload("hello"),
		"short batch":          payload(arr{1.0}),
		"events not array":     payload(arr{1.0, "x"}),
		"ts not number":        payload(arr{"x", arr{}}),
		"huge batch array":     huge32(cArray32),
		"huge events array":    append(payload(raw{0x92}, 1.0), huge32(cArray32)...),
		"huge map":             append(payload(raw{0x92}, 1.0), huge32(cMap32)...),
		"huge token array":     append(payload(raw{0x93}, 1.0, raw{0x91, 0x96}, "BlockStored", arr{1}, nil), huge32(cArray32)...),
		"huge string":          append(payload(raw{0x92}, 1.0, raw{0x91, 0x92}), huge32(cStr32)...),
		"huge bin hash":        append(payload(raw{0x92}, 1.0, raw{0x91, 0x92}, "BlockRemoved", raw{0x91}), huge32(cBin32)...),
		"huge ext skipped":     append(payload(raw{0x92}, 1.0, raw{0x91, 0x92}, "Other"), 0xc9, 0xff, 0xff, 0xff, 0xff, 1),
		"truncated":            payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1, 2}, 2, nil}}})[:20],
		"negative token":       payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1, -2}, 2, nil}}}),
		"string token":         payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1, "2"}, 2, nil}}}),
		"float hash":           payload(arr{1.0, arr{arr{"BlockRemoved", arr{1.5}}}}),
		"short stored":         payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1, 2}}}}),
		"short removed":        payload(arr{1.0, arr{arr{"BlockRemoved"}}}),
		"nil block size":       payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1, 2}, nil, nil}}}),
		"negative block size":  payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1, 2}, -2, nil}}}),
		"huge group":           payload(arr{1.0, arr{arr{"BlockRemoved", arr{1}, "GPU", 1 << 40}}}),
		"map extra key":        payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1}, 1, nil, nil, nil, arr{arr{omap{"a", 1}}}}}}),
		"scalar extra key":     payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1}, 1, nil, nil, nil, arr{"a"}}}}),
		"map missing tokens":   payload(arr{1.0, arr{omap{"type", "BlockStored", "block_hashes", arr{1}, "block_size", 1}}}),
		"map missing hashes":   payload(arr{1.0, arr{omap{"type", "BlockRemoved"}}}),
		"batch map no events":  payload(omap{"ts", 1.0}),
		"trailing bytes":       append(payload(arr{1.0, arr{}}), 0),
		"deep nesting":         append(payload(raw{0x92}, 1.0, raw{0x91, 0x92}, "Other"), bytes.Repeat([]byte{0x91}, 100000)...),
		"deep extra keys":      append(payload(raw{0x92}, 1.0, raw{0x91, 0x99}, "BlockStored", arr{1}, nil, arr{1}, 1, nil, nil, nil, raw{0x91}), bytes.Repeat([]byte{0x91}, 1000)...),
		"huge map in skip":     append(payload(raw{0x92}, 1.0, raw{0x91, 0x92}, "Other"), huge32(cMap32)...),
		"dp rank not int":      payload(arr{1.0, arr{}, "x"}),
		"block size too large": payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{1}, 1 << 30, nil}}}),
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			before := totalAlloc()
			b, err := DecodeBatch(p)
			if d := totalAlloc() - before; d > 1<<20 {
				t.Errorf("decoding %d bytes allocated %d bytes", len(p), d)
			}
			if err == nil {
				t.Errorf("no error; decoded %+v", b)
			}
		})
	}
}

// totalAlloc is the process's cumulative heap allocation in bytes.
func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

func TestDecodeUnknownEventShapes(t *testing.T) {
	p := payload(arr{1.0, arr{
		arr{},
		arr{7, "x"},
		arr{"BlockEvicted", arr{1}, omap{"a", arr{1, 2}}, []byte{1, 2, 3}},
		omap{"type", 5},
		omap{"no_type", 1},
		"a string",
		12,
		arr{"AllBlocksCleared", "extra field"},
	}, 1})
	b, err := DecodeBatch(p)
	if err != nil {
		t.Fatal(err)
	}
	if b.Unknown != 7 || len(b.Events) != 1 || b.Events[0].Kind != EventAllBlocksCleared || b.DPRank != 1 {
		t.Fatalf("got %+v", b)
	}
}

func TestDecoderReuseDoesNotLeak(t *testing.T) {
	d := NewDecoder()
	p1 := payload(arr{1.0, arr{arr{"BlockStored", arr{1, 2}, 9, arr{1, 2, 3, 4}, 2, nil, "GPU", "l", arr{nil, arr{"x"}}, 1}}, 0})
	p2 := payload(arr{1.0, arr{arr{"BlockStored", arr{3}, nil, arr{5}, 1, nil}}, 0})
	if _, err := d.Decode(p1); err != nil {
		t.Fatal(err)
	}
	b, err := d.Decode(p2)
	if err != nil {
		t.Fatal(err)
	}
	want := Event{Kind: EventBlockStored, BlockHashes: []uint64{3}, TokenIDs: []uint64{5}, BlockSize: 1}
	if !reflect.DeepEqual(b.Events[0], want) {
		t.Fatalf("second decode carries state:\n got %+v\nwant %+v", b.Events[0], want)
	}
}

func TestDecodeErrorsNameTheField(t *testing.T) {
	_, err := DecodeBatch(payload(arr{1.0, arr{omap{"type", "BlockStored", "token_ids", arr{-1}}}}))
	if err == nil || !strings.Contains(err.Error(), "token_ids") {
		t.Fatalf("error %v does not name token_ids", err)
	}
}

// FuzzDecodeBatch checks the Decoder against oracleDecode, msgpack/v5's
// generic decoding of the same payload read by vLLM's schema: both accept
// the same payloads (within the oracle's scope) and decode the same events,
// field by field. A reused and a fresh Decoder must agree on every input.
func FuzzDecodeBatch(f *testing.F) {
	for _, p := range golden.Load(f).Payloads {
		f.Add(p.Payload)
	}
	// Ranks, offload media, hybrid groups with kinds, locality.
	for _, p := range vectorPayloads(f) {
		f.Add(p)
	}
	f.Add(payload(omap{"events", arr{omap{"type", "BlockRemoved", "block_hashes", arr{[]byte{1}}}}, "ts", 1}))
	f.Add(payload(arr{1.0, arr{arr{"X", omap{"a", arr{1}}}}}))
	f.Add(payload(arr{float32(2), arr{arr{"BlockStored", arr{-1, "ab"}, []byte{7}, nil, 0, -3, nil, nil, arr{nil, arr{arr{}, -1, uint64(math.MaxUint64), 1.5, []byte{}}}}}, nil}))
	// Every integer width, signed and unsigned, where ids and hashes go: one
	// flipped bit away from the negative or oversized values they refuse.
	widths := arr{raw{0xd0, 5}, raw{0xd1, 1, 0}, raw{0xd2, 0, 0, 1, 0}, raw{0xd3, 0, 0, 0, 0, 0, 0, 1, 0},
		raw{0xcc, 200}, raw{0xcd, 1, 0}, raw{0xce, 0, 0, 1, 0}, raw{0xcf, 0, 0, 0, 0, 0, 0, 1, 0}}
	f.Add(payload(arr{1.0, arr{arr{"BlockStored", widths, raw{0xd1, 1, 0}, widths, raw{0xd1, 0, 16}, raw{0xd3, 0, 0, 0, 0, 0, 0, 0, 1}}}, raw{0xd2, 0, 0, 0, 1}}))
	for _, neg := range []raw{{0xd0, 0x80}, {0xd1, 0x81, 0}, {0xd2, 0x80, 0, 0, 1}, {0xd3, 0x80, 0, 0, 0, 0, 0, 0, 1}} {
		f.Add(payload(arr{1.0, arr{arr{"BlockStored", arr{neg}, nil, arr{neg}, 16}}}))
	}
	d := NewDecoder()
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := d.Decode(p)
		if b2, err2 := DecodeBatch(p); (err == nil) != (err2 == nil) || (err == nil && batchDiff(b, b2) != "") {
			t.Fatalf("%x: reused and fresh Decoder disagree: %v, %v", p, err, err2)
		}
		if err == nil {
			for _, ev := range b.Events {
				if len(ev.TokenIDs) > len(p) || len(ev.BlockHashes) > len(p) {
					t.Fatalf("decoded more elements than payload bytes")
				}
			}
		}
		want, werr := oracleDecode(p)
		if errors.Is(werr, errOutside) {
			return
		}
		if (err == nil) != (werr == nil) {
			t.Fatalf("%x: Decoder error %v, oracle error %v", p, err, werr)
		}
		if err != nil {
			return
		}
		if diff := batchDiff(b, want); diff != "" {
			t.Fatalf("%x: Decoder and oracle differ: %s", p, diff)
		}
	})
}

// TestDecodeParentZeroIsNone: llm-d-inference-sim's array format writes
// parent_block_hash 0 for a prompt's first block, which llm-d's consumers
// read as no parent; nil and a real hash keep their meaning, in both
// wire shapes.
func TestDecodeParentZeroIsNone(t *testing.T) {
	tests := []struct {
		name       string
		parent     any
		wantHas    bool
		wantParent uint64
	}{
		{"nil", nil, false, 0},
		{"int 0", 0, false, 0},
		{"bytes of zeros", make([]byte, 32), false, 0},
		{"a hash", uint64(0xfedcba9876543210), true, 0xfedcba9876543210},
		{"a negative (builtin hash) int", int64(-1), true, math.MaxUint64},
	}
	for _, tc := range tests {
		for shape, ev := range map[string]any{
			"array": arr{"BlockStored", arr{7}, tc.parent, arr{1, 2}, 2, nil, "GPU"},
			"map":   omap{"type", "BlockStored", "block_hashes", arr{7}, "parent_block_hash", tc.parent, "token_ids", arr{1, 2}, "block_size", 2},
		} {
			b, err := DecodeBatch(payload(arr{1.0, arr{ev}, 0}))
			if err != nil || len(b.Events) != 1 {
				t.Fatalf("%s, %s: %+v %v", tc.name, shape, b, err)
			}
			if e := b.Events[0]; e.HasParent != tc.wantHas || e.Parent != tc.wantParent && tc.wantHas {
				t.Errorf("%s, %s: parent %#x has %v, want %#x has %v", tc.name, shape, e.Parent, e.HasParent, tc.wantParent, tc.wantHas)
			}
		}
	}
}
