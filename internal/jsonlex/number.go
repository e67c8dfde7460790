package jsonlex

import (
	"math"
	"strconv"
)

// Number reads the number that starts at b[i] with RFC 8259's grammar,
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and returns the cursor
// after it; integer reports that it has neither fraction nor exponent.
// Its text, b[i:end], is what ParseInt64, ParseUint64 and ParseFloat take.
func Number(b []byte, i int) (end int, integer bool, err error) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && isDigit(b[i]):
		i = digits(b, i+1)
	default:
		e := Unexpected(b, i, "in numeric literal")
		return e.Off, false, e
	}
	integer = true
	if i < len(b) && b[i] == '.' {
		if i++; i >= len(b) || !isDigit(b[i]) {
			e := Unexpected(b, i, "after decimal point in numeric literal")
			return e.Off, false, e
		}
		i, integer = digits(b, i+1), false
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			e := Unexpected(b, i, "in exponent of numeric literal")
			return e.Off, false, e
		}
		i, integer = digits(b, i+1), false
	}
	return i, integer, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// digits returns the offset of the first byte at or after i that is not a
// decimal digit.
func digits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}

// Uint reads the run of decimal digits at b[i], the fast path for token
// ids, and returns its value and the cursor after it; ok is false when
// there is no digit, the run has a leading zero, or it overflows uint64.
// The caller checks what follows the run: a '.', 'e' or 'E' there means
// a number that is no plain integer.
func Uint(b []byte, i int) (v uint64, end int, ok bool) {
	if v, end = UintDigits(b, i); UintFits(b, i, end) {
		return v, end, true
	}
	if n := end - i; n == 0 || n > 1 && b[i] == '0' {
		return 0, end, false
	}
	v, err := strconv.ParseUint(string(b[i:end]), 10, 64)
	if err != nil {
		return 0, end, false
	}
	return v, end, true
}

// UintDigits and UintFits are Uint's fast path in two halves small enough
// to inline, for a loop over thousands of token ids, where a call per id
// cost the /tokenize decoder a seventh of its time: UintDigits reads the
// run of digits at b[i] (wrapping past 19 of them) and returns its value
// and the cursor after it; when UintFits(b, i, end) then reports false,
// the run is no plain uint64 or needs the slow path, and the caller asks
// Uint.
func UintDigits(b []byte, i int) (v uint64, end int) {
	for ; i < len(b) && b[i]-'0' < 10; i++ {
		v = v*10 + uint64(b[i]-'0')
	}
	return v, i
}

// UintFits reports whether b[start:end], digits UintDigits read, are a
// plain integer whose value it got right: 1 to 19 digits (which always
// fit a uint64), without a leading zero. See UintDigits.
func UintFits(b []byte, start, end int) bool {
	n := end - start
	return uint(n-1) < 19 && (n == 1 || b[start] != '0')
}

// ParseInt64 parses the text of a number Number read, ok when it is an
// integer without fraction or exponent within int64's range (what
// encoding/json decodes into an int).
func ParseInt64(num []byte) (int64, bool) {
	neg := len(num) > 0 && num[0] == '-'
	if neg {
		num = num[1:]
	}
	u, end, ok := Uint(num, 0)
	if !ok || end != len(num) {
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// ParseFloat parses the text of a number Number read as encoding/json
// decodes it into a float64: an error when it is out of range (1e400).
func ParseFloat(num []byte) (float64, error) {
	return strconv.ParseFloat(string(num), 64)
}
