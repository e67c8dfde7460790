package chattemplate

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// maxDepth bounds how deeply nested the request values may be. Python's
// json module and pydantic give up far earlier than any real conversation
// needs, and the bound keeps the recursive conversions here from growing
// the stack without limit on hostile input.
const maxDepth = 256

// Object is a JSON object that keeps its members in the order the document
// gave them. Python dicts keep insertion order, so vLLM's tojson of a tool
// definition or of tool-call arguments writes the keys in the request's
// order; a Go map cannot carry that order, which is why DecodeJSON returns
// Objects and Input accepts them alongside plain maps.
type Object struct {
	// Keys lists each member name once, in document order.
	Keys []string
	// Values holds each member's value (the same kinds DecodeJSON returns).
	Values map[string]any
}

// Get returns the member named key and whether it exists.
func (o Object) Get(key string) (any, bool) {
	v, ok := o.Values[key]
	return v, ok
}

// toValue converts a request value into the template engine's value.
// Accepted kinds are those encoding/json and DecodeJSON produce, plus the
// common Go scalars. Maps have no order, so their keys are sorted: callers
// that need byte-exact tojson output pass Objects instead.
func toValue(v any, depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Undefined(), fmt.Errorf("%w: values nested deeper than %d levels", ErrInvalidInput, maxDepth)
	}
	switch val := v.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(val), nil
	case string:
		return jinja.NewString(val), nil
	case int:
		return jinja.NewInt(int64(val)), nil
	case int64:
		return jinja.NewInt(val), nil
	case float64:
		return jinja.NewFloat(val), nil
	case json.Number:
		return numberValue(string(val))
	case []any:
		return listValue(val, depth)
	case map[string]any:
		return mapValue(val, depth)
	case Object:
		return objectValue(val, depth)
	case *Object:
		if val == nil {
			return jinja.None(), nil
		}
		return objectValue(*val, depth)
	case jinja.Value:
		return val, nil
	}
	return jinja.Undefined(), fmt.Errorf("%w: unsupported value of type %T", ErrInvalidInput, v)
}

func listValue(items []any, depth int) (jinja.Value, error) {
	out := make([]jinja.Value, len(items))
	for i, item := range items {
		v, err := toValue(item, depth+1)
		if err != nil {
			return jinja.Undefined(), err
		}
		out[i] = v
	}
	return jinja.NewList(out), nil
}

func mapValue(m map[string]any, depth int) (jinja.Value, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	d := newDict(len(keys))
	for _, k := range keys {
		v, err := toValue(m[k], depth+1)
		if err != nil {
			return jinja.Undefined(), err
		}
		d.AsDict().Set(k, v)
	}
	return d, nil
}

func objectValue(o Object, depth int) (jinja.Value, error) {
	d := newDict(len(o.Keys))
	for _, k := range o.Keys {
		item, ok := o.Values[k]
		if !ok {
			return jinja.Undefined(), fmt.Errorf("%w: object key %q has no value", ErrInvalidInput, k)
		}
		v, err := toValue(item, depth+1)
		if err != nil {
			return jinja.Undefined(), err
		}
		d.AsDict().Set(k, v)
	}
	return d, nil
}

// newDict returns an empty dict sized for n members.
func newDict(n int) jinja.Value {
	d := jinja.NewDict()
	dd := d.AsDict()
	dd.Keys = make([]string, 0, n)
	return d
}

// numberValue turns a JSON number into the value Python's json.loads
// would give: an int when the literal has no fraction or exponent, else a
// float. Python ints are unbounded; integers beyond int64 become the
// nearest float here, which is the one documented divergence. Overflowing
// floats become ±Inf as in Python.
func numberValue(lit string) (jinja.Value, error) {
	if !strings.ContainsAny(lit, ".eE") {
		if i, err := strconv.ParseInt(lit, 10, 64); err == nil {
			return jinja.NewInt(i), nil
		}
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !math.IsInf(f, 0) {
		return jinja.Undefined(), fmt.Errorf("%w: bad number %q", ErrInvalidInput, lit)
	}
	return jinja.NewFloat(f), nil
}

// dictGet returns d[key] and whether the key exists.
func dictGet(v jinja.Value, key string) (jinja.Value, bool) {
	if !v.IsDict() {
		return jinja.Undefined(), false
	}
	return v.AsDict().Get(key)
}

// copyDict returns a shallow copy of a dict so that rewriting one member
// leaves the caller's value alone, as vLLM mutates its own parsed copy of
// the request rather than the client's.
func copyDict(v jinja.Value) jinja.Value {
	src := v.AsDict()
	d := newDict(src.Len())
	for _, k := range src.Keys {
		d.AsDict().Set(k, src.Data[k])
	}
	return d
}
