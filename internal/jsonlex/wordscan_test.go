package jsonlex

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestControlFrom: the first byte below 0x20 is found at any position,
// behind high bytes, which must not hide it; high is zero iff the bytes
// before it are ASCII.
func TestControlFrom(t *testing.T) {
	for n := 0; n <= 70; n++ {
		for _, fill := range []string{"a", "\xff", "é"} {
			base := []byte(strings.Repeat(fill, n)[:n])
			if end, high := controlFrom(base, 0, n); end != n || (high == 0) != (fill == "a" || n == 0) {
				t.Fatalf("%d bytes of %q: end %d, high %#x", n, fill, end, high)
			}
			for i := 0; i < n; i++ {
				for c := 0; c < 256; c++ {
					b := append([]byte(nil), base...)
					b[i] = byte(c)
					want := n
					if c < 0x20 {
						want = i
					}
					if end, _ := controlFrom(b, 0, n); end != want {
						t.Fatalf("byte %#x at %d of %d %q: end %d, want %d", c, i, n, fill, end, want)
					}
				}
			}
		}
	}
}

// TestStringEndFrom puts each kind of stop byte, and bytes next to them
// that are no stop, at every position of strings around the word size,
// behind every kind of byte, and compares the offset and whether the bytes
// before it are ASCII with a byte-by-byte search.
func TestStringEndFrom(t *testing.T) {
	stop := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	want := func(b []byte, i int) (int, bool) {
		ascii := true
		for ; i < len(b) && !stop(b[i]); i++ {
			ascii = ascii && b[i] < 0x80
		}
		return i, ascii
	}
	probes := []byte{'"', '\\', 0, 0x1f, 0x7f, 0x80, 0xff, 0x20, 0x21, 0x23, 0x5b, 0x5d, 0xa2, 0xdc, 'a'}
	// Up to three 32-byte blocks after the first word; past 40 bytes
	// every fourth position and every fifth start, to keep it quick.
	for n := 0; n <= 112; n++ {
		for i := 0; i < n; i++ {
			if n > 40 && i%4 != n%4 {
				continue
			}
			for _, c := range probes {
				for _, other := range []byte{'a', 0x01, 0x80, '"'} {
					for _, at := range []int{i - 1, i + 1, i + 9} {
						b := []byte(strings.Repeat("x", n))
						b[i] = c
						if at >= 0 && at < n {
							b[at] = other
						}
						for from := 0; from <= n; from++ {
							if n > 40 && from%5 != 0 {
								continue
							}
							end, high := stringEndFrom(b, from)
							wend, ascii := want(b, from)
							if end != wend || (high == 0) != ascii {
								t.Fatalf("%q from %d: %d, ascii %v; want %d, %v", b, from, end, high == 0, wend, ascii)
							}
						}
					}
				}
			}
		}
	}
}

// BenchmarkStringEndDoc walks a JSON-encoded Markdown document (the
// tokenizer's 8k-token prompt: a stop every 14 bytes) from stop to stop,
// as ReadString does on text with escapes.
func BenchmarkStringEndDoc(b *testing.B) {
	doc, err := os.ReadFile("../../tokenizer/testdata/prompt_8k.txt")
	if err != nil {
		b.Fatal(err)
	}
	enc, err := json.Marshal(string(doc))
	if err != nil {
		b.Fatal(err)
	}
	enc = enc[1:] // from the first byte of the string's text
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		stops := 0
		for i := 0; ; {
			j, _ := stringEndFrom(enc, i)
			if enc[j] == '"' {
				break
			}
			stops++
			i = j + 2 // an escape: \n, \", ... (\uXXXX counts its last four as text)
		}
		if stops == 0 {
			b.Fatal("no stops")
		}
	}
}
