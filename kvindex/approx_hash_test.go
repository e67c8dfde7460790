package kvindex

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestChunkHashSeparates: a chunk's key changes with any one byte of it,
// with its length (a text's last chunk may be short, and reads of its tail
// overlap), with the chunks before it, and with the tree's secret; over
// many random chunks no two keys collide.
func TestChunkHashSeparates(t *testing.T) {
	c := newChunkHasher()
	rng := rand.New(rand.NewPCG(3, 4))
	text := make([]byte, 64)
	for i := range text {
		text[i] = byte(rng.Uint32())
	}
	seen := map[uint64]string{}
	note := func(what string, k uint64) {
		t.Helper()
		if prev, ok := seen[k]; ok {
			t.Fatalf("%s has the key of %s", what, prev)
		}
		seen[k] = what
	}
	for n := 0; n <= len(text); n++ {
		base := c.hash(c.start, string(text[:n]))
		note(fmt.Sprintf("the first %d bytes", n), base)
		for i := range n {
			for _, flip := range []byte{1, 0x80} {
				b := append([]byte(nil), text[:n]...)
				b[i] ^= flip
				if c.hash(c.start, string(b)) == base {
					t.Fatalf("%d bytes: flipping %#x at %d keeps the key", n, flip, i)
				}
			}
		}
		if n > 0 && c.hash(base, string(text[:n])) == c.hash(c.start, string(text[:n])) {
			t.Fatalf("%d bytes: the key ignores the chunks before", n)
		}
	}
	// Equal 32-byte steps far apart in a long chunk (ApproxConfig.ChunkBytes
	// may be set so): swapping two of them changes the key. A rotation
	// between steps repeated every 64, and such a pair cancelled.
	for _, apart := range []int{1, 2, 63, 64, 65, 128} {
		a := make([]byte, 32*(apart+1))
		for i := range a {
			a[i] = ' '
		}
		b := append([]byte(nil), a...)
		copy(a, strings.Repeat("-", 32))
		copy(a[32*apart:], strings.Repeat("=", 32))
		copy(b, strings.Repeat("=", 32))
		copy(b[32*apart:], strings.Repeat("-", 32))
		if c.hash(c.start, string(a)) == c.hash(c.start, string(b)) {
			t.Errorf("steps %d apart: swapping two of them keeps the key", apart)
		}
	}
	other := newChunkHasher()
	if other.hash(other.start, string(text)) == c.hash(c.start, string(text)) {
		t.Fatal("two trees' secrets give the same key")
	}
	for i := range 1 << 16 {
		for j := range text {
			text[j] = byte(rng.Uint32())
		}
		note(fmt.Sprintf("random chunk %d", i), c.hash(c.start, string(text)))
	}
}
