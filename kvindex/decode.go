package kvindex

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// Decoder limits. A payload can only announce as many elements as it has
// bytes left, which bounds allocation by the payload size; the depth limit
// bounds recursion on nested arrays and maps.
const (
	maxDepth     = 16
	maxBlockSize = 1 << 20
	maxGroupIdx  = 1 << 10
)

var errTrailing = errors.New("trailing bytes after batch")

// Decoder decodes vLLM event batches. It reuses its buffers, so decoding a
// steady stream allocates almost nothing; the Batch it returns is only valid
// until the next call. A Decoder is not safe for concurrent use.
//
// Its memory follows the batches it decoded recently, not the largest
// ever: every event's hashes and token ids are carved from one buffer per
// batch (per-event buffers would each keep the largest event ever decoded
// at their position: megabytes per engine after a while of prefill chunks
// among evictions), and buffers far larger than the recent batches needed
// are given back.
type Decoder struct {
	br      bytes.Reader
	payload []byte // what br reads, for the token fast path
	md      *msgpack.Decoder
	buf     []byte
	batch   Batch
	// u64 holds the block hashes and token ids of the batch's events,
	// extra their ExtraKeys (so extra_keys [nil, ...], which every recent
	// vLLM sends, does not allocate), back to back.
	u64   []uint64
	extra [][]any
	// used is the current batch's use of each buffer; peak the largest
	// over the current trim window of decodes.
	used, peak bufUse
	decodes    int
}

// bufUse counts the elements of each Decoder buffer one batch used.
type bufUse struct{ events, u64, extra, buf int }

// A Decoder looks at its buffers every trimWindow batches and reallocates
// any holding more than 4× (and more than its minimum below) what the
// largest batch of the window needed, at 2× that: a buffer is reallocated
// at most once per window, at the cost of copying nothing, and a steady
// stream never triggers it.
const (
	trimWindow   = 64
	minEventsCap = 16
	minU64Cap    = 512
	minExtraCap  = 128
	minBufCap    = 256
)

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	d := &Decoder{}
	// bytes.Reader is an io.ByteScanner, so msgpack reads it directly
	// without buffering: br.Len() is exactly the payload left.
	d.md = msgpack.NewDecoder(&d.br)
	return d
}

// DecodeBatch decodes one payload into a freshly allocated Batch.
func DecodeBatch(payload []byte) (*Batch, error) {
	b, err := NewDecoder().Decode(payload)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Decode decodes one EventBatch payload: a 2- or 3-element array
// [ts, events, dp_rank] (or, defensively, a map with those keys) whose events
// are positional arrays or maps. Unknown event tags are counted and skipped;
// malformed known events fail the whole batch, since silently dropping a
// removal would leave the mirror claiming a block the engine no longer has.
func (d *Decoder) Decode(payload []byte) (b *Batch, err error) {
	d.trim()
	d.br.Reset(payload)
	d.payload = payload
	b = &d.batch
	b.TS, b.DPRank, b.HasDPRank, b.Unknown = 0, 0, false, 0
	b.Events = b.Events[:0]
	defer func() {
		// Last line of defence: the decoder is written not to panic, but
		// an engine must never be able to crash the gateway.
		if r := recover(); r != nil {
			b, err = nil, fmt.Errorf("kvindex: decode panic: %v", r)
		}
	}()
	if err := d.batchBody(b); err != nil {
		return nil, fmt.Errorf("kvindex: decode batch: %w", err)
	}
	if d.br.Len() != 0 {
		return nil, fmt.Errorf("kvindex: decode batch: %w (%d)", errTrailing, d.br.Len())
	}
	return b, nil
}

// trim accounts the previous batch's buffer use, empties the buffers for
// the next one and, at the end of a window, shrinks the oversized ones.
func (d *Decoder) trim() {
	u := d.used
	u.events = len(d.batch.Events) + 1 // events() may hold one more slot
	d.peak = bufUse{max(d.peak.events, u.events), max(d.peak.u64, u.u64), max(d.peak.extra, u.extra), max(d.peak.buf, u.buf)}
	d.used = bufUse{}
	// Events of the last batch may point at tuples decoded for it.
	clear(d.extra)
	d.u64, d.extra = d.u64[:0], d.extra[:0]
	if d.decodes++; d.decodes < trimWindow {
		return
	}
	p := d.peak
	d.peak, d.decodes = bufUse{}, 0
	if oversized(cap(d.batch.Events), p.events, minEventsCap) {
		d.batch.Events = make([]Event, 0, 2*p.events)
	}
	if oversized(cap(d.u64), p.u64, minU64Cap) {
		d.u64 = make([]uint64, 0, 2*p.u64)
	}
	if oversized(cap(d.extra), p.extra, minExtraCap) {
		d.extra = make([][]any, 0, 2*p.extra)
	}
	if oversized(cap(d.buf), p.buf, minBufCap) {
		d.buf = make([]byte, 0, 2*p.buf)
	}
}

func oversized(capacity, peak, minCap int) bool { return capacity > minCap && capacity > 4*peak }

// takeU64 returns an empty slice with room for exactly n values, carved
// from the batch's buffer: appending n values never allocates or touches
// another event's values.
func (d *Decoder) takeU64(n int) []uint64 {
	if n == 0 {
		return nil
	}
	d.used.u64 += n
	return carve(&d.u64, n, minU64Cap)
}

// takeExtra is takeU64 for ExtraKeys (never nil: an empty extra_keys is
// not an absent one).
func (d *Decoder) takeExtra(n int) [][]any {
	if n == 0 {
		return [][]any{}
	}
	d.used.extra += n
	return carve(&d.extra, n, minExtraCap)
}

// carve takes room for n more elements off the end of *buf, growing it to
// a new array when full; slices carved before keep the old array until the
// batch is done with.
func carve[T any](buf *[]T, n, minCap int) []T {
	b := *buf
	l := len(b)
	if cap(b)-l < n {
		b = make([]T, 0, max(2*cap(b), n, minCap))
		l = 0
	}
	*buf = b[:l+n]
	return b[l : l : l+n]
}

func (d *Decoder) batchBody(b *Batch) error {
	c, err := d.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("batch array has %d elements, want 2 or 3", n)
		}
		if b.TS, err = d.float(); err != nil {
			return fmt.Errorf("ts: %w", err)
		}
		if err := d.events(b); err != nil {
			return err
		}
		if n >= 3 {
			if err := d.dpRank(b); err != nil {
				return err
			}
		}
		return d.skipN(n-3, 0)
	case isMap(c):
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		var haveEvents bool
		for i := 0; i < n; i++ {
			key, ok, err := d.key()
			if err != nil {
				return err
			}
			if !ok {
				// key() skipped the non-string key; skip its value.
				if err := d.skip(0); err != nil {
					return err
				}
				continue
			}
			var name string
			switch string(key) {
			case "ts":
				name = "ts"
				b.TS, err = d.float()
			case "events":
				name, haveEvents = "events", true
				err = d.events(b)
			case "data_parallel_rank":
				name = "data_parallel_rank"
				err = d.dpRank(b)
			default:
				name = "unknown"
				err = d.skip(0)
			}
			if err != nil {
				return fmt.Errorf("batch field %s: %w", name, err)
			}
		}
		if !haveEvents {
			return errors.New("batch map without events")
		}
		return nil
	}
	return fmt.Errorf("batch is not an array or map (code %#x)", c)
}

func (d *Decoder) dpRank(b *Batch) error {
	v, ok, err := d.optInt()
	if err != nil {
		return fmt.Errorf("data_parallel_rank: %w", err)
	}
	if ok {
		if v < 0 || v > math.MaxInt32 {
			return fmt.Errorf("data_parallel_rank %d out of range", v)
		}
		b.DPRank, b.HasDPRank = int(v), true
	}
	return nil
}

func (d *Decoder) events(b *Batch) error {
	n, err := d.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := 0; i < n; i++ {
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:len(b.Events)+1]
		} else {
			b.Events = append(b.Events, Event{})
		}
		ev := &b.Events[len(b.Events)-1]
		*ev = Event{}
		known, err := d.event(ev)
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if !known {
			b.Events = b.Events[:len(b.Events)-1]
			b.Unknown++
		}
	}
	return nil
}

// Field positions of the positional BlockStored and BlockRemoved arrays,
// element 0 being the tag.
const (
	stHashes = iota + 1
	stParent
	stTokens
	stBlockSize
	stLoRAID
	stMedium
	stLoRAName
	stExtraKeys
	stGroupIdx
	stSpecKind
	stSlidingWindow
	stFields
	// Map-only fields: added after vLLM dropped the positional encoding
	// (#42892), so they have no array position.
	stLocality = 100
)

const (
	rmHashes = iota + 1
	rmMedium
	rmGroupIdx
	rmFields
)

// event decodes one event into ev; known is false for a skipped unknown one.
func (d *Decoder) event(ev *Event) (known bool, err error) {
	c, err := d.peek()
	if err != nil {
		return false, err
	}
	switch {
	case isArray(c):
		return d.arrayEvent(ev)
	case isMap(c):
		return d.mapEvent(ev)
	}
	return false, d.skip(0)
}

func (d *Decoder) arrayEvent(ev *Event) (bool, error) {
	n, err := d.arrayLen()
	if err != nil || n == 0 {
		return false, err
	}
	tag, ok, err := d.key()
	if err != nil {
		return false, err
	}
	if !ok {
		return false, d.skipN(n-1, 0)
	}
	var fields int
	switch string(tag) {
	case "BlockStored":
		// tag + hashes, parent, token_ids, block_size at least; the
		// trailing lora_id and later fields depend on the version.
		if n < stLoRAID {
			return false, fmt.Errorf("BlockStored has %d elements, want at least %d", n, stLoRAID)
		}
		ev.Kind, fields = EventBlockStored, stFields
		for i := 1; i < n && i < stFields; i++ {
			if err := d.storedField(ev, i); err != nil {
				return false, fmt.Errorf("BlockStored element %d: %w", i, err)
			}
		}
	case "BlockRemoved":
		if n < rmMedium {
			return false, fmt.Errorf("BlockRemoved has %d elements, want at least %d", n, rmMedium)
		}
		ev.Kind, fields = EventBlockRemoved, rmFields
		for i := 1; i < n && i < rmFields; i++ {
			if err := d.removedField(ev, i); err != nil {
				return false, fmt.Errorf("BlockRemoved element %d: %w", i, err)
			}
		}
	case "AllBlocksCleared":
		ev.Kind, fields = EventAllBlocksCleared, 1
	default:
		return false, d.skipN(n-1, 0)
	}
	// Fields added by later versions are ignored.
	return true, d.skipN(n-fields, 0)
}

func (d *Decoder) storedField(ev *Event, i int) error {
	var err error
	switch i {
	case stHashes:
		ev.BlockHashes, err = d.hashes()
	case stParent:
		ev.Parent, ev.HasParent, err = d.optHash()
		// 0 means no parent too: llm-d-inference-sim writes 0 for the
		// first block of a prompt in its array format, and llm-d's
		// consumers read it so (kvblock.EmptyBlockHash). No real chained
		// hash is 0 but by a 2^-64 chance.
		ev.HasParent = ev.HasParent && ev.Parent != 0
	case stTokens:
		ev.TokenIDs, err = d.tokens()
	case stBlockSize:
		var v int64
		var ok bool
		if v, ok, err = d.optInt(); err == nil {
			if !ok || v < 0 || v > maxBlockSize {
				return fmt.Errorf("block_size %d (present %v) out of range", v, ok)
			}
			ev.BlockSize = int(v)
		}
	case stLoRAID:
		ev.LoRAID, ev.HasLoRAID, err = d.optInt()
	case stMedium:
		ev.Medium, err = d.optString()
	case stLoRAName:
		ev.LoRAName, err = d.optString()
	case stExtraKeys:
		ev.ExtraKeys, err = d.extraKeys()
	case stGroupIdx:
		ev.GroupIdx, err = d.groupIdx()
	case stSpecKind:
		ev.SpecKind, err = d.optString()
	case stLocality:
		ev.Locality, err = d.optString()
	case stSlidingWindow:
		var v int64
		if v, _, err = d.optInt(); err == nil {
			if v < 0 || v > math.MaxInt32 {
				return fmt.Errorf("kv_cache_spec_sliding_window %d out of range", v)
			}
			ev.SlidingWindow = int(v)
		}
	}
	return err
}

func (d *Decoder) removedField(ev *Event, i int) error {
	var err error
	switch i {
	case rmHashes:
		ev.BlockHashes, err = d.hashes()
	case rmMedium:
		ev.Medium, err = d.optString()
	case rmGroupIdx:
		ev.GroupIdx, err = d.groupIdx()
	}
	return err
}

// mapEvent decodes a map-encoded event (vLLM after #42892): keys by name in
// any order, unknown keys ignored, absent optional keys left at nil.
func (d *Decoder) mapEvent(ev *Event) (bool, error) {
	n, err := d.mapLen()
	if err != nil {
		return false, err
	}
	var kind EventKind
	var unknownTag bool
	var haveHashes, haveTokens, haveBlockSize bool
	// The tag may come after the fields (msgspec writes it first, others
	// need not), so decode every known field and judge at the end.
	for i := 0; i < n; i++ {
		key, ok, err := d.key()
		if err != nil {
			return false, err
		}
		if !ok {
			// key() skipped the non-string key; skip its value.
			if err := d.skip(0); err != nil {
				return false, err
			}
			continue
		}
		f := -1
		switch string(key) {
		case "type":
			tag, ok, err := d.key()
			if err != nil {
				return false, fmt.Errorf("type: %w", err)
			}
			switch {
			case !ok:
				unknownTag = true
			case string(tag) == "BlockStored":
				kind = EventBlockStored
			case string(tag) == "BlockRemoved":
				kind = EventBlockRemoved
			case string(tag) == "AllBlocksCleared":
				kind = EventAllBlocksCleared
			default:
				unknownTag = true
			}
			continue
		case "block_hashes":
			f, haveHashes = stHashes, true
		case "parent_block_hash":
			f = stParent
		case "token_ids":
			f, haveTokens = stTokens, true
		case "block_size":
			f, haveBlockSize = stBlockSize, true
		case "lora_id":
			f = stLoRAID
		case "medium":
			f = stMedium
		case "lora_name":
			f = stLoRAName
		case "extra_keys":
			f = stExtraKeys
		case "group_idx":
			f = stGroupIdx
		case "kv_cache_spec_kind":
			f = stSpecKind
		case "kv_cache_spec_sliding_window":
			f = stSlidingWindow
		case "locality":
			f = stLocality
		}
		if f < 0 {
			if err := d.skip(0); err != nil {
				return false, err
			}
			continue
		}
		if err := d.storedField(ev, f); err != nil {
			return false, fmt.Errorf("field %s: %w", fieldName(f), err)
		}
	}
	if unknownTag || kind == 0 {
		return false, nil
	}
	ev.Kind = kind
	switch kind {
	case EventBlockStored:
		if !haveHashes || !haveTokens || !haveBlockSize {
			return false, errors.New("BlockStored map lacks block_hashes, token_ids or block_size")
		}
	case EventBlockRemoved:
		if !haveHashes {
			return false, errors.New("BlockRemoved map lacks block_hashes")
		}
	}
	return true, nil
}

func fieldName(f int) string {
	if f == stLocality {
		return "locality"
	}
	return [...]string{"", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
		"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
		"kv_cache_spec_sliding_window"}[f]
}

func (d *Decoder) groupIdx() (int, error) {
	v, _, err := d.optInt()
	if err != nil {
		return 0, err
	}
	if v < 0 || v >= maxGroupIdx {
		return 0, fmt.Errorf("group_idx %d out of range", v)
	}
	return int(v), nil
}

// hash reads one ExternalBlockHash: an int of any width or sign (two's
// complement to uint64) or bytes of any length (ExternalHash).
func (d *Decoder) hash(c byte) (uint64, error) {
	switch {
	case isInt(c):
		// DecodeUint64 sign-extends negative ints: two's complement.
		return d.md.DecodeUint64()
	case isBin(c), isStr(c):
		b, err := d.rawBytes()
		if err != nil {
			return 0, err
		}
		return ExternalHash(b), nil
	}
	return 0, fmt.Errorf("block hash: expected int or bytes, got code %#x", c)
}

func (d *Decoder) optHash() (uint64, bool, error) {
	c, err := d.peek()
	if err != nil {
		return 0, false, err
	}
	if c == cNil {
		_, err := d.br.ReadByte()
		return 0, false, err
	}
	h, err := d.hash(c)
	return h, err == nil, err
}

func (d *Decoder) hashes() ([]uint64, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	dst := d.takeU64(n)
	for i := 0; i < n; i++ {
		c, err := d.peek()
		if err != nil {
			return dst, err
		}
		h, err := d.hash(c)
		if err != nil {
			return dst, fmt.Errorf("block hash %d: %w", i, err)
		}
		dst = append(dst, h)
	}
	return dst, nil
}

// tokens reads token ids: non-negative ints of any width.
func (d *Decoder) tokens() ([]uint64, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	if c == cNil {
		_, err := d.br.ReadByte()
		return nil, err
	}
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	return d.tokenList(d.takeU64(n), n)
}

// tokenList parses n token ids straight from the payload: they are most of
// every BlockStored, and going through the Decoder's io.Reader calls per
// byte costs several times more. The accepted encodings are the ones
// DecodeUint64/DecodeInt64 accept, minus negative values.
func (d *Decoder) tokenList(dst []uint64, n int) ([]uint64, error) {
	p := d.payload[len(d.payload)-d.br.Len():]
	i := 0
	for k := 0; k < n; k++ {
		if i >= len(p) {
			return dst, fmt.Errorf("token %d: %w", k, io.ErrUnexpectedEOF)
		}
		c := p[i]
		var w int // bytes after the code
		switch {
		case c <= 0x7f:
			dst = append(dst, uint64(c))
			i++
			continue
		case c == cUint8 || c == cInt8:
			w = 1
		case c == cUint16 || c == cInt16:
			w = 2
		case c == cUint32 || c == cInt32:
			w = 4
		case c == cUint64 || c == cInt64:
			w = 8
		case c >= 0xe0:
			return dst, fmt.Errorf("token %d: negative token id %d", k, int8(c))
		default:
			return dst, fmt.Errorf("token %d: expected integer, got code %#x", k, c)
		}
		if i+1+w > len(p) {
			return dst, fmt.Errorf("token %d: %w", k, io.ErrUnexpectedEOF)
		}
		var v uint64
		for _, x := range p[i+1 : i+1+w] {
			v = v<<8 | uint64(x)
		}
		if c >= cInt8 && v>>(8*w-1) != 0 {
			return dst, fmt.Errorf("token %d: negative token id", k)
		}
		dst = append(dst, v)
		i += 1 + w
	}
	_, err := d.br.Seek(int64(i), io.SeekCurrent)
	return dst, err
}

// extraKeys reads extra_keys: nil, or an array with one nil or tuple per
// block.
func (d *Decoder) extraKeys() ([][]any, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	if c == cNil {
		_, err := d.br.ReadByte()
		return nil, err
	}
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	dst := d.takeExtra(n)
	for i := 0; i < n; i++ {
		c, err := d.peek()
		if err != nil {
			return nil, err
		}
		if c == cNil {
			if _, err := d.br.ReadByte(); err != nil {
				return nil, err
			}
			dst = append(dst, nil)
			continue
		}
		if !isArray(c) {
			return nil, fmt.Errorf("extra keys of block %d: expected array or nil, got code %#x", i, c)
		}
		v, err := d.value(1)
		if err != nil {
			return nil, fmt.Errorf("extra keys of block %d: %w", i, err)
		}
		dst = append(dst, v.([]any))
	}
	return dst, nil
}
