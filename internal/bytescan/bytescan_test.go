package bytescan

import (
	"strings"
	"testing"
)

// TestIsASCII puts one non-ASCII byte at every position of strings around
// the word and block sizes the check reads at once.
func TestIsASCII(t *testing.T) {
	for n := 0; n <= 70; n++ {
		b := []byte(strings.Repeat("a", n))
		if !IsASCII(b) {
			t.Fatalf("%d ASCII bytes reported as not ASCII", n)
		}
		for i := 0; i < n; i++ {
			for _, c := range []byte{0x80, 0xC3, 0xFF} {
				x := append([]byte(nil), b...)
				x[i] = c
				if IsASCII(x) {
					t.Fatalf("byte %#x at %d of %d reported as ASCII", c, i, n)
				}
			}
		}
	}
}

// TestNonASCIIFrom puts one or two non-ASCII bytes at every position of
// strings around the word and block sizes, and starts the search at
// every offset.
func TestNonASCIIFrom(t *testing.T) {
	for n := 0; n <= 70; n++ {
		b := []byte(strings.Repeat("a", n))
		for from := 0; from <= n; from++ {
			if got := NonASCIIFrom(b, from); got != n {
				t.Fatalf("%d ASCII bytes from %d: %d, want %d", n, from, got, n)
			}
		}
		for i := 0; i < n; i++ {
			x := append([]byte(nil), b...)
			x[i] = 0x80
			if i+5 < n {
				x[i+5] = 0xFF
			}
			for from := 0; from <= n; from++ {
				want := n
				switch {
				case from <= i:
					want = i
				case i+5 < n && from <= i+5:
					want = i + 5
				}
				if got := NonASCIIFrom(x, from); got != want {
					t.Fatalf("non-ASCII at %d (and %d) of %d, from %d: %d, want %d", i, i+5, n, from, got, want)
				}
			}
		}
	}
}

// TestCommonPrefix: a difference at every offset around the block size,
// and one side cut there.
func TestCommonPrefix(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 257, 600} {
		a := make([]byte, n)
		for i := range a {
			a[i] = byte(i * 7)
		}
		for at := 0; at <= n; at++ {
			b := append([]byte(nil), a...)
			if at < n {
				b[at]++
			}
			if got := CommonPrefix(a, b); got != at {
				t.Fatalf("n %d, differing at %d: %d", n, at, got)
			}
			if got := CommonPrefix(a, b[:at]); got != at {
				t.Fatalf("n %d, b cut at %d: %d", n, at, got)
			}
		}
	}
}
