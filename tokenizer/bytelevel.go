package tokenizer

import "unicode/utf8"

// GPT-2's byte-level alphabet maps every byte to a printable rune so that a
// vocabulary of strings can cover arbitrary bytes: printable Latin-1 bytes map
// to themselves and the rest to U+0100 onwards, in byte order.
var (
	byteToRune [256]rune
	// byteToUTF8 holds byteToRune's runes already UTF-8 encoded, so mapping
	// a string is a table copy per byte.
	byteToUTF8 [256]string
	runeToByte = make(map[rune]byte, 256)
)

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		byteToUTF8[b] = string(byteToRune[b])
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// appendByteLevel appends the byte-level form of s to dst.
func appendByteLevel(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		dst = append(dst, byteToUTF8[s[i]]...)
	}
	return dst
}

// byteLevelString returns the byte-level form of s.
func byteLevelString(s string) string {
	return string(appendByteLevel(make([]byte, 0, len(s)*2), s))
}

// unByteLevel turns a byte-level token back into its bytes. ok is false when
// the token has a rune outside the byte-level alphabet (for example an added
// token such as "<｜User｜>"), in which case HF uses the token's own bytes.
func unByteLevel(dst []byte, token string) ([]byte, bool) {
	start := len(dst)
	for _, r := range token {
		b, ok := runeToByte[r]
		if !ok {
			return dst[:start], false
		}
		dst = append(dst, b)
	}
	return dst, true
}

// appendLossyUTF8 appends b to dst as a string, replacing each maximal
// invalid subsequence with one U+FFFD, as Rust's String::from_utf8_lossy and
// the WHATWG decoder do (Go's own conversion would replace byte by byte).
func appendLossyUTF8(dst []byte, b []byte) []byte {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r != utf8.RuneError || n > 1 {
			dst = append(dst, b[:n]...)
			b = b[n:]
			continue
		}
		dst = append(dst, "\uFFFD"...)
		b = b[maximalSubpart(b):]
	}
	return dst
}

// maximalSubpart returns how many bytes of the invalid sequence at the start
// of b form the longest prefix of some valid UTF-8 sequence (at least 1).
func maximalSubpart(b []byte) int {
	lead := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case lead >= 0xC2 && lead <= 0xDF:
		need = 1
	case lead == 0xE0:
		need, lo = 2, 0xA0
	case lead == 0xED:
		need, hi = 2, 0x9F
	case lead >= 0xE1 && lead <= 0xEF:
		need = 2
	case lead == 0xF0:
		need, lo = 3, 0x90
	case lead == 0xF4:
		need, hi = 3, 0x8F
	case lead >= 0xF1 && lead <= 0xF3:
		need = 3
	default:
		return 1
	}
	n := 1
	for ; n <= need && n < len(b); n++ {
		c := b[n]
		if n == 1 && (c < lo || c > hi) || n > 1 && (c < 0x80 || c > 0xBF) {
			break
		}
	}
	return n
}

// validUTF8 returns s unchanged when it is valid UTF-8 and otherwise a copy
// with every invalid byte replaced by U+FFFD, the way a Go range loop reads
// it. Everything downstream may then assume valid UTF-8.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	out := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			out = append(out, "\uFFFD"...)
		} else {
			out = append(out, s[i:i+n]...)
		}
		i += n
	}
	return string(out)
}
