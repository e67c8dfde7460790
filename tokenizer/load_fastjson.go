package tokenizer

import (
	"math"
	"unicode/utf8"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// Merges lists run to half a million entries, and decoding them with
// encoding/json (through reflection, as [][]string) is the largest part of
// loading. fastMerges reads the two shapes HF writes, ["a b", ...] and
// [["a", "b"], ...], directly. It reports ok=false on anything else,
// including JSON it does not fully understand, and the caller then falls
// back to encoding/json, which also produces the error message.

// jsonCursor reads JSON from data at pos; internal/jsonlex reads the
// strings and numbers.
type jsonCursor struct {
	data []byte
	pos  int
}

func (c *jsonCursor) skipSpace() { c.pos = jsonlex.SkipSpace(c.data, c.pos) }

// consume skips space and then b, reporting whether b was there.
func (c *jsonCursor) consume(b byte) bool {
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == b {
		c.pos++
		return true
	}
	return false
}

// str reads a JSON string. Invalid UTF-8 and lone surrogates are left to
// encoding/json (which replaces them with U+FFFD).
func (c *jsonCursor) str() (string, bool) {
	if c.skipSpace(); c.pos >= len(c.data) || c.data[c.pos] != '"' {
		return "", false
	}
	s, end, err := jsonlex.ReadString(c.data, c.pos)
	if err != nil {
		return "", false
	}
	c.pos = end
	if !s.Escaped {
		raw := c.data[s.Start:s.End]
		return string(raw), s.ASCII || utf8.Valid(raw)
	}
	v, exact := jsonlex.AppendStringStrict(nil, c.data, s)
	return string(v), exact
}

// fastMerges parses a merges array; ok is false when it cannot.
func fastMerges(raw []byte) (pairs [][2]string, ok bool) {
	c := &jsonCursor{data: raw}
	if !c.consume('[') {
		return nil, false
	}
	if c.consume(']') {
		return nil, c.atEnd()
	}
	for {
		p, ok := c.mergeEntry()
		if !ok {
			return nil, false
		}
		pairs = append(pairs, p)
		if c.consume(']') {
			return pairs, c.atEnd()
		}
		if !c.consume(',') {
			return nil, false
		}
	}
}

// mergeEntry reads "a b" or ["a", "b"].
func (c *jsonCursor) mergeEntry() ([2]string, bool) {
	if c.consume('[') {
		a, okA := c.str()
		if !okA || !c.consume(',') {
			return [2]string{}, false
		}
		b, okB := c.str()
		return [2]string{a, b}, okB && c.consume(']')
	}
	s, ok := c.str()
	if !ok {
		return [2]string{}, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			b := s[i+1:]
			for j := 0; j < len(b); j++ {
				if b[j] == ' ' {
					return [2]string{}, false
				}
			}
			return [2]string{s[:i], b}, true
		}
	}
	return [2]string{}, false
}

func (c *jsonCursor) atEnd() bool {
	c.skipSpace()
	return c.pos == len(c.data)
}

// fastVocab parses a vocab object of non-negative integer ids; ok is false
// for anything else, and the caller falls back to encoding/json.
func fastVocab(raw []byte) (map[string]int64, bool) {
	c := &jsonCursor{data: raw}
	if !c.consume('{') {
		return nil, false
	}
	vocab := make(map[string]int64, len(raw)/16)
	if c.consume('}') {
		return vocab, c.atEnd()
	}
	for {
		tok, ok := c.str()
		if !ok || !c.consume(':') {
			return nil, false
		}
		id, ok := c.uint()
		if !ok {
			return nil, false
		}
		vocab[tok] = id
		if c.consume('}') {
			return vocab, c.atEnd()
		}
		if !c.consume(',') {
			return nil, false
		}
	}
}

// uint reads the digits of a non-negative integer as JSON writes it (no
// leading zeros) that fits an int64. A fraction or exponent after them is
// left at the cursor, where the caller's ',' or '}' is not.
func (c *jsonCursor) uint() (int64, bool) {
	c.skipSpace()
	v, end, ok := jsonlex.Uint(c.data, c.pos)
	if c.pos = end; !ok || v > math.MaxInt64 {
		return 0, false
	}
	return int64(v), true
}
