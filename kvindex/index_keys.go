package kvindex

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// The index is keyed by the gateway's own chained hash of block tokens, not
// by the engine's hash: key_i = xxh64(seed = key_{i-1}, tokens_i ‖ extra_i),
// with key_{-1} derived from the KV-cache group. It does not depend on the
// engine's PYTHONHASHSEED or hash algorithm, so events can be used even when
// the engine's hashes cannot be reproduced. Keys only live in this process,
// which is why hashing the in-memory bytes of the token slice is fine.

// rootKey is the chain's starting value for a KV-cache group, so equal token
// blocks in different groups (which vLLM gives equal hashes) get different
// keys.
func rootKey(group int) uint64 {
	// splitmix64 finaliser over a constant offset: any fixed injective mix
	// would do.
	z := uint64(group) + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// keyHasher computes chained gateway keys. Not safe for concurrent use.
type keyHasher struct {
	d   xxhash.Digest
	buf []byte
}

func tokenBytes(t []uint64) []byte {
	if len(t) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t))), len(t)*8)
}

// next returns the key of the block holding tokens after parent's block.
func (h *keyHasher) next(parent uint64, tokens []uint64, extra []any) (uint64, error) {
	if len(extra) == 0 {
		// Most blocks (all of a base-model prompt's): one short hash.
		return sum64Seed(parent, tokenBytes(tokens)), nil
	}
	h.d.ResetWithSeed(parent)
	_, _ = h.d.Write(tokenBytes(tokens))
	if len(extra) > 0 {
		var err error
		// A marker, then a self-delimiting encoding: a block with extra
		// keys never hashes like one without.
		h.buf, err = appendExtra(append(h.buf[:0], 0xee), extra)
		if err != nil {
			return 0, err
		}
		_, _ = h.d.Write(h.buf)
	}
	return h.d.Sum64(), nil
}

// appendExtra writes a canonical, unambiguous encoding of extra-key values:
// equal values (int64(5) and uint64(5) included) encode equally.
func appendExtra(b []byte, vals []any) ([]byte, error) {
	b = binary.AppendUvarint(append(b, 'T'), uint64(len(vals)))
	for _, v := range vals {
		var err error
		if b, err = appendValue(b, v); err != nil {
			return b, err
		}
	}
	return b, nil
}

func appendValue(b []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(b, 'n'), nil
	case bool:
		if x {
			return append(b, 't'), nil
		}
		return append(b, 'f'), nil
	case int:
		return appendInt(b, int64(x)), nil
	case int8:
		return appendInt(b, int64(x)), nil
	case int16:
		return appendInt(b, int64(x)), nil
	case int32:
		return appendInt(b, int64(x)), nil
	case int64:
		return appendInt(b, x), nil
	case uint:
		return appendUint(b, uint64(x)), nil
	case uint8:
		return appendUint(b, uint64(x)), nil
	case uint16:
		return appendUint(b, uint64(x)), nil
	case uint32:
		return appendUint(b, uint64(x)), nil
	case uint64:
		return appendUint(b, x), nil
	case float64:
		return binary.LittleEndian.AppendUint64(append(b, 'd'), math.Float64bits(x)), nil
	case float32:
		return binary.LittleEndian.AppendUint64(append(b, 'd'), math.Float64bits(float64(x))), nil
	case string:
		return append(binary.AppendUvarint(append(b, 's'), uint64(len(x))), x...), nil
	case []byte:
		return append(binary.AppendUvarint(append(b, 'b'), uint64(len(x))), x...), nil
	case []any:
		return appendExtra(b, x)
	case []string:
		b = binary.AppendUvarint(append(b, 'T'), uint64(len(x)))
		for _, s := range x {
			b = append(binary.AppendUvarint(append(b, 's'), uint64(len(s))), s...)
		}
		return b, nil
	}
	return b, fmt.Errorf("kvindex: extra key of type %T cannot be keyed", v)
}

func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return appendUint(b, uint64(v))
	}
	return binary.LittleEndian.AppendUint64(append(b, '-'), uint64(v))
}

func appendUint(b []byte, v uint64) []byte {
	return binary.LittleEndian.AppendUint64(append(b, '+'), v)
}

var errBlockSize = errors.New("kvindex: block size must be positive")

// Keys appends to dst the gateway keys of every full block of tokens (a
// partial tail is never keyed, as vLLM never caches it) for an engine with
// the given block size and KV-cache group. extra, when not nil, holds block
// i's extra keys at extra[i], in vLLM's order (LoRA name, multimodal
// identifiers, cache salt on block 0); see RequestExtraKeys.
func Keys(dst, tokens []uint64, blockSize, group int, extra [][]any) ([]uint64, error) {
	if blockSize <= 0 {
		return dst, errBlockSize
	}
	var h keyHasher
	key := rootKey(group)
	n := len(tokens) / blockSize
	for i := 0; i < n; i++ {
		var e []any
		if i < len(extra) {
			e = extra[i]
		}
		var err error
		if key, err = h.next(key, tokens[i*blockSize:(i+1)*blockSize], e); err != nil {
			return dst, fmt.Errorf("block %d: %w", i, err)
		}
		dst = append(dst, key)
	}
	return dst, nil
}

// KeySpec is what a prompt's block keys depend on besides its tokens: the
// engine's block size and KV-cache group, and the request's LoRA adapter,
// cache salt and multimodal items (vLLM's extra keys, see BlockExtraKeys).
type KeySpec struct {
	BlockSize int
	Group     int
	LoRAName  string
	CacheSalt string
	// MM are the prompt's multimodal items, sorted by offset; none for a
	// text-only prompt.
	MM []MMItem
}

// RequestKeys is Keys for a request whose extra keys are its LoRA
// adapter, cache salt and multimodal items (see KeySpec.BlockExtraKeys),
// without materialising them per block.
func RequestKeys(dst, tokens []uint64, s KeySpec) ([]uint64, error) {
	return requestKeysFrom(dst, 0, tokens, s)
}

// ContinueRequestKeys is RequestKeys for a prompt whose first len(known)
// block keys are known already (those of a prompt with the same first
// len(known)*blockSize tokens, adapter and salt): it appends the keys of
// the blocks after them to known, hashing only those.
func ContinueRequestKeys(known, tokens []uint64, s KeySpec) ([]uint64, error) {
	if s.BlockSize > 0 && len(known) > len(tokens)/s.BlockSize {
		return known, fmt.Errorf("kvindex: %d keys known for a prompt of %d blocks", len(known), len(tokens)/s.BlockSize)
	}
	return requestKeysFrom(known, len(known), tokens, s)
}

// requestKeysFrom appends to dst the keys of tokens' blocks from block
// from on, dst ending with block from-1's key when from > 0.
func requestKeysFrom(dst []uint64, from int, tokens []uint64, s KeySpec) ([]uint64, error) {
	if err := s.Validate(); err != nil {
		return dst, err
	}
	blockSize := s.BlockSize
	first, rest := RequestBlockExtraKeys(s.LoRAName, s.CacheSalt)
	var h keyHasher
	key := rootKey(s.Group)
	if from > 0 {
		key = dst[len(dst)-1]
	}
	n := len(tokens) / blockSize
	for i := from; i < n; i++ {
		e := rest
		switch {
		case len(s.MM) > 0:
			e = s.BlockExtraKeys(i)
		case i == 0:
			e = first
		}
		var err error
		if key, err = h.next(key, tokens[i*blockSize:(i+1)*blockSize], e); err != nil {
			return dst, fmt.Errorf("block %d: %w", i, err)
		}
		dst = append(dst, key)
	}
	return dst, nil
}

// RequestBlockExtraKeys returns the extra keys vLLM hashes into block 0
// and into every later block of a text-only request: the LoRA adapter name
// on every block, then the cache salt on block 0 only (vLLM's
// generate_block_hash_extra_keys: LoRA, multimodal, salt). Nil means none.
// RequestExtraKeys spells them out per block.
func RequestBlockExtraKeys(loraName, cacheSalt string) (first, rest []any) {
	if loraName != "" {
		rest = []any{loraName}
	}
	switch {
	case loraName != "" && cacheSalt != "":
		first = []any{loraName, cacheSalt}
	case cacheSalt != "":
		first = []any{cacheSalt}
	default:
		first = rest
	}
	return first, rest
}

// RequestExtraKeys returns the per-block extra keys vLLM hashes for a
// text-only request of nBlocks blocks: the LoRA adapter name on every block
// and the cache salt on block 0 only. It returns nil when both are empty.
// KeySpec.ExtraKeys adds a prompt's multimodal items.
func RequestExtraKeys(loraName, cacheSalt string, nBlocks int) [][]any {
	if (loraName == "" && cacheSalt == "") || nBlocks <= 0 {
		return nil
	}
	first, rest := RequestBlockExtraKeys(loraName, cacheSalt)
	out := make([][]any, nBlocks)
	out[0] = first
	for i := 1; i < nBlocks; i++ {
		out[i] = rest
	}
	return out
}
