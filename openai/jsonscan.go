package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/llmgw/caddy-llmgw/internal/bytescan"
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
	// asciiLo, asciiHi bound the longest string contents seen so far
	// that are all ASCII, which a caller need not check for UTF-8 again:
	// in a request body, the message text, nearly all of it.
	asciiLo, asciiHi int
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

// str consumes a string at the cursor and returns the bounds of its
// contents (without quotes) and whether it has escapes.
//
// Most of a request body is message text, one string of up to megabytes.
// Without escapes it is found with bytes.IndexByte (vectorised) for the
// closing quote and a backslash, and only control bytes are looked for a
// word at a time. Text with escapes (a newline every line) goes from
// escape to escape with one pass over each stretch
// (bytescan.StringEndFrom), each byte read once.
func (s *scanner) str() (start, end int, escaped bool, err error) {
	s.i++ // opening quote
	start = s.i
	b := s.b
	if q := indexFrom(b, start, len(b), '"'); q < len(b) && indexFrom(b, start, q, '\\') == q {
		// No escape, the common case: the quote and the backslash are
		// found by vectorized search, the bytes between checked 32 at a
		// time.
		if i, high := bytescan.ControlFrom(b, start, q); i == q {
			s.i = q + 1
			s.noteASCII(start, q, high)
			return start, q, false, nil
		}
	}
	// Escapes (or an error): from stop to stop, quote, backslash or
	// control byte, each found in one pass over the text before it.
	var high uint64 // the high bits of the bytes looked at: 0 while ASCII
	for {
		i, h := bytescan.StringEndFrom(b, s.i)
		high |= h
		s.i = i
		if i >= len(b) {
			return 0, 0, false, s.errf("unexpected end of JSON input in string literal")
		}
		switch b[i] {
		case '"':
			s.i++
			s.noteASCII(start, i, high)
			return start, i, escaped, nil
		case '\\':
			escaped = true
			if err := s.escape(i); err != nil {
				return 0, 0, false, err
			}
		default: // control character
			return 0, 0, false, s.unexpected("in string literal")
		}
	}
}

// noteASCII keeps b[start:end], a string's text, as the longest ASCII one
// so far when it is (high, the high bits of its bytes, is 0).
func (s *scanner) noteASCII(start, end int, high uint64) {
	if high == 0 && end-start > s.asciiHi-s.asciiLo {
		s.asciiLo, s.asciiHi = start, end
	}
}

// escape consumes the escape sequence whose backslash is at b[i].
func (s *scanner) escape(i int) error {
	b := s.b
	if i+1 >= len(b) {
		s.i = len(b)
		return s.errf("unexpected end of JSON input in string escape code")
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.i = i + 2
	case 'u':
		for k := 2; k < 6; k++ {
			s.i = i + k
			if i+k >= len(b) {
				return s.errf("unexpected end of JSON input in \\u hexadecimal character escape")
			}
			if !isHex(b[i+k]) {
				return s.unexpected("in \\u hexadecimal character escape")
			}
		}
		s.i = i + 6
	default:
		s.i = i + 1
		return s.unexpected("in string escape code")
	}
	return nil
}

// indexFrom returns the offset of the first c in b[i:end], or end.
func indexFrom(b []byte, i, end int, c byte) int {
	if k := bytes.IndexByte(b[i:end], c); k >= 0 {
		return i + k
	}
	return end
}

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
