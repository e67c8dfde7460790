package admission

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// maxDepth bounds the nesting of any JSON this package walks. encoding/json
// allows 10,000 levels; nothing legitimate in an OpenAI request or response
// comes close to 128, and the bound keeps the recursive walk cheap.
const maxDepth = 128

// syntaxError is a malformed-JSON error at a byte offset.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string { return fmt.Sprintf("%s at byte %d", e.msg, e.off) }

// scanner walks JSON text in place. It validates exactly the grammar of RFC
// 8259 as encoding/json does (the caller checks UTF-8 separately), skips
// values without building anything, and reports where values start and end
// so callers can keep sub-slices of the input instead of copies.
type scanner struct {
	b     []byte
	i     int
	depth int
}

func (s *scanner) errf(format string, args ...any) error {
	return &syntaxError{off: s.i, msg: fmt.Sprintf(format, args...)}
}

// unexpected reports the byte at the cursor, or the end of input.
func (s *scanner) unexpected(context string) error {
	if s.i >= len(s.b) {
		return s.errf("unexpected end of JSON %s", context)
	}
	c := s.b[s.i]
	if c >= 0x20 && c < 0x7f {
		return s.errf("invalid character %q %s", c, context)
	}
	return s.errf("invalid byte 0x%02x %s", c, context)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the byte at the cursor, or 0 at the end.
func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// value skips one value (the cursor is at its first byte) and returns its
// bounds.
func (s *scanner) value() (start, end int, err error) {
	start = s.i
	switch c := s.peek(); {
	case c == '{':
		err = s.object(func(int, int, bool) error { return s.skip() })
	case c == '[':
		err = s.array(func() error { return s.skip() })
	case c == '"':
		_, _, _, err = s.str()
	case c == 't':
		err = s.literal("true")
	case c == 'f':
		err = s.literal("false")
	case c == 'n':
		err = s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		err = s.number()
	default:
		err = s.unexpected("looking for beginning of value")
	}
	return start, s.i, err
}

func (s *scanner) skip() error {
	_, _, err := s.value()
	return err
}

// object walks an object at the cursor, calling member for each key with
// the cursor on the member's value, which member must consume.
// The key bounds exclude the quotes; escaped reports a backslash in the key.
func (s *scanner) object(member func(kstart, kend int, escaped bool) error) error {
	if s.depth++; s.depth > maxDepth {
		return s.errf("exceeded max depth of %d", maxDepth)
	}
	s.i++ // '{'
	s.ws()
	if s.peek() == '}' {
		s.i++
		s.depth--
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.unexpected("looking for beginning of object key string")
		}
		ks, ke, esc, err := s.str()
		if err != nil {
			return err
		}
		s.ws()
		if s.peek() != ':' {
			return s.unexpected("after object key")
		}
		s.i++
		s.ws()
		if err := member(ks, ke, esc); err != nil {
			return err
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
			s.ws()
		case '}':
			s.i++
			s.depth--
			return nil
		default:
			return s.unexpected("after object key:value pair")
		}
	}
}

// array walks an array at the cursor, calling elem with the cursor on each
// element, which elem must consume.
func (s *scanner) array(elem func() error) error {
	if s.depth++; s.depth > maxDepth {
		return s.errf("exceeded max depth of %d", maxDepth)
	}
	s.i++ // '['
	s.ws()
	if s.peek() == ']' {
		s.i++
		s.depth--
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
			s.ws()
		case ']':
			s.i++
			s.depth--
			return nil
		default:
			return s.unexpected("after array element")
		}
	}
}

// strPlain marks bytes that may appear unescaped in a string and need no
// further look: everything from 0x20 up except '"' and '\\'.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str consumes a string at the cursor and returns the bounds of its
// contents (without quotes) and whether it has escapes.
func (s *scanner) str() (start, end int, escaped bool, err error) {
	s.i++ // opening quote
	start = s.i
	b := s.b
	for {
		i := s.i
		// Skip 8 plain bytes at a time (SWAR); most of a request body is
		// message text. A word with a quote, backslash or control byte
		// falls through to the byte loop.
		for i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[i:])
			if hasLess(x, 0x20)|hasZero(x^(lsb*'"'))|hasZero(x^(lsb*'\\')) != 0 {
				break
			}
			i += 8
		}
		for i < len(b) && strPlain[b[i]] {
			i++
		}
		s.i = i
		if i >= len(b) {
			return 0, 0, false, s.errf("unexpected end of JSON input in string literal")
		}
		switch b[i] {
		case '"':
			s.i++
			return start, i, escaped, nil
		case '\\':
			escaped = true
			if i+1 >= len(b) {
				s.i = len(b)
				return 0, 0, false, s.errf("unexpected end of JSON input in string escape code")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i = i + 2
			case 'u':
				for k := 2; k < 6; k++ {
					s.i = i + k
					if i+k >= len(b) {
						return 0, 0, false, s.errf("unexpected end of JSON input in \\u hexadecimal character escape")
					}
					if !isHex(b[i+k]) {
						return 0, 0, false, s.unexpected("in \\u hexadecimal character escape")
					}
				}
				s.i = i + 6
			default:
				s.i = i + 1
				return 0, 0, false, s.unexpected("in string escape code")
			}
		default: // control character
			return 0, 0, false, s.unexpected("in string literal")
		}
	}
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// hasZero is non-zero iff some byte of x is zero.
func hasZero(x uint64) uint64 { return (x - lsb) & ^x & msb }

// hasLess is non-zero iff some byte of x is below n (n <= 128).
func hasLess(x uint64, n uint64) uint64 { return (x - lsb*n) & ^x & msb }

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number consumes -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (s *scanner) number() error {
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return s.unexpected("in numeric literal")
	}
	if s.peek() == '.' {
		s.i++
		if !isDigit(s.peek()) {
			return s.unexpected("after decimal point in numeric literal")
		}
		s.digits()
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if !isDigit(s.peek()) {
			return s.unexpected("in exponent of numeric literal")
		}
		s.digits()
	}
	return nil
}

func (s *scanner) digits() {
	for s.i < len(s.b) && isDigit(s.b[s.i]) {
		s.i++
	}
}

func (s *scanner) literal(word string) error {
	for k := 0; k < len(word); k++ {
		if s.i >= len(s.b) || s.b[s.i] != word[k] {
			return s.unexpected("in literal " + word + " (expecting " + fmt.Sprintf("%q", word[k]) + ")")
		}
		s.i++
	}
	return nil
}

// end checks that only whitespace follows the top-level value.
func (s *scanner) end() error {
	s.ws()
	if s.i < len(s.b) {
		return s.unexpected("after top-level value")
	}
	return nil
}

// unquote returns the Go string for the string contents b[start:end].
func unquote(b []byte, start, end int, escaped bool) (string, error) {
	if !escaped {
		return string(b[start:end]), nil
	}
	// Rare: let encoding/json handle escapes and surrogate pairs exactly.
	var v string
	if err := json.Unmarshal(b[start-1:end+1], &v); err != nil {
		return "", err
	}
	return v, nil
}

// keyBytes returns the object key b[start:end] with escapes decoded (which
// allocates, but only for keys that have escapes). Callers compare it with
// switch string(k), which does not allocate.
func keyBytes(b []byte, start, end int, escaped bool) []byte {
	if !escaped {
		return b[start:end]
	}
	k, err := unquote(b, start, end, true)
	if err != nil {
		return nil // cannot happen: the scanner validated the string
	}
	return []byte(k)
}

// invalidUTF8Offset returns the offset of the first invalid UTF-8 sequence
// in b, or -1.
func invalidUTF8Offset(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}
