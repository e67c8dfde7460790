package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"unsafe"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
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

// lexErr is the lexer's error about malformed JSON, in this decoder's
// words.
func lexErr(err error) error {
	var e *jsonlex.Error
	if errors.As(err, &e) {
		return fmt.Errorf("offset %d: %s", e.Off, e.Msg)
	}
	return err
}

func (d *jsonDecoder) space() { d.i = jsonlex.SkipSpace(d.b, d.i) }

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
	case c == 't' || c == 'f' || c == 'n':
		return d.literal(c)
	}
	return nil, d.errorf("invalid character %q looking for a value", d.b[d.i])
}

// literal reads true, false or null; c is its first byte.
func (d *jsonDecoder) literal(c byte) (any, error) {
	var err error
	if d.i, err = jsonlex.Literal(d.b, d.i); err != nil {
		return nil, lexErr(err)
	}
	if c == 'n' {
		return nil, nil
	}
	return c == 't', nil
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
	end, _, err := jsonlex.Number(d.b, d.i)
	if d.i = end; err != nil {
		return nil, lexErr(err)
	}
	return json.Number(d.b[start:end]), nil
}

// str reads a string. Most strings are plain ASCII without escapes: those
// are one copy of their bytes, or none when the decoder shares the
// document's memory (DecodeJSONShared). The rest are decoded into the
// arena, or a slice of their own, which becomes the string without a
// copy: a long message is most of a request.
func (d *jsonDecoder) str() (string, error) {
	start := d.i + 1
	if end, ok := plainRun(d.b, start); ok {
		d.i = end + 1
		if d.share {
			return unsafe.String(unsafe.SliceData(d.b[start:end]), end-start), nil
		}
		return string(d.b[start:end]), nil
	}
	// Appended to the arena when there is one (a string that outgrows
	// its capacity moves it whole, the strings before keeping the old
	// array), else to a slice of its own.
	var out []byte
	if d.arena != nil {
		out = *d.arena
	}
	from := len(out)
	out, _, i, err := jsonlex.DecodeString(out, d.b, d.i)
	if d.i = i; err != nil {
		return "", lexErr(err)
	}
	if d.arena != nil {
		*d.arena = out
	}
	return unsafe.String(unsafe.SliceData(out[from:]), len(out)-from), nil
}

// plainRun finds the quote ending the string whose text begins at b[i:]
// when all of that text is plain ASCII (no escape, no control character,
// nothing above 0x7F), and reports ok: the strings str need not decode,
// found with vectorised searches for the quote and a backslash.
func plainRun(b []byte, i int) (end int, ok bool) { return jsonlex.PlainEnd(b, i) }
