// Package simwords is the text the bench's workloads are made of: random
// lowercase words drawn from a fixed vocabulary. The bench (bench/) and the
// benchmarks that reproduce its bodies (localtok's BenchmarkTokenizeChat)
// draw from this one vocabulary, so their prompts have the same make-up.
package simwords

import (
	"math/rand/v2"
	"strings"
)

// vocab is the pool of generated words: lowercase, 3 to 9 letters, so each
// is one token of the simulator's tokenizer (pieces are cut at 12 bytes).
// It is the same on every run (a fixed seed). Nothing writes it after
// start-up.
var vocab = func() []string {
	rng := rand.New(rand.NewPCG(1, 2))
	v := make([]string, 4096)
	for i := range v {
		b := make([]byte, 3+rng.IntN(7))
		for j := range b {
			b[j] = byte('a' + rng.IntN(26))
		}
		v[i] = string(b)
	}
	return v
}()

// Words returns n tokens of the simulator's tokenizer: tag (which makes
// the text unique from its first block) and n−1 random words drawn with
// rng, separated by spaces.
func Words(rng *rand.Rand, tag string, n int) string {
	var sb strings.Builder
	sb.Grow(n * 7)
	sb.WriteString(tag)
	for i := 1; i < n; i++ {
		sb.WriteByte(' ')
		sb.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return sb.String()
}
