package kvindex

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/testutil/golden"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// This file is FuzzDecodeBatch's oracle: msgpack/v5's generic decoding of
// the payload, read by vLLM's EventBatch schema independently of the
// Decoder's hand-written parsing. Two kinds of input are outside it
// (errOutside), and the fuzz target does not judge the Decoder on them:
//   - what msgpack/v5 cannot decode generically (truncated values,
//     unregistered extension types, unused codes);
//   - maps with a duplicate string key, which msgpack leaves undefined and
//     msgspec never writes, and nesting deeper than oracleMaxLevel, within
//     which the Decoder's depth limit (maxDepth) cannot trigger.

var errOutside = errors.New("outside the oracle")

// oracleMaxLevel is the deepest nesting the oracle judges, counting the
// batch as level 1 and scalars as a level: the Decoder skips values from
// level 2 on with depth 0, and refuses depth > maxDepth, level 19 at the
// earliest.
const oracleMaxLevel = maxDepth + 2

// mpMap is a msgpack map as the oracle sees it: entries in wire order,
// keys of any type.
type mpMap []struct{ k, v any }

// genericReader decodes one msgpack value into []any, mpMap and the
// scalars msgpack/v5's DecodeInterface returns, noting depth and duplicate
// keys. It walks arrays and maps and reads bins itself so that a length
// announced larger than the input allocates nothing.
type genericReader struct {
	r        *bytes.Reader
	d        *msgpack.Decoder
	maxLevel int
	dupKeys  bool
}

func (g *genericReader) value(level int) (any, error) {
	g.maxLevel = max(g.maxLevel, level)
	c, err := g.d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := g.d.DecodeArrayLen()
		if err != nil || n > g.r.Len() {
			return nil, fmt.Errorf("array of %d: %v", n, err)
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = g.value(level + 1); err != nil {
				return nil, err
			}
		}
		return out, nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := g.d.DecodeMapLen()
		if err != nil || 2*n > g.r.Len() {
			return nil, fmt.Errorf("map of %d: %v", n, err)
		}
		out := make(mpMap, n)
		seen := map[string]bool{}
		for i := range out {
			if out[i].k, err = g.value(level + 1); err != nil {
				return nil, err
			}
			if out[i].v, err = g.value(level + 1); err != nil {
				return nil, err
			}
			if k, ok := out[i].k.(string); ok {
				g.dupKeys = g.dupKeys || seen[k]
				seen[k] = true
			}
		}
		return out, nil
	case c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32:
		// DecodeInterface would allocate the announced length up front.
		n, err := g.d.DecodeBytesLen()
		if err != nil || n > g.r.Len() {
			return nil, fmt.Errorf("bin of %d: %v", n, err)
		}
		b := make([]byte, n)
		return b, g.d.ReadFull(b)
	}
	return g.d.DecodeInterface()
}

// oracleDecode is what Decode must make of p, or errOutside.
func oracleDecode(p []byte) (*Batch, error) {
	r := bytes.NewReader(p)
	g := &genericReader{r: r, d: msgpack.NewDecoder(r)}
	v, err := g.value(1)
	if err != nil {
		return nil, fmt.Errorf("%w: msgpack/v5: %v", errOutside, err)
	}
	if g.dupKeys || g.maxLevel > oracleMaxLevel {
		return nil, errOutside
	}
	if r.Len() != 0 {
		return nil, errors.New("trailing bytes")
	}
	b := &Batch{}
	switch x := v.(type) {
	case []any:
		if len(x) < 2 {
			return nil, errors.New("batch of fewer than 2 elements")
		}
		if b.TS, err = oracleFloat(x[0]); err != nil {
			return nil, err
		}
		if err := oracleEvents(b, x[1]); err != nil {
			return nil, err
		}
		if len(x) >= 3 {
			return b, oracleRank(b, x[2])
		}
		return b, nil
	case mpMap:
		return b, oracleBatchMap(b, x)
	}
	return nil, errors.New("batch is neither array nor map")
}

// oracleBatchMap reads the defensive map form {ts, events,
// data_parallel_rank}; entries with other or non-string keys are ignored.
func oracleBatchMap(b *Batch, m mpMap) error {
	var haveEvents bool
	for _, kv := range m {
		var err error
		switch kv.k {
		case "ts":
			b.TS, err = oracleFloat(kv.v)
		case "events":
			haveEvents, err = true, oracleEvents(b, kv.v)
		case "data_parallel_rank":
			err = oracleRank(b, kv.v)
		}
		if err != nil {
			return err
		}
	}
	if !haveEvents {
		return errors.New("no events")
	}
	return nil
}

func oracleRank(b *Batch, v any) error {
	if v == nil {
		return nil
	}
	n, ok := oracleInt(v)
	if !ok || n < 0 || n > math.MaxInt32 {
		return fmt.Errorf("data_parallel_rank %v", v)
	}
	b.DPRank, b.HasDPRank = int(n), true
	return nil
}

func oracleEvents(b *Batch, v any) error {
	evs, ok := v.([]any)
	if !ok {
		return errors.New("events is not an array")
	}
	for _, x := range evs {
		var ev Event
		var known bool
		var err error
		switch e := x.(type) {
		case []any:
			ev, known, err = oracleArrayEvent(e)
		case mpMap:
			ev, known, err = oracleMapEvent(e)
		}
		if err != nil {
			return err
		}
		if !known {
			b.Unknown++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

// The positional fields of BlockStored and BlockRemoved, after the tag.
var (
	oracleStored = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
		"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	oracleRemoved = []string{"block_hashes", "medium", "group_idx"}
)

// oracleArrayEvent reads a positional event: tag, then the fields of its
// version; fields added by later versions are ignored.
func oracleArrayEvent(a []any) (ev Event, known bool, err error) {
	if len(a) == 0 {
		return ev, false, nil
	}
	var names []string
	switch a[0] {
	case "BlockStored":
		ev.Kind, names = EventBlockStored, oracleStored
		if len(a) < 5 { // up to block_size at least
			return ev, false, errors.New("short BlockStored")
		}
	case "BlockRemoved":
		ev.Kind, names = EventBlockRemoved, oracleRemoved
		if len(a) < 2 {
			return ev, false, errors.New("short BlockRemoved")
		}
	case "AllBlocksCleared":
		return Event{Kind: EventAllBlocksCleared}, true, nil
	default:
		return ev, false, nil // unknown or non-string tag
	}
	for i, name := range names {
		if i+1 < len(a) {
			if err := oracleField(&ev, name, a[i+1]); err != nil {
				return ev, false, err
			}
		}
	}
	return ev, true, nil
}

// oracleMapEvent reads a map event. Every known field is read whatever
// the tag, as the Decoder does (the tag may come last); an event with no
// known tag is unknown.
func oracleMapEvent(m mpMap) (ev Event, known bool, err error) {
	kinds := map[string]EventKind{"BlockStored": EventBlockStored, "BlockRemoved": EventBlockRemoved, "AllBlocksCleared": EventAllBlocksCleared}
	var kind EventKind
	have := map[string]bool{}
	for _, kv := range m {
		key, ok := kv.k.(string)
		switch {
		case !ok:
		case key == "type":
			tag, _ := kv.v.(string)
			kind = kinds[tag] // 0 for an unknown or non-string tag
		case isOracleStored(key) || key == "locality": // map-only (vLLM #48281)
			if err := oracleField(&ev, key, kv.v); err != nil {
				return ev, false, err
			}
			have[key] = true
		}
	}
	ev.Kind = kind
	switch {
	case kind == 0:
		return ev, false, nil
	case kind == EventBlockStored && !(have["block_hashes"] && have["token_ids"] && have["block_size"]):
		return ev, false, errors.New("BlockStored lacks a required field")
	case kind == EventBlockRemoved && !have["block_hashes"]:
		return ev, false, errors.New("BlockRemoved lacks block_hashes")
	}
	return ev, true, nil
}

func isOracleStored(key string) bool {
	for _, n := range oracleStored {
		if n == key {
			return true
		}
	}
	return false
}

// oracleField sets one named field of ev from its generic value.
func oracleField(ev *Event, name string, v any) (err error) {
	switch name {
	case "block_hashes":
		ev.BlockHashes, err = oracleHashes(v)
	case "parent_block_hash":
		if v != nil {
			ev.Parent, err = oracleHash(v)
			ev.HasParent = ev.Parent != 0 // 0 is llm-d's "no parent"
		}
	case "token_ids":
		ev.TokenIDs, err = oracleTokenIDs(v)
	case "block_size":
		n, ok := oracleInt(v)
		if !ok || n < 0 || n > maxBlockSize {
			return fmt.Errorf("block_size %v", v)
		}
		ev.BlockSize = int(n)
	case "lora_id":
		if v != nil {
			var ok bool
			if ev.LoRAID, ok = oracleInt(v); !ok {
				return fmt.Errorf("lora_id %v", v)
			}
			ev.HasLoRAID = true
		}
	case "medium":
		ev.Medium, err = oracleString(v)
	case "lora_name":
		ev.LoRAName, err = oracleString(v)
	case "kv_cache_spec_kind":
		ev.SpecKind, err = oracleString(v)
	case "locality":
		ev.Locality, err = oracleString(v)
	case "extra_keys":
		ev.ExtraKeys, err = oracleExtraKeys(v)
	case "group_idx":
		ev.GroupIdx, err = oracleRange(v, maxGroupIdx-1)
	case "kv_cache_spec_sliding_window":
		ev.SlidingWindow, err = oracleRange(v, math.MaxInt32)
	}
	return err
}

// oracleInt is an integer of any msgpack width that fits an int64.
func oracleInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int8, int16, int32, int64:
		return reflect.ValueOf(x).Int(), true
	case uint8, uint16, uint32, uint64:
		u := reflect.ValueOf(x).Uint()
		return int64(u), u <= math.MaxInt64
	}
	return 0, false
}

// oracleRange is an optional integer in [0, hi]; nil is 0.
func oracleRange(v any, hi int64) (int, error) {
	if v == nil {
		return 0, nil
	}
	n, ok := oracleInt(v)
	if !ok || n < 0 || n > hi {
		return 0, fmt.Errorf("%v out of [0, %d]", v, hi)
	}
	return int(n), nil
}

func oracleString(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	}
	return "", fmt.Errorf("%T is not a string", v)
}

func oracleFloat(v any) (float64, error) {
	switch x := v.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case uint64:
		return float64(x), nil
	}
	if n, ok := oracleInt(v); ok {
		return float64(n), nil
	}
	return 0, fmt.Errorf("ts %T", v)
}

// oracleHash is vLLM's ExternalBlockHash: an int of any sign (its two's
// complement) or bytes, str or bin (ExternalHash).
func oracleHash(v any) (uint64, error) {
	switch x := v.(type) {
	case int8, int16, int32, int64:
		return uint64(reflect.ValueOf(x).Int()), nil
	case uint8, uint16, uint32, uint64:
		return reflect.ValueOf(x).Uint(), nil
	case string:
		return ExternalHash([]byte(x)), nil
	case []byte:
		return ExternalHash(x), nil
	}
	return 0, fmt.Errorf("block hash %T", v)
}

func oracleHashes(v any) ([]uint64, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, errors.New("block_hashes is not an array")
	}
	var out []uint64
	for _, x := range a {
		h, err := oracleHash(x)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// oracleTokenIDs is nil or an array of non-negative ints.
func oracleTokenIDs(v any) ([]uint64, error) {
	if v == nil {
		return nil, nil
	}
	a, ok := v.([]any)
	if !ok {
		return nil, errors.New("token_ids is not an array")
	}
	var out []uint64
	for _, x := range a {
		if u, ok := x.(uint64); ok { // beyond int64
			out = append(out, u)
			continue
		}
		n, ok := oracleInt(x)
		if !ok || n < 0 {
			return nil, fmt.Errorf("token id %v", x)
		}
		out = append(out, uint64(n))
	}
	return out, nil
}

// oracleExtraKeys is nil, or one nil or tuple per block.
func oracleExtraKeys(v any) ([][]any, error) {
	if v == nil {
		return nil, nil
	}
	a, ok := v.([]any)
	if !ok {
		return nil, errors.New("extra_keys is not an array")
	}
	out := [][]any{}
	for _, x := range a {
		if x == nil {
			out = append(out, nil)
			continue
		}
		if _, ok := x.([]any); !ok {
			return nil, fmt.Errorf("extra keys tuple %T", x)
		}
		t, err := oracleValue(x)
		if err != nil {
			return nil, err
		}
		out = append(out, t.([]any))
	}
	return out, nil
}

// oracleValue is an extra-key value as the Event documents it: ints as
// int64 (uint64 beyond), floats as float64, str as string, bin as []byte;
// maps and extension types never occur in vLLM's hash inputs.
func oracleValue(v any) (any, error) {
	switch x := v.(type) {
	case nil, bool, string, []byte, float64:
		return x, nil
	case float32:
		return float64(x), nil
	case uint64:
		if x > math.MaxInt64 {
			return x, nil
		}
	case []any:
		out := make([]any, len(x))
		for i := range x {
			var err error
			if out[i], err = oracleValue(x[i]); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	if n, ok := oracleInt(v); ok {
		return n, nil
	}
	return nil, fmt.Errorf("extra key value %T", v)
}

// batchDiff describes how got differs from want, or is "".
func batchDiff(got, want *Batch) string {
	if math.Float64bits(got.TS) != math.Float64bits(want.TS) || got.DPRank != want.DPRank ||
		got.HasDPRank != want.HasDPRank || got.Unknown != want.Unknown || len(got.Events) != len(want.Events) {
		return fmt.Sprintf("batch ts %v rank %d/%v unknown %d, %d events; want ts %v rank %d/%v unknown %d, %d events",
			got.TS, got.DPRank, got.HasDPRank, got.Unknown, len(got.Events), want.TS, want.DPRank, want.HasDPRank, want.Unknown, len(want.Events))
	}
	for i := range got.Events {
		g, w := normEvent(got.Events[i]), normEvent(want.Events[i])
		if !sameValue(g.ExtraKeys, w.ExtraKeys) || (g.ExtraKeys == nil) != (w.ExtraKeys == nil) {
			return fmt.Sprintf("event %d extra keys %#v, want %#v", i, g.ExtraKeys, w.ExtraKeys)
		}
		g.ExtraKeys, w.ExtraKeys = nil, nil
		if !reflect.DeepEqual(g, w) {
			return fmt.Sprintf("event %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	return ""
}

// sameValue compares decoded values: floats by bits (NaN included) and
// []byte by content (nil and empty alike), the nil/empty distinction of
// extra-key tuples kept.
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case float64:
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	case []any:
		y, ok := b.([]any)
		return ok && len(x) == len(y) && (x == nil) == (y == nil) && all(len(x), func(i int) bool { return sameValue(x[i], y[i]) })
	case [][]any:
		y, ok := b.([][]any)
		return ok && len(x) == len(y) && all(len(x), func(i int) bool {
			return (x[i] == nil) == (y[i] == nil) && sameValue(x[i], y[i])
		})
	}
	return a == b
}

func all(n int, f func(int) bool) bool {
	for i := range n {
		if !f(i) {
			return false
		}
	}
	return true
}

// TestOracleJudgesGolden: the golden payloads are inside the oracle and it
// reads them as the Decoder does, so the fuzz target's comparison is live.
func TestOracleJudgesGolden(t *testing.T) {
	for _, p := range golden.Load(t).Payloads {
		want, err := oracleDecode(p.Payload)
		if err != nil {
			t.Fatalf("%s: oracle: %v", p.Name, err)
		}
		got, err := DecodeBatch(p.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if diff := batchDiff(got, want); diff != "" {
			t.Errorf("%s: %s", p.Name, diff)
		}
	}
	for _, c := range []struct {
		name    string
		p       []byte
		outside bool
	}{
		{"trailing byte", append(payload(arr{1.0, arr{}}), 0), false},
		{"negative token", payload(arr{1.0, arr{arr{"BlockStored", arr{1}, nil, arr{-1}, 16}}}), false},
		{"bin medium", payload(arr{1.0, arr{arr{"BlockRemoved", arr{1}, []byte("GPU")}}}), false},
		{"duplicate key", payload(omap{"events", arr{}, "events", arr{}}), true},
		{"truncated", payload(arr{1.0})[:1], true},
	} {
		_, err := oracleDecode(c.p)
		if err == nil || errors.Is(err, errOutside) != c.outside {
			t.Errorf("%s: oracle error %v, want outside=%v", c.name, err, c.outside)
		}
	}
}
