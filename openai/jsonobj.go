package openai

import (
	"encoding/json"
	"strconv"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// This file holds what the converting parsers (Responses, Anthropic
// Messages, pooling) share: a whole-body check, a one-level view of an
// object's members, and a writer for the chat messages they build. Unlike
// ParseRequest, which keeps sub-slices of the body, these parsers rebuild
// messages the way vLLM's Python does, so they look into nested objects;
// the body is validated once up front, and the nested walks over parts of
// it cannot fail on syntax.
//
// Types are checked strictly, as ParseRequest checks them: pydantic's lax
// coercions, which vLLM accepts ("stream": "true", "max_tokens": "8"), are
// errors here.

// member is one key of an object with its raw value.
type member struct {
	key string
	val []byte
}

// object is the members of a JSON object in the order a Python dict built
// from it has: a repeated key keeps the position of its first occurrence
// and the value of its last, as dict assignment does.
type object []member

// get returns the raw value of key, or nil when absent.
func (o object) get(key string) []byte {
	for _, m := range o {
		if m.key == key {
			return m.val
		}
	}
	return nil
}

// parseObject reads the members of the object v, which was validated.
// The values are two-index sub-slices of v, so that an error's offset in
// the body is cap(body)-cap(value) (see fieldErr); clip them before
// handing them out.
func parseObject(v []byte) object {
	s := &scanner{b: v}
	var o object
	var index map[string]int // for large objects, so that dedup stays linear
	_ = s.object(func(ks, ke int, esc bool) error {
		k := string(keyBytes(v, ks, ke, esc))
		start, end, err := s.value()
		if i, ok := o.find(k, index); ok {
			o[i].val = v[start:end]
			return err
		}
		if len(o) == 16 {
			index = make(map[string]int)
			for i, m := range o {
				index[m.key] = i
			}
		}
		if index != nil {
			index[k] = len(o)
		}
		o = append(o, member{k, v[start:end]})
		return err
	})
	return o
}

// find returns the position of key, looked up in index when there is one.
func (o object) find(key string, index map[string]int) (int, bool) {
	if index != nil {
		i, ok := index[key]
		return i, ok
	}
	for i, m := range o {
		if m.key == key {
			return i, true
		}
	}
	return 0, false
}

// parseElems returns the elements of the array v, which was validated.
func parseElems(v []byte) [][]byte {
	s := &scanner{b: v}
	var out [][]byte
	_ = s.array(func() error {
		start, end, err := s.value()
		out = append(out, v[start:end])
		return err
	})
	return out
}

// parseBody validates body as a JSON object (UTF-8, syntax, depth) and
// returns its top-level members. Every error is a *RequestError.
func parseBody(body []byte) (object, error) {
	if off := invalidUTF8Offset(body); off >= 0 {
		return nil, &RequestError{Offset: off, Msg: "body is not valid UTF-8"}
	}
	s := &scanner{b: body}
	s.ws()
	if s.peek() != '{' {
		if s.i >= len(body) {
			return nil, &RequestError{Offset: s.i, Msg: "empty body: expected a JSON object"}
		}
		if err := s.skip(); err != nil {
			return nil, syntaxToRequestError(err)
		}
		return nil, &RequestError{Offset: 0, Msg: "body must be a JSON object"}
	}
	start := s.i
	err := s.skip()
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return nil, syntaxToRequestError(err)
	}
	return parseObject(body[start:s.i]), nil
}

// fieldErr is a *RequestError about the value v of the top-level field
// param, v being a sub-slice of body (so its offset is known). path names
// the nested value at fault, for the message.
func fieldErr(body, v []byte, param, path, msg string) error {
	off := 0
	if v != nil {
		off = cap(body) - cap(v)
	}
	if path != "" && path != param {
		msg = path + ": " + msg
	}
	return &RequestError{Param: param, Offset: off, Msg: msg}
}

// clip returns v with its capacity cut to its length, so that appending
// to a raw value handed out never writes into the body.
func clip(v []byte) json.RawMessage { return json.RawMessage(v[:len(v):len(v)]) }

// isNull reports whether the raw value is absent or null: the two are the
// same to pydantic's optional fields.
func isNull(v []byte) bool { return v == nil || v[0] == 'n' }

// decodeString decodes a raw JSON string; ok is false for other kinds.
func decodeString(v []byte) (string, bool) {
	if len(v) == 0 || v[0] != '"' {
		return "", false
	}
	str, _, err := jsonlex.ReadString(v, 0)
	if err != nil {
		return "", false
	}
	return string(jsonlex.AppendString(nil, v, str)), true
}

// truthy is Python's bool() of the value JSON v decodes to.
func truthy(v []byte) bool {
	switch {
	case isNull(v), string(v) == "false", string(v) == `""`, string(v) == "[]":
		return false
	case v[0] == '{':
		return len(parseObject(v)) > 0
	case v[0] == '[':
		return len(parseElems(v)) > 0
	case v[0] == '"':
		return true
	case v[0] == '-' || v[0] >= '0' && v[0] <= '9':
		f, err := jsonlex.ParseFloat(v)
		return err != nil || f != 0
	}
	return true // true
}

// kindOf names a raw value's JSON type for error messages.
func kindOf(v []byte) string {
	if v == nil {
		return "absent"
	}
	return kind(v[0])
}

// msg is one chat message being built: keys in the order vLLM's Python
// inserts them, each with a value already encoded as JSON. Entries of a
// list value (tool_calls, content parts) are kept apart so a later item
// can extend them, as vLLM appends to the list in a previous message.
type msg struct {
	keys []string
	vals []any // []byte (encoded JSON) or [][]byte (a list's encoded elements)
}

// set sets key to the encoded value v ([]byte) or list ([][]byte),
// keeping the key's position when it is already present.
func (m *msg) set(key string, v any) {
	for i, k := range m.keys {
		if k == key {
			m.vals[i] = v
			return
		}
	}
	m.keys = append(m.keys, key)
	m.vals = append(m.vals, v)
}

// has reports whether key is present, as Python's dict.get(key) is not
// None (no value set here is null).
func (m *msg) has(key string) bool {
	for _, k := range m.keys {
		if k == key {
			return true
		}
	}
	return false
}

// appendTo appends the message as a JSON object.
func (m *msg) appendTo(dst []byte) []byte {
	dst = append(dst, '{')
	for i, k := range m.keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		switch v := m.vals[i].(type) {
		case []byte:
			dst = append(dst, v...)
		case [][]byte:
			dst = appendList(dst, v)
		}
	}
	return append(dst, '}')
}

// appendList appends encoded elements as a JSON array.
func appendList(dst []byte, elems [][]byte) []byte {
	dst = append(dst, '[')
	for i, e := range elems {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, e...)
	}
	return append(dst, ']')
}

// encodeMessages renders the built messages as a JSON array.
func encodeMessages(msgs []*msg) []byte {
	out := []byte{'['}
	for i, m := range msgs {
		if i > 0 {
			out = append(out, ',')
		}
		out = m.appendTo(out)
	}
	return append(out, ']')
}

// jstr encodes s as a JSON string.
func jstr(s string) []byte { return appendJSONString(nil, s) }

// appendJSONString appends s as a JSON string, escaping only what JSON
// requires: the output is read by a JSON decoder, never by a browser.
// Invalid UTF-8 cannot occur (every string came from a validated body).
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// itoa formats an index for error paths.
func itoa(i int) string { return strconv.Itoa(i) }
