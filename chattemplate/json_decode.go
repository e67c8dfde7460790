package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/llmgw/caddy-llmgw/internal/bytescan"
)

// DecodeJSON decodes one JSON document the way Python's json.loads reads
// it for vLLM: objects become Objects that keep their member order (a
// repeated key keeps its first position and its last value, as in a
// Python dict), numbers become json.Number so that integers and floats
// stay distinct, and text after the document is an error. Use it for a
// request's messages and tools when the template's tojson output must be
// byte-exact.
//
// Strings decode as encoding/json decodes them (invalid UTF-8 and lone
// surrogates become U+FFFD). Python also accepts NaN and Infinity
// literals, which JSON does not; such documents are errors here.
//
// It is a single pass over the bytes: this runs on every locally
// tokenized chat request, where encoding/json's token stream cost as much
// as encoding the prompt (FuzzDecodeJSON holds it to encoding/json).
func DecodeJSON(data []byte) (any, error) {
	return decodeJSON(jsonDecoder{b: data})
}

// DecodeJSONShared is DecodeJSON for a document that nothing changes while
// the result is in use, such as a parsed request's body: strings without
// escapes or non-ASCII bytes are views of data's bytes, not copies. A
// long message is usually such a string, and copying it was most of the
// decoder's cost and an allocation the size of the request.
func DecodeJSONShared(data []byte) (any, error) {
	return decodeJSON(jsonDecoder{b: data, share: true})
}

// DecodeJSONArena is DecodeJSONShared that writes the strings it must
// decode (those with escapes or non-ASCII bytes) into *arena, appending,
// instead of allocating each. The caller owns the arena: it may reuse it
// (arena[:0]) only once nothing uses the result any more, for the
// strings are views of it. A chat's history is mostly such strings when
// its text has newlines or quotes; decoding them into one reused buffer
// spares an allocation the size of the conversation per request.
func DecodeJSONArena(data []byte, arena *[]byte) (any, error) {
	return decodeJSON(jsonDecoder{b: data, share: true, arena: arena})
}

func decodeJSON(d jsonDecoder) (any, error) {
	v, err := d.value(0)
	if err == nil {
		d.space()
		if d.i < len(d.b) {
			err = d.errorf("extra data after the document")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("chattemplate: decode JSON: %w", err)
	}
	return v, nil
}

// jsonDecoder is DecodeJSON's cursor over one document.
type jsonDecoder struct {
	b     []byte
	i     int
	share bool // strings may point into b (DecodeJSONShared)
	// arena, when set, receives the decoded strings (DecodeJSONArena).
	arena *[]byte
}

var errJSONEnd = errors.New("unexpected end of JSON input")

func (d *jsonDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("offset %d: "+format, append([]any{d.i}, args...)...)
}

func (d *jsonDecoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value(depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxDepth)
	}
	d.space()
	if d.i >= len(d.b) {
		return nil, errJSONEnd
	}
	switch c := d.b[d.i]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		return d.str()
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	}
	for _, lit := range []struct {
		text string
		v    any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if len(d.b)-d.i >= len(lit.text) && string(d.b[d.i:d.i+len(lit.text)]) == lit.text {
			d.i += len(lit.text)
			return lit.v, nil
		}
	}
	return nil, d.errorf("invalid character %q looking for a value", d.b[d.i])
}

func (d *jsonDecoder) object(depth int) (any, error) {
	d.i++ // '{'
	obj := Object{Values: map[string]any{}}
	if d.space(); d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		return obj, nil
	}
	for {
		if d.space(); d.i >= len(d.b) || d.b[d.i] != '"' {
			return nil, d.expected("an object key")
		}
		key, err := d.str()
		if err != nil {
			return nil, err
		}
		if d.space(); d.i >= len(d.b) || d.b[d.i] != ':' {
			return nil, d.expected("':' after an object key")
		}
		d.i++
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		if _, seen := obj.Values[key]; !seen {
			obj.Keys = append(obj.Keys, key)
		}
		obj.Values[key] = v
		if done, err := d.next('}'); done || err != nil {
			return obj, err
		}
	}
}

func (d *jsonDecoder) array(depth int) (any, error) {
	d.i++ // '['
	items := []any{}
	if d.space(); d.i < len(d.b) && d.b[d.i] == ']' {
		d.i++
		return items, nil
	}
	for {
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		items = append(items, v)
		if done, err := d.next(']'); done || err != nil {
			return items, err
		}
	}
}

// next reads the ',' between members, or the closing byte (done).
func (d *jsonDecoder) next(closing byte) (done bool, err error) {
	d.space()
	switch {
	case d.i >= len(d.b):
		return false, errJSONEnd
	case d.b[d.i] == ',':
		d.i++
		return false, nil
	case d.b[d.i] == closing:
		d.i++
		return true, nil
	}
	return false, d.expected(fmt.Sprintf("',' or '%c'", closing))
}

func (d *jsonDecoder) expected(what string) error {
	if d.i >= len(d.b) {
		return errJSONEnd
	}
	return d.errorf("invalid character %q, expected %s", d.b[d.i], what)
}

// number reads a number with JSON's grammar and keeps its text.
func (d *jsonDecoder) number() (any, error) {
	start := d.i
	if d.b[d.i] == '-' {
		d.i++
	}
	switch {
	case d.i < len(d.b) && d.b[d.i] == '0':
		d.i++
	case d.digits() == 0:
		return nil, d.expected("a digit")
	}
	if d.i < len(d.b) && d.b[d.i] == '.' {
		d.i++
		if d.digits() == 0 {
			return nil, d.expected("a digit after '.'")
		}
	}
	if d.i < len(d.b) && (d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		d.i++
		if d.i < len(d.b) && (d.b[d.i] == '+' || d.b[d.i] == '-') {
			d.i++
		}
		if d.digits() == 0 {
			return nil, d.expected("a digit in the exponent")
		}
	}
	return json.Number(d.b[start:d.i]), nil
}

func (d *jsonDecoder) digits() int {
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	return d.i - start
}

// str reads a string. Most strings are plain ASCII without escapes: those
// are one copy of their bytes, or none when the decoder shares the
// document's memory (DecodeJSONShared). The rest go to slowStr.
func (d *jsonDecoder) str() (string, error) {
	d.i++ // '"'
	start := d.i
	if end, ok := plainRun(d.b, start); ok {
		d.i = end + 1
		if d.share {
			return unsafe.String(unsafe.SliceData(d.b[start:end]), end-start), nil
		}
		return string(d.b[start:end]), nil
	}
	return d.slowStr(start)
}

// plainRun finds the quote ending the string whose text begins at b[i:]
// when all of that text is plain ASCII (no escape, no control character,
// nothing above 0x7F), and reports ok; anything else is left to slowStr,
// which decodes or rejects it. The quote and the backslash are found
// by IndexByte's vectorized search and the rest is checked eight bytes at
// a time: a long message is most of a request.
func plainRun(b []byte, i int) (end int, ok bool) {
	k := bytes.IndexByte(b[i:], '"')
	if k < 0 {
		return 0, false
	}
	run := b[i : i+k]
	if bytes.IndexByte(run, '\\') >= 0 {
		return 0, false
	}
	if end, high := bytescan.ControlFrom(run, 0, len(run)); end < len(run) || high != 0 {
		return 0, false
	}
	return i + k, true
}

// slowStr reads a string holding escapes, non-ASCII or control bytes (an
// error), or no closing quote, from start (after the opening quote), where
// d.i is. It goes from stop to stop (bytescan.StringEndFrom: quote,
// backslash, control byte), copying the text between them whole when it
// is ASCII or valid UTF-8; only a stretch with invalid bytes is decoded
// rune by rune (each invalid byte becomes U+FFFD, as encoding/json). The
// output is sized once, to the raw string's length (decoding only
// shortens it, but for invalid bytes, which grow to U+FFFD), and becomes
// the string without a copy: a long message is most of a request.
func (d *jsonDecoder) slowStr(start int) (string, error) {
	b := d.b
	// Appended to the arena when there is one (a string that outgrows
	// its capacity moves it whole, the strings before keeping the old
	// array), else to a slice of its own.
	var arena []byte
	if d.arena != nil {
		arena = *d.arena
	}
	from := len(arena)
	out := slices.Grow(arena, closingQuote(b, d.i)-start)
	for {
		j, high := bytescan.StringEndFrom(b, d.i)
		if run := b[d.i:j]; high == 0 || utf8.Valid(run) {
			out = append(out, run...)
		} else {
			out = appendInvalid(out, run)
		}
		d.i = j
		if j >= len(b) {
			return "", errJSONEnd
		}
		switch c := b[j]; c {
		case '"':
			d.i++
			if d.arena != nil {
				*d.arena = out
			}
			return unsafe.String(unsafe.SliceData(out[from:]), len(out)-from), nil
		case '\\':
			var err error
			if out, err = d.escape(out); err != nil {
				return "", err
			}
		default:
			return "", d.errorf("control character %#x in a string", c)
		}
	}
}

// appendInvalid appends run, text that is not valid UTF-8, rune by rune,
// each invalid byte as U+FFFD.
func appendInvalid(out, run []byte) []byte {
	for len(run) > 0 {
		r, size := utf8.DecodeRune(run)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, r)
		} else {
			out = append(out, run[:size]...)
		}
		run = run[size:]
	}
	return out
}

// escape decodes the escape at d.i onto out.
func (d *jsonDecoder) escape(out []byte) ([]byte, error) {
	if d.i+1 >= len(d.b) {
		return nil, errJSONEnd
	}
	c := d.b[d.i+1]
	if simple := simpleEscapes[c]; simple != 0 {
		d.i += 2
		return append(out, simple), nil
	}
	if c != 'u' {
		return nil, d.errorf("invalid escape '\\%c' in a string", c)
	}
	r, err := d.hex4(d.i + 2)
	if err != nil {
		return nil, err
	}
	d.i += 6
	if utf16.IsSurrogate(r) {
		// A pair is two escapes; anything else leaves U+FFFD, and the
		// second escape (if any) is read on its own.
		r2 := rune(-1)
		if d.i+1 < len(d.b) && d.b[d.i] == '\\' && d.b[d.i+1] == 'u' {
			if r2, err = d.hex4(d.i + 2); err != nil {
				return nil, err
			}
		}
		if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
			d.i += 6
			r = pair
		} else {
			r = utf8.RuneError
		}
	}
	return utf8.AppendRune(out, r), nil
}

// simpleEscapes maps the byte after a backslash to what it stands for; 0
// marks no simple escape.
var simpleEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

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

// hex4 reads the four hex digits of a \u escape at i.
func (d *jsonDecoder) hex4(i int) (rune, error) {
	if i+4 > len(d.b) {
		return 0, errJSONEnd
	}
	v, err := strconv.ParseUint(string(d.b[i:i+4]), 16, 16)
	if err != nil {
		return 0, d.errorf("invalid \\u escape %q", d.b[i:i+4])
	}
	return rune(v), nil
}
