package openai

import (
	"fmt"
	"unicode/utf8"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// maxDepth bounds the nesting of any JSON this package walks. encoding/json
// allows 10,000 levels; nothing legitimate in an OpenAI request or response
// comes close to 128, and the bound keeps the recursive walk cheap.
const maxDepth = 128

// syntaxError is a malformed-JSON error at a byte offset: the lexer's.
type syntaxError = jsonlex.Error

// scanner walks JSON text in place. It validates exactly the grammar of RFC
// 8259 as encoding/json does (the caller checks UTF-8 separately), skips
// values without building anything, and reports where values start and end
// so callers can keep sub-slices of the input instead of copies. Strings,
// numbers and literals are read by internal/jsonlex; the scanner walks the
// containers itself, to note the strings it passes in skipped values too.
type scanner struct {
	b     []byte
	i     int
	depth int
	// asciiLo, asciiHi bound the longest string contents seen so far
	// that are all ASCII, which a caller need not check for UTF-8 again:
	// in a request body, the message text, nearly all of it.
	asciiLo, asciiHi int
}

// errf is a malformed-JSON error at the cursor in the caller's words
// (the byte-at-a-time reference scanner of the tests builds its errors
// with it; the lexer's come from jsonlex).
func (s *scanner) errf(format string, args ...any) error {
	return &syntaxError{Off: s.i, Msg: fmt.Sprintf(format, args...)}
}

// unexpected reports the byte at the cursor, or the end of input.
func (s *scanner) unexpected(context string) error {
	return jsonlex.Unexpected(s.b, s.i, context)
}

func (s *scanner) ws() { s.i = jsonlex.SkipSpace(s.b, s.i) }

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
	case c == 't' || c == 'f' || c == 'n':
		err = s.literal()
	case c == '-' || c >= '0' && c <= '9':
		s.i, _, err = jsonlex.Number(s.b, s.i)
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
		return jsonlex.DepthError(s.i, maxDepth)
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
		return jsonlex.DepthError(s.i, maxDepth)
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
func (s *scanner) str() (start, end int, escaped bool, err error) {
	str, i, err := jsonlex.ReadString(s.b, s.i)
	s.i = i
	if err != nil {
		return 0, 0, false, err
	}
	if str.ASCII && str.End-str.Start > s.asciiHi-s.asciiLo {
		s.asciiLo, s.asciiHi = str.Start, str.End
	}
	return str.Start, str.End, str.Escaped, nil
}

// escape consumes the escape sequence whose backslash is at b[i].
func (s *scanner) escape(i int) (err error) {
	s.i, err = jsonlex.SkipEscape(s.b, i)
	return err
}

// literal consumes the true, false or null at the cursor.
func (s *scanner) literal() (err error) {
	s.i, err = jsonlex.Literal(s.b, s.i)
	return err
}

// end checks that only whitespace follows the top-level value.
func (s *scanner) end() error {
	s.ws()
	if s.i < len(s.b) {
		return s.unexpected("after top-level value")
	}
	return nil
}

// unquote returns the Go string for the string contents b[start:end],
// which the scanner validated.
func unquote(b []byte, start, end int, escaped bool) (string, error) {
	if !escaped {
		return string(b[start:end]), nil
	}
	v := jsonlex.AppendString(nil, b, jsonlex.String{Start: start, End: end, Escaped: true})
	return string(v), nil
}

// keyBytes returns the object key b[start:end] with escapes decoded (which
// allocates, but only for keys that have escapes). Callers compare it with
// switch string(k), which does not allocate.
func keyBytes(b []byte, start, end int, escaped bool) []byte {
	if !escaped {
		return b[start:end]
	}
	return jsonlex.AppendString(nil, b, jsonlex.String{Start: start, End: end, Escaped: true})
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
