package tokenizer

import "unicode/utf8"

// Merges lists run to half a million entries, and decoding them with
// encoding/json (through reflection, as [][]string) is the largest part of
// loading. fastMerges reads the two shapes HF writes, ["a b", ...] and
// [["a", "b"], ...], directly. It reports ok=false on anything else,
// including JSON it does not fully understand, and the caller then falls
// back to encoding/json, which also produces the error message.

// jsonCursor reads JSON from data at pos.
type jsonCursor struct {
	data []byte
	pos  int
}

func (c *jsonCursor) skipSpace() {
	for c.pos < len(c.data) {
		switch c.data[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// consume skips space and then b, reporting whether b was there.
func (c *jsonCursor) consume(b byte) bool {
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == b {
		c.pos++
		return true
	}
	return false
}

// str reads a JSON string.
func (c *jsonCursor) str() (string, bool) {
	if !c.consume('"') {
		return "", false
	}
	start := c.pos
	for c.pos < len(c.data) {
		switch b := c.data[c.pos]; {
		case b == '"':
			s := string(c.data[start:c.pos])
			c.pos++
			return s, utf8.ValidString(s)
		case b == '\\':
			return c.escapedStr(start)
		case b < 0x20:
			return "", false
		}
		c.pos++
	}
	return "", false
}

// escapedStr finishes a string that has escapes.
func (c *jsonCursor) escapedStr(start int) (string, bool) {
	buf := append([]byte(nil), c.data[start:c.pos]...)
	for c.pos < len(c.data) {
		b := c.data[c.pos]
		switch {
		case b == '"':
			c.pos++
			return string(buf), utf8.Valid(buf)
		case b < 0x20:
			return "", false
		case b != '\\':
			buf = append(buf, b)
			c.pos++
			continue
		}
		if c.pos+1 >= len(c.data) {
			return "", false
		}
		if c.data[c.pos+1] == 'u' {
			r, n := c.unicodeEscape()
			if n == 0 {
				return "", false
			}
			buf = utf8.AppendRune(buf, r)
			c.pos += n
			continue
		}
		r := jsonEscape(c.data[c.pos+1])
		if r == 0 {
			return "", false
		}
		buf = append(buf, r)
		c.pos += 2
	}
	return "", false
}

// unicodeEscape decodes \uXXXX at pos, or a surrogate pair written as two
// of them, returning the rune and the bytes used (0 when the escape is
// malformed or a lone surrogate, which encoding/json then handles).
func (c *jsonCursor) unicodeEscape() (rune, int) {
	hi, ok := hex4(c.data, c.pos+2)
	if !ok {
		return 0, 0
	}
	if hi < 0xD800 || hi > 0xDFFF {
		return hi, 6
	}
	if hi > 0xDBFF || c.pos+12 > len(c.data) || c.data[c.pos+6] != '\\' || c.data[c.pos+7] != 'u' {
		return 0, 0
	}
	lo, ok := hex4(c.data, c.pos+8)
	if !ok || lo < 0xDC00 || lo > 0xDFFF {
		return 0, 0
	}
	return 0x10000 + (hi-0xD800)<<10 + (lo - 0xDC00), 12
}

// hex4 reads four hex digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, b := range data[i : i+4] {
		switch {
		case b >= '0' && b <= '9':
			b -= '0'
		case b|0x20 >= 'a' && b|0x20 <= 'f':
			b = b | 0x20 - 'a' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(b)
	}
	return r, true
}

// jsonEscape returns the byte a one-character JSON escape stands for, or 0.
func jsonEscape(b byte) byte {
	switch b {
	case '"', '\\', '/':
		return b
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return 0
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

// uint reads a non-negative integer without sign, fraction or exponent,
// as JSON writes it (no leading zeros).
func (c *jsonCursor) uint() (int64, bool) {
	c.skipSpace()
	start := c.pos
	var n int64
	for c.pos < len(c.data) && c.data[c.pos] >= '0' && c.data[c.pos] <= '9' {
		if n > 1<<40 {
			return 0, false
		}
		n = n*10 + int64(c.data[c.pos]-'0')
		c.pos++
	}
	digits := c.pos - start
	if digits == 0 || digits > 1 && c.data[start] == '0' {
		return 0, false
	}
	if c.pos < len(c.data) && (c.data[c.pos] == '.' || c.data[c.pos] == 'e' || c.data[c.pos] == 'E') {
		return 0, false
	}
	return n, true
}
