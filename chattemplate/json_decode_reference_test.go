package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// referenceDecodeJSON is the encoding/json decoder DecodeJSON replaced,
// kept as the reference of FuzzDecodeJSON: both must agree on every input.
// It decodes one JSON document the way Python's json.loads reads
// it for vLLM: objects become Objects that keep their member order (a
// repeated key keeps its first position and its last value, as in a
// Python dict), numbers become json.Number so that integers and floats
// stay distinct, and text after the document is an error. Use it for a
// request's messages and tools when the template's tojson output must be
// byte-exact.
//
// Python also accepts NaN and Infinity literals, which encoding/json
// rejects; such documents are errors here.
func referenceDecodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := refValue(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: decode JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("chattemplate: decode JSON: extra data after the document")
	}
	return v, nil
}

func refValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return refObject(dec, depth)
		case '[':
			return refArray(dec, depth)
		}
		return nil, fmt.Errorf("unexpected %q", rune(t))
	default:
		// string, json.Number, bool or nil.
		return t, nil
	}
}

func refObject(dec *json.Decoder, depth int) (any, error) {
	obj := Object{Values: map[string]any{}}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("object key is %T, not a string", tok)
		}
		v, err := refValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		if _, seen := obj.Values[key]; !seen {
			obj.Keys = append(obj.Keys, key)
		}
		obj.Values[key] = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, err
	}
	return obj, nil
}

func refArray(dec *json.Decoder, depth int) (any, error) {
	items := []any{}
	for dec.More() {
		v, err := refValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		items = append(items, v)
	}
	if _, err := dec.Token(); err != nil { // the closing ']'
		return nil, err
	}
	return items, nil
}
