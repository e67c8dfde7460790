package kvindex

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"math"
)

// Digest is a vLLM block hash as computed by the sha256_cbor algorithm: the
// SHA-256 of the canonical CBOR encoding of (parent, tokens, extra keys).
type Digest [32]byte

// Uint64 returns the form vLLM publishes in KV events when
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (its default): the last 8 bytes of
// the digest read big-endian.
func (d Digest) Uint64() uint64 { return binary.BigEndian.Uint64(d[24:]) }

// ExternalHash converts a hash as it appears on the wire (bytes of any
// length) to the uint64 form. It takes the last 8 bytes big-endian and
// left-pads shorter values with zeros, which is the same mapping vLLM applies
// to its own digests, so int and bytes events for one block agree.
func ExternalHash(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// NoneHash returns vLLM's NONE_HASH for sha256_cbor: the digest of the
// PYTHONHASHSEED value encoded as a CBOR text string. The parent of block 0.
// Newer vLLM (#51875) uses the seed "vllm-none-hash" when the variable is
// unset; older releases use random bytes, which no gateway can reproduce.
func NoneHash(seed string) Digest {
	var e cborEncoder
	e.text(seed)
	return sha256.Sum256(e.buf)
}

// Hasher computes vLLM's chained block hashes (sha256_cbor) for one
// PYTHONHASHSEED and block size. It is not safe for concurrent use; it keeps
// its scratch buffers to hash long prompts without allocating per block.
type Hasher struct {
	blockSize int
	root      Digest
	enc       cborEncoder
	sha       hash.Hash
	sum       []byte
}

// NewHasher returns a Hasher for the given seed and block size. blockSize
// must be positive.
func NewHasher(seed string, blockSize int) (*Hasher, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("kvindex: block size %d must be positive", blockSize)
	}
	return &Hasher{blockSize: blockSize, root: NoneHash(seed), sha: sha256.New(), sum: make([]byte, 0, sha256.Size)}, nil
}

// BlockSize returns the number of tokens per hashed block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Root returns the NONE_HASH this Hasher chains from.
func (h *Hasher) Root() Digest { return h.root }

// BlockHashes appends to dst the digests of every full block of tokens and
// returns the extended slice. A partial tail block is never hashed, as in
// vLLM. extra, when not nil, holds the extra keys of block i at extra[i] (nil
// for a block without any); see ExtraKeys for the accepted value types.
func (h *Hasher) BlockHashes(dst []Digest, tokens []uint64, extra [][]any) ([]Digest, error) {
	parent := h.root
	n := len(tokens) / h.blockSize
	for i := 0; i < n; i++ {
		var keys []any
		if i < len(extra) {
			keys = extra[i]
		}
		d, err := h.Block(parent, tokens[i*h.blockSize:(i+1)*h.blockSize], keys)
		if err != nil {
			return dst, fmt.Errorf("block %d: %w", i, err)
		}
		dst = append(dst, d)
		parent = d
	}
	return dst, nil
}

// Block hashes one block given its parent digest: SHA-256 over the canonical
// CBOR of [parent, [tokens...], extra|null]. A nil or empty extra encodes as
// null, as vLLM never hashes an empty extra-key tuple.
func (h *Hasher) Block(parent Digest, tokens []uint64, extra []any) (Digest, error) {
	e := &h.enc
	e.buf = e.buf[:0]
	e.head(majorArray, 3)
	e.bytes(parent[:])
	e.head(majorArray, uint64(len(tokens)))
	for _, t := range tokens {
		e.head(majorUint, t)
	}
	if len(extra) == 0 {
		e.null()
	} else if err := e.value(extra); err != nil {
		return Digest{}, err
	}
	h.sha.Reset()
	h.sha.Write(e.buf)
	var d Digest
	copy(d[:], h.sha.Sum(h.sum[:0]))
	return d, nil
}

// Legacy64Hashes computes vLLM v0.10.0–v0.10.1's sha256_cbor_64bit chain:
// every value, the root included, is the low 64 bits of a sha256_cbor digest,
// and the integer parent is what is chained.
func Legacy64Hashes(seed string, blockSize int, tokens []uint64) ([]uint64, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("kvindex: block size %d must be positive", blockSize)
	}
	root := NoneHash(seed)
	parent := root.Uint64()
	var e cborEncoder
	out := make([]uint64, 0, len(tokens)/blockSize)
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		e.buf = e.buf[:0]
		e.head(majorArray, 3)
		e.head(majorUint, parent)
		e.head(majorArray, uint64(blockSize))
		for _, t := range tokens[i : i+blockSize] {
			e.head(majorUint, t)
		}
		e.null()
		d := Digest(sha256.Sum256(e.buf))
		parent = d.Uint64()
		out = append(out, parent)
	}
	return out, nil
}

// ConcatGroupHash builds the hash of a KV-cache group block that spans
// several hash blocks (hybrid models): the byte concatenation of the
// sub-block digests. Its event form is ExternalHash of the result, i.e. the
// uint64 of the last sub-block.
func ConcatGroupHash(sub []Digest) []byte {
	out := make([]byte, 0, len(sub)*len(Digest{}))
	for _, d := range sub {
		out = append(out, d[:]...)
	}
	return out
}

// CBOR major types used by vLLM's hash inputs.
const (
	majorUint  = 0
	majorNeg   = 1
	majorBytes = 2
	majorText  = 3
	majorArray = 4
)

// cborEncoder writes the canonical (shortest-form) CBOR that Python's
// cbor2.dumps(canonical=True) produces for the value types vLLM hashes:
// unsigned and negative integers, byte and text strings, arrays (tuples) and
// null. Maps and floats never occur in block-hash inputs and are refused.
type cborEncoder struct{ buf []byte }

func (e *cborEncoder) head(major byte, n uint64) {
	m := major << 5
	switch {
	case n < 24:
		e.buf = append(e.buf, m|byte(n))
	case n <= math.MaxUint8:
		e.buf = append(e.buf, m|24, byte(n))
	case n <= math.MaxUint16:
		e.buf = append(e.buf, m|25, byte(n>>8), byte(n))
	case n <= math.MaxUint32:
		e.buf = append(e.buf, m|26, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	default:
		e.buf = append(e.buf, m|27)
		e.buf = binary.BigEndian.AppendUint64(e.buf, n)
	}
}

func (e *cborEncoder) bytes(b []byte) {
	e.head(majorBytes, uint64(len(b)))
	e.buf = append(e.buf, b...)
}
func (e *cborEncoder) text(s string) { e.head(majorText, uint64(len(s))); e.buf = append(e.buf, s...) }
func (e *cborEncoder) null()         { e.buf = append(e.buf, 0xf6) }

func (e *cborEncoder) int(v int64) {
	if v >= 0 {
		e.head(majorUint, uint64(v))
	} else {
		e.head(majorNeg, uint64(-(v + 1)))
	}
}

// value encodes one extra-key value. Accepted: string, []byte, the integer
// kinds, nil, and []any of those (vLLM's tuples).
func (e *cborEncoder) value(v any) error {
	switch x := v.(type) {
	case nil:
		e.null()
	case string:
		e.text(x)
	case []byte:
		e.bytes(x)
	case int:
		e.int(int64(x))
	case int64:
		e.int(x)
	case int32:
		e.int(int64(x))
	case uint64:
		e.head(majorUint, x)
	case uint32:
		e.head(majorUint, uint64(x))
	case []any:
		e.head(majorArray, uint64(len(x)))
		for _, y := range x {
			if err := e.value(y); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("kvindex: extra key of type %T cannot be hashed", v)
	}
	return nil
}
