// Package bytescan holds the word-at-a-time byte tests that the
// tokenizer's normalizers and the kept-prefix sets run over long prompts:
// read eight bytes at once, they cost a fraction of a per-byte loop. (The
// JSON string scans live with the JSON lexer, internal/jsonlex.)
package bytescan

import (
	"bytes"
	"encoding/binary"
)

// msb has the high bit of each byte of a word set.
const msb = 0x8080808080808080

// IsASCII reports whether b holds only bytes below 0x80.
func IsASCII(b []byte) bool { return NonASCIIFrom(b, 0) == len(b) }

// NonASCIIFrom returns the offset of the first byte of 0x80 or more in
// b[i:], or len(b): 32 bytes a step while there is none.
func NonASCIIFrom(b []byte, i int) int {
	for ; i+32 <= len(b); i += 32 {
		if (binary.LittleEndian.Uint64(b[i:])|binary.LittleEndian.Uint64(b[i+8:])|
			binary.LittleEndian.Uint64(b[i+16:])|binary.LittleEndian.Uint64(b[i+24:]))&msb != 0 {
			break
		}
	}
	for ; i+8 <= len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:])&msb != 0 {
			break
		}
	}
	for ; i < len(b) && b[i] < 0x80; i++ {
	}
	return i
}

// CommonPrefix returns the length of the longest common prefix of a and b:
// 256 bytes a step with bytes.Equal (a vectorized memory comparison)
// while they agree, then byte by byte. The kept-prefix sets compare a new
// prompt's ids, text or /tokenize answer with a kept one's through it.
func CommonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	const block = 256
	i := 0
	for i+block <= n && bytes.Equal(a[i:i+block], b[i:i+block]) {
		i += block
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
