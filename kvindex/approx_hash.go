package kvindex

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
)

// The approximate tree keys a prompt's chunks by chained hashes: a
// chunk's key stands for the whole text up to its end. The fleet inserts
// every routed prompt, up to 4096 chunks of 64 bytes, so hashing them is
// most of what an Insert costs on a long prompt; xxh64, whose
// finalization runs once per 64-byte chunk here, took 8 µs for an
// 8k-token prompt. chunkHasher reads a chunk 32 bytes a step, folds its
// words in pairs with 128-bit multiplies (wyhash's mixing) that do not
// wait on one another, and chains the result with one more multiply:
// about half the time. The tree's keys never leave the process, so any
// good 64-bit hash will do. Each tree draws its own secret, mixed into
// every word, so that nobody can aim a prompt at another one's keys: a
// multiply by a word an attacker could make zero would lose the other.

// chunkHasher is one tree's chunk hash.
type chunkHasher struct {
	start uint64    // the key before the first chunk
	k     [4]uint64 // mixed into the words of each step
}

// wyhash's odd constants, with which a tree's secret is mixed.
var chunkPrimes = [4]uint64{0xa0761d6478bd642f, 0xe7037ed1a0b428db, 0x8ebc6af09c88c6e3, 0x589965cc75374cc3}

// chunkStep is odd (2^64 over the golden ratio): multiplying by it is a
// bijection, so no step's contribution is lost.
const chunkStep = 0x9e3779b97f4a7c15

func newChunkHasher() chunkHasher {
	c := chunkHasher{start: rand.Uint64()}
	for i, p := range chunkPrimes {
		c.k[i] = p ^ rand.Uint64()
	}
	return c
}

// hash is the key of chunk s after the chunks whose key is prev.
func (c *chunkHasher) hash(prev uint64, s string) uint64 {
	k0, k1, k2, k3 := c.k[0], c.k[1], c.k[2], c.k[3]
	n := uint64(len(s))
	var h uint64
	for ; len(s) >= 32; s = s[32:] {
		// Multiplying by an odd constant between steps makes their
		// order count; a rotation would repeat, so that two equal
		// steps 64 apart cancelled in a chunk of 2 KiB or more.
		h = (h ^ mum(le64(s)^k0, le64(s[8:])^k1) ^ mum(le64(s[16:])^k2, le64(s[24:])^k3)) * chunkStep
	}
	// The last 0 to 31 bytes; reads may overlap, the length tells them
	// apart.
	var a, b uint64
	switch {
	case len(s) >= 16:
		h ^= mum(le64(s)^k0, le64(s[8:])^k1)
		a, b = le64(s[len(s)-16:]), le64(s[len(s)-8:])
	case len(s) >= 8:
		a, b = le64(s), le64(s[len(s)-8:])
	case len(s) >= 4:
		a, b = uint64(le32(s)), uint64(le32(s[len(s)-4:]))
	case len(s) > 0:
		a = uint64(s[0])<<16 | uint64(s[len(s)/2])<<8 | uint64(s[len(s)-1])
	}
	h ^= mum(a^k2, b^k3^n)
	return mum(prev^h^k0, n^k1)
}

// mum folds the 128-bit product of a and b to 64 bits.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func le64(s string) uint64 { return binary.LittleEndian.Uint64([]byte(s[:8])) }
func le32(s string) uint32 { return binary.LittleEndian.Uint32([]byte(s[:4])) }
