package kvindex

import (
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestSum64SeedMatchesDigest checks the one-shot XXH64 against the xxhash
// package's Digest, which the keys were computed with before (and which
// the engines' events were keyed by in every stored test): every length
// through several 32-byte stripes, with random seeds and bytes.
func TestSum64SeedMatchesDigest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 300)
	for n := 0; n <= len(buf); n++ {
		for range 20 {
			for i := range buf[:n] {
				buf[i] = byte(r.Uint32())
			}
			seed := r.Uint64()
			var d xxhash.Digest
			d.ResetWithSeed(seed)
			_, _ = d.Write(buf[:n])
			if got, want := sum64Seed(seed, buf[:n]), d.Sum64(); got != want {
				t.Fatalf("len %d seed %#x: sum64Seed %#x, Digest %#x", n, seed, got, want)
			}
		}
	}
}
