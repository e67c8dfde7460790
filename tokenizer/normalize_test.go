package tokenizer

import (
	"strings"
	"testing"
)

// TestIsASCII puts one non-ASCII byte at every position of strings around
// the word and block sizes the check reads at once.
func TestIsASCII(t *testing.T) {
	for n := 0; n <= 70; n++ {
		s := strings.Repeat("a", n)
		if !isASCII(s) {
			t.Fatalf("%d ASCII bytes reported as not ASCII", n)
		}
		for i := 0; i < n; i++ {
			for _, c := range []byte{0x80, 0xC3, 0xFF} {
				b := []byte(s)
				b[i] = c
				if isASCII(string(b)) {
					t.Fatalf("byte %#x at %d of %d reported as ASCII", c, i, n)
				}
			}
		}
	}
}
