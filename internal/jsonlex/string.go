package jsonlex

import (
	"bytes"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// String is a string read by [ReadString]: its contents b[Start:End],
// without the quotes.
type String struct {
	Start, End int
	// Escaped reports a backslash in the contents: they are not the
	// string's value and must go through AppendString.
	Escaped bool
	// ASCII reports that every byte of the contents is below 0x80, so
	// that a caller refusing invalid UTF-8 need not check them.
	ASCII bool
}

// ReadString reads the string whose opening quote is at b[i] and returns
// it and the cursor after its closing quote. It validates escapes and
// refuses control bytes, as RFC 8259 requires; see the package comment
// about UTF-8.
//
// Most of a request body is message text, one string of up to megabytes.
// Without escapes it is found with bytes.IndexByte (vectorised) for the
// closing quote and a backslash, and only control bytes are looked for a
// word at a time. Text with escapes (a newline every line) goes from
// escape to escape with one pass over each stretch (stringEndFrom), each
// byte read once.
func ReadString(b []byte, i int) (String, int, error) {
	start := i + 1
	if q, ascii, ok := shortEnd(b, start); ok {
		return String{Start: start, End: q, ASCII: ascii}, q + 1, nil
	}
	if q := indexFrom(b, start, len(b), '"'); q < len(b) && indexFrom(b, start, q, '\\') == q {
		if c, high := controlFrom(b, start, q); c == q {
			return String{Start: start, End: q, ASCII: high == 0}, q + 1, nil
		}
	}
	// Escapes (or an error): from stop to stop, quote, backslash or
	// control byte, each found in one pass over the text before it.
	var high uint64 // the high bits of the bytes looked at: 0 while ASCII
	escaped := false
	for i = start; ; {
		j, h := stringEndFrom(b, i)
		high |= h
		if j >= len(b) {
			return String{}, len(b), &Error{Off: len(b), Msg: "unexpected end of JSON input in string literal"}
		}
		switch b[j] {
		case '"':
			return String{Start: start, End: j, Escaped: escaped, ASCII: high == 0}, j + 1, nil
		case '\\':
			escaped = true
			var err error
			if i, err = SkipEscape(b, j); err != nil {
				return String{}, i, err
			}
		default: // control character
			e := Unexpected(b, j, "in string literal")
			return String{}, e.Off, e
		}
	}
}

// PlainEnd returns the offset of the quote ending the string whose text
// begins at b[i] when all of that text is plain ASCII (no escape, no
// control byte, nothing above 0x7F); ok is false otherwise, and the
// string must be read with ReadString.
func PlainEnd(b []byte, i int) (end int, ok bool) {
	if q, ascii, short := shortEnd(b, i); short {
		return q, ascii
	}
	q := indexFrom(b, i, len(b), '"')
	if q == len(b) || indexFrom(b, i, q, '\\') < q {
		return 0, false
	}
	if c, high := controlFrom(b, i, q); c < q || high != 0 {
		return 0, false
	}
	return q, true
}

// shortEnd looks at the first 16 bytes of the text at b[i:] one at a
// time: a key or a token's text ends there, before a vectorised search
// pays for its setup. It returns the offset of the closing quote and
// whether the text is ASCII, or ok false when the text is longer or has
// a backslash or a control byte, left to the general path.
func shortEnd(b []byte, i int) (q int, ascii, ok bool) {
	var high byte
	for j := i; j < len(b) && j < i+16; j++ {
		switch c := b[j]; {
		case c == '"':
			return j, high < 0x80, true
		case c == '\\' || c < 0x20:
			return 0, false, false
		default:
			high |= c
		}
	}
	return 0, false, false
}

// SkipEscape validates the escape sequence whose backslash is at b[i] and
// returns the cursor after it.
func SkipEscape(b []byte, i int) (int, error) {
	if i+1 >= len(b) {
		return len(b), &Error{Off: len(b), Msg: "unexpected end of JSON input in string escape code"}
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2, nil
	case 'u':
		for k := i + 2; k < i+6; k++ {
			if k >= len(b) {
				return k, &Error{Off: k, Msg: "unexpected end of JSON input in \\u hexadecimal character escape"}
			}
			if hexVal[b[k]] < 0 {
				e := Unexpected(b, k, "in \\u hexadecimal character escape")
				return e.Off, e
			}
		}
		return i + 6, nil
	}
	e := Unexpected(b, i+1, "in string escape code")
	return e.Off, e
}

// indexFrom returns the offset of the first c in b[i:end], or end.
func indexFrom(b []byte, i, end int, c byte) int {
	if k := bytes.IndexByte(b[i:end], c); k >= 0 {
		return i + k
	}
	return end
}

// hexVal maps a byte to its hex digit's value, -1 for no hex digit.
var hexVal = func() (t [256]int8) {
	for c := range t {
		switch {
		case c >= '0' && c <= '9':
			t[c] = int8(c - '0')
		case c >= 'a' && c <= 'f':
			t[c] = int8(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			t[c] = int8(c - 'A' + 10)
		default:
			t[c] = -1
		}
	}
	return t
}()

// simpleEscapes maps the byte after a backslash to what it stands for; 0
// marks no simple escape.
var simpleEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// AppendString appends the value of s, a string ReadString read from b,
// to dst, decoding as encoding/json does: escapes, surrogate pairs, and
// U+FFFD for each lone surrogate escape and each invalid UTF-8 byte.
// The text between escapes is copied whole when it is ASCII or valid
// UTF-8, which is nearly always; dst grows once, to the raw length
// (decoding only shortens it, but for invalid bytes).
func AppendString(dst, b []byte, s String) []byte {
	dst, _ = AppendStringStrict(dst, b, s)
	return dst
}

// AppendStringStrict is AppendString that also reports whether the value
// is exactly what the text says: false when some invalid UTF-8 byte or
// lone surrogate escape became U+FFFD, for a caller that refuses those.
func AppendStringStrict(dst, b []byte, s String) (_ []byte, exact bool) {
	raw := b[s.Start:s.End]
	dst = slices.Grow(dst, len(raw))
	exact = s.ASCII || utf8.Valid(raw)
	if !s.Escaped {
		return appendText(dst, raw, exact), exact
	}
	for len(raw) > 0 {
		k := bytes.IndexByte(raw, '\\')
		if k < 0 {
			return appendText(dst, raw, exact), exact
		}
		dst = appendText(dst, raw[:k], exact)
		var n int
		if dst, n = appendEscape(dst, raw[k:]); n == 6 && loneSurrogate(raw[k:]) {
			exact = false
		}
		raw = raw[k+n:]
	}
	return dst, exact
}

// loneSurrogate reports whether the escape at the start of e, which
// appendEscape read as six bytes (not a pair), is a surrogate: U+FFFD.
func loneSurrogate(e []byte) bool { return e[1] == 'u' && utf16.IsSurrogate(hex4(e[2:])) }

// DecodeString is ReadString that also appends the string's value to
// dst, decoded as AppendString decodes it, in the same pass: text with
// escapes is read once, not validated first and decoded after. The
// chat-template decoder decodes every string, and most of its long ones
// have escapes (a newline a line, JSON within JSON). dst grows once, to
// the raw length, which decoding only shortens but for invalid bytes.
func DecodeString(dst, b []byte, i int) ([]byte, String, int, error) {
	start := i + 1
	dst = slices.Grow(dst, closingQuote(b, start)-start)
	var high uint64 // the high bits of the bytes looked at: 0 while ASCII
	escaped := false
	for i = start; ; {
		j, h := stringEndFrom(b, i)
		high |= h
		dst = appendText(dst, b[i:j], h == 0)
		if j >= len(b) {
			return dst, String{}, len(b), &Error{Off: len(b), Msg: "unexpected end of JSON input in string literal"}
		}
		switch b[j] {
		case '"':
			return dst, String{Start: start, End: j, Escaped: escaped, ASCII: high == 0}, j + 1, nil
		case '\\':
			escaped = true
			if next, err := skipEscapes(b, j); err != nil {
				return dst, String{}, next, err
			}
			var n int
			dst, n = appendEscape(dst, b[j:])
			i = j + n
		default: // control character
			e := Unexpected(b, j, "in string literal")
			return dst, String{}, e.Off, e
		}
	}
}

// skipEscapes validates the escape at b[i] and, when it is a \u escape
// another follows, that one too: appendEscape reads both when they may be
// a surrogate pair.
func skipEscapes(b []byte, i int) (int, error) {
	next, err := SkipEscape(b, i)
	if err == nil && b[i+1] == 'u' && next+1 < len(b) && b[next] == '\\' && b[next+1] == 'u' {
		return SkipEscape(b, next)
	}
	return next, err
}

// closingQuote returns the index of the quote that ends the string whose
// text continues at b[i:] (len(b) when there is none): the first quote
// after an even run of backslashes.
func closingQuote(b []byte, i int) int {
	for {
		k := bytes.IndexByte(b[i:], '"')
		if k < 0 {
			return len(b)
		}
		q := i + k
		n := 0
		for n < q && b[q-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			return q
		}
		i = q + 1
	}
}

// appendText appends text that holds no escape, each invalid UTF-8 byte
// as U+FFFD; valid says that it is valid UTF-8 (or else not known to be).
func appendText(dst, text []byte, valid bool) []byte {
	if valid || utf8.Valid(text) {
		return append(dst, text...)
	}
	for len(text) > 0 {
		r, size := utf8.DecodeRune(text)
		if r == utf8.RuneError && size == 1 {
			dst = utf8.AppendRune(dst, r)
		} else {
			dst = append(dst, text[:size]...)
		}
		text = text[size:]
	}
	return dst
}

// appendEscape decodes the (validated) escape at the start of e onto dst
// and returns how many bytes of e it used: a surrogate pair is two
// escapes; a lone surrogate is U+FFFD, and the escape after it (if any)
// is read on its own, as encoding/json reads it.
func appendEscape(dst, e []byte) ([]byte, int) {
	if c := simpleEscapes[e[1]]; c != 0 {
		return append(dst, c), 2
	}
	r := hex4(e[2:])
	if !utf16.IsSurrogate(r) {
		return utf8.AppendRune(dst, r), 6
	}
	if len(e) >= 12 && e[6] == '\\' && e[7] == 'u' {
		if pair := utf16.DecodeRune(r, hex4(e[8:])); pair != utf8.RuneError {
			return utf8.AppendRune(dst, pair), 12
		}
	}
	return utf8.AppendRune(dst, utf8.RuneError), 6
}

// hex4 is the value of four validated hex digits.
func hex4(h []byte) rune {
	return rune(hexVal[h[0]])<<12 | rune(hexVal[h[1]])<<8 | rune(hexVal[h[2]])<<4 | rune(hexVal[h[3]])
}
