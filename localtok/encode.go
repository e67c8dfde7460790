package localtok

import (
	"slices"
	"strconv"
	"sync"
	"unsafe"
)

// The tokenizer writes ids as int; the gateway keeps them as uint64, as
// vLLM's block hashing reads them. Token ids are never negative, so where
// int is 64 bits wide an id has the same bits either way, and the
// tokenizer can append straight into the caller's []uint64: an 8k-token
// prompt is spared a copy of its 64 KiB of ids, about 7 µs of the ~45 µs
// its local path took (BenchmarkTokenizeChat/qwen3/8k-words). Where int is
// narrower the ids go through a pooled []int and are copied.

// encode appends the ids of text to dst.
func (m *Model) encode(dst []uint64, text string, addSpecial bool) []uint64 {
	if strconv.IntSize == 64 {
		return m.encodeInPlace(dst, text, addSpecial)
	}
	return m.encodeCopied(dst, text, addSpecial)
}

// encodeInPlace is encode where int is 64 bits wide: dst's memory is
// handed to the tokenizer as []int, and what it returns (dst, or the
// larger array append moved it to) is read back as []uint64. Both views
// hold no pointers, so the collector treats either array alike; the
// tokenizer only appends, so dst's own elements are never read as int.
// Only where int is 64 bits wide: elsewhere the views would not line up.
func (m *Model) encodeInPlace(dst []uint64, text string, addSpecial bool) []uint64 {
	if strconv.IntSize != 64 {
		panic("localtok: encodeInPlace needs a 64-bit int")
	}
	ints := unsafe.Slice((*int)(unsafe.Pointer(unsafe.SliceData(dst))), cap(dst))[:len(dst)]
	ints = m.tok.AppendEncode(ints, text, addSpecial)
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(ints))), cap(ints))[:len(ints)]
}

// idBuffers is a documented pool of the []int buffers encodeCopied has
// the tokenizer write into: a long prompt's ids take 8 bytes each, and a
// fresh buffer per request was a quarter of what the local path
// allocated. Buffers beyond maxPooledIDs ids are dropped rather than kept.
var idBuffers = sync.Pool{New: func() any { return new([]int) }}

const maxPooledIDs = 1 << 17

// encodeCopied is encode through a pooled []int, for any width of int.
func (m *Model) encodeCopied(dst []uint64, text string, addSpecial bool) []uint64 {
	bp := idBuffers.Get().(*[]int)
	ids := m.tok.AppendEncode((*bp)[:0], text, addSpecial)
	n := len(dst)
	dst = slices.Grow(dst, len(ids))[:n+len(ids)]
	for i, id := range ids {
		dst[n+i] = uint64(id)
	}
	if cap(ids) <= maxPooledIDs {
		*bp = ids[:0]
		idBuffers.Put(bp)
	}
	return dst
}
