package jsonlex

import (
	"encoding/binary"
	"math/bits"
)

// The word-at-a-time tests below read eight bytes at once: over the long
// strings of a request body (message text, megabytes at worst) they cost
// a fraction of a per-byte loop.

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// controlFrom returns the offset of the first control byte (below 0x20) in
// b[i:end], or end: 32 bytes a step while there is none, the common case.
// high has the high bit of every byte before it set in some byte of high,
// so it is 0 iff they are ASCII: the same pass spares the caller a UTF-8
// check of them. Plain ASCII, most text, takes the cheapest test.
func controlFrom(b []byte, i, end int) (_ int, high uint64) {
	const ctl = lsb * 0x20
	for ; i+32 <= end; i += 32 {
		w := b[i : i+32]
		x0, x1 := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
		x2, x3 := binary.LittleEndian.Uint64(w[16:]), binary.LittleEndian.Uint64(w[24:])
		// Without a byte below 0x20 nothing borrows, so a high bit
		// here is a byte of 0x80 or more: zero iff ASCII, no control.
		if ((x0-ctl)|x0|(x1-ctl)|x1|(x2-ctl)|x2|(x3-ctl)|x3)&msb == 0 {
			continue
		}
		if (hasLess(x0, 0x20) | hasLess(x1, 0x20) | hasLess(x2, 0x20) | hasLess(x3, 0x20)) != 0 {
			break
		}
		high |= x0 | x1 | x2 | x3
	}
	for ; i+8 <= end; i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		if hasLess(x, 0x20) != 0 {
			break
		}
		high |= x
	}
	for ; i < end && b[i] >= 0x20; i++ {
		high |= uint64(b[i])
	}
	return i, high & msb
}

// hasLess is non-zero iff some byte of x is below n (n <= 128).
func hasLess(x uint64, n uint64) uint64 { return (x - lsb*n) & ^x & msb }

// hasZero is non-zero iff some byte of x is zero.
func hasZero(x uint64) uint64 { return (x - lsb) & ^x & msb }

// stringEndFrom returns the offset of the first quote, backslash or
// control byte (below 0x20) in b[i:], or len(b): where a JSON string's
// plain text stops. high has the high bit of every byte before it set in
// some byte of high, so it is 0 iff they are ASCII. Each test below flags
// its byte's high bit; a borrow may flag bytes after a flagged one, never
// before it, so the first flag in a word is exact.
//
// Real prompts stop often (text with newlines and quotes: one stop in 14
// bytes of a Markdown document, JSON-encoded), so the first word is tested
// on its own, and a block of four that holds a stop gives its offset from
// the masks it computed rather than scanning the block again.
func stringEndFrom(b []byte, i int) (_ int, high uint64) {
	if i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		if m := stringStops(x); m != 0 {
			return stopAt(i, x, m, 0)
		}
		high, i = x, i+8
	}
	for ; i+32 <= len(b); i += 32 {
		w := b[i : i+32]
		x0, x1 := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
		x2, x3 := binary.LittleEndian.Uint64(w[16:]), binary.LittleEndian.Uint64(w[24:])
		m0, m1, m2, m3 := stringStops(x0), stringStops(x1), stringStops(x2), stringStops(x3)
		if m0|m1|m2|m3 != 0 {
			switch {
			case m0 != 0:
				return stopAt(i, x0, m0, high)
			case m1 != 0:
				return stopAt(i+8, x1, m1, high|x0)
			case m2 != 0:
				return stopAt(i+16, x2, m2, high|x0|x1)
			default:
				return stopAt(i+24, x3, m3, high|x0|x1|x2)
			}
		}
		high |= x0 | x1 | x2 | x3
	}
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		if m := stringStops(x); m != 0 {
			return stopAt(i, x, m, high)
		}
		high |= x
	}
	for ; i < len(b); i++ {
		c := b[i]
		if c == '"' || c == '\\' || c < 0x20 {
			break
		}
		high |= uint64(c)
	}
	return i, high & msb
}

// stringStops flags the high bit of x's quote, backslash and control
// bytes (and, through borrows, maybe of bytes after the first of them).
func stringStops(x uint64) uint64 {
	const quote, backslash = lsb * '"', lsb * '\\'
	return (hasZero(x^quote) | hasZero(x^backslash) | hasLess(x, 0x20)) & msb
}

// stopAt is stringEndFrom's answer for the word x at offset i whose stop
// mask m is not zero: the first flagged byte, and high with the bytes of x
// before it.
func stopAt(i int, x, m, high uint64) (int, uint64) {
	n := bits.TrailingZeros64(m) / 8
	return i + n, (high | x&(1<<(8*n)-1)) & msb
}
