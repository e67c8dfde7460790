package chattemplate

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// jsonOptions are the keyword arguments of transformers' tojson filter,
// which forwards them to Python's json.dumps (chat_template_utils.py:
// json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
// separators=separators, sort_keys=sort_keys), with ensure_ascii False by
// default so non-ASCII text is written as is).
type jsonOptions struct {
	ensureASCII bool
	indent      string // the per-level indent; meaningful when indented
	indented    bool   // indent was given (Python's indent is not None)
	itemSep     string
	keySep      string
	sortKeys    bool
}

// tojsonParams lists the filter's parameters in their positional order,
// as Python would bind `x|tojson(a, b)`.
var tojsonParams = [...]string{"ensure_ascii", "indent", "separators", "sort_keys"}

// parseJSONOptions binds the filter's positional and keyword arguments
// the way Python binds them to the tojson signature.
func parseJSONOptions(args []jinja.Value, kwargs map[string]jinja.Value) (jsonOptions, error) {
	bound := make(map[string]jinja.Value, len(args)+len(kwargs))
	if len(args) > len(tojsonParams) {
		return jsonOptions{}, fmt.Errorf("tojson takes at most %d arguments", len(tojsonParams))
	}
	for i, a := range args {
		bound[tojsonParams[i]] = a
	}
	for k, v := range kwargs {
		if _, dup := bound[k]; dup {
			return jsonOptions{}, fmt.Errorf("tojson got multiple values for %q", k)
		}
		known := false
		for _, p := range tojsonParams {
			known = known || p == k
		}
		if !known {
			return jsonOptions{}, fmt.Errorf("tojson got an unexpected keyword argument %q", k)
		}
		bound[k] = v
	}
	opts := jsonOptions{itemSep: ", ", keySep: ": "}
	if v, ok := bound["ensure_ascii"]; ok {
		opts.ensureASCII = v.IsTruthy()
	}
	if v, ok := bound["sort_keys"]; ok {
		opts.sortKeys = v.IsTruthy()
	}
	if err := opts.setIndent(bound["indent"]); err != nil {
		return jsonOptions{}, err
	}
	if err := opts.setSeparators(bound["separators"]); err != nil {
		return jsonOptions{}, err
	}
	return opts, nil
}

// setIndent follows json.dumps: an int n means n spaces (none when n is
// negative, yet still one member per line), a string is used as given,
// and an indented document drops the space after item commas.
func (o *jsonOptions) setIndent(v jinja.Value) error {
	switch {
	case v.IsUndefined() || v.IsNone():
		return nil
	case v.IsInt():
		o.indent = strings.Repeat(" ", int(max(0, min(v.AsInt(), 1<<10))))
	case v.IsString():
		o.indent = v.AsString()
	default:
		return fmt.Errorf("tojson indent must be an int or a string, not %s", v.String())
	}
	o.indented = true
	o.itemSep = ","
	return nil
}

func (o *jsonOptions) setSeparators(v jinja.Value) error {
	if v.IsUndefined() || v.IsNone() {
		return nil
	}
	if !v.IsList() || v.AsList().Len() != 2 {
		return errors.New("tojson separators must be a pair of strings")
	}
	item, key := v.AsList().Items[0], v.AsList().Items[1]
	if !item.IsString() || !key.IsString() {
		return errors.New("tojson separators must be a pair of strings")
	}
	o.itemSep, o.keySep = item.AsString(), key.AsString()
	return nil
}

// pyJSON encodes v as Python's json.dumps would with opts.
func pyJSON(v jinja.Value, opts jsonOptions) (string, error) {
	var b strings.Builder
	if err := opts.encode(&b, v, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func (o *jsonOptions) encode(b *strings.Builder, v jinja.Value, level int) error {
	if level > maxDepth {
		return errors.New("tojson: value nested too deeply")
	}
	switch {
	case v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyJSONFloat(v.AsFloat()))
	case v.IsString():
		writeJSONString(b, v.AsString(), o.ensureASCII)
	case v.IsList():
		return o.encodeList(b, v.AsList().Items, level)
	case v.IsDict():
		return o.encodeDict(b, v.AsDict(), level)
	case v.IsUndefined():
		return errors.New("tojson: Object of type Undefined is not JSON serializable")
	default:
		return fmt.Errorf("tojson: %s is not JSON serializable", v.String())
	}
	return nil
}

func (o *jsonOptions) encodeList(b *strings.Builder, items []jinja.Value, level int) error {
	if len(items) == 0 {
		b.WriteString("[]")
		return nil
	}
	b.WriteByte('[')
	for i, item := range items {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		o.newline(b, level+1)
		if err := o.encode(b, item, level+1); err != nil {
			return err
		}
	}
	o.newline(b, level)
	b.WriteByte(']')
	return nil
}

func (o *jsonOptions) encodeDict(b *strings.Builder, d *jinja.Dict, level int) error {
	if d.Len() == 0 {
		b.WriteString("{}")
		return nil
	}
	keys := d.Keys
	if o.sortKeys {
		keys = append([]string(nil), keys...)
		sort.Strings(keys)
	}
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		o.newline(b, level+1)
		writeJSONString(b, k, o.ensureASCII)
		b.WriteString(o.keySep)
		if err := o.encode(b, d.Data[k], level+1); err != nil {
			return err
		}
	}
	o.newline(b, level)
	b.WriteByte('}')
	return nil
}

func (o *jsonOptions) newline(b *strings.Builder, level int) {
	if !o.indented {
		return
	}
	b.WriteByte('\n')
	for range level {
		b.WriteString(o.indent)
	}
}

// writeJSONString quotes s as json.dumps does. Without ensure_ascii only
// the quote, the backslash and control characters below U+0020 are
// escaped (so U+2028 and DEL stay raw, unlike Go's encoding/json); with
// it, everything outside printable ASCII becomes \uXXXX, astral
// characters as surrogate pairs. Invalid UTF-8 cannot occur in a Python
// string and is written as U+FFFD.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (ensureASCII && r > 0x7e):
			for _, u := range utf16Units(r) {
				b.WriteString(`\u`)
				b.WriteByte(hex[u>>12&0xf])
				b.WriteByte(hex[u>>8&0xf])
				b.WriteByte(hex[u>>4&0xf])
				b.WriteByte(hex[u&0xf])
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// utf16Units returns r's UTF-16 code units.
func utf16Units(r rune) []uint16 {
	if r == utf8.RuneError || r < 0x10000 {
		return []uint16{uint16(r)}
	}
	r -= 0x10000
	return []uint16{uint16(0xd800 + (r >> 10)), uint16(0xdc00 + (r & 0x3ff))}
}

// pyJSONFloat writes f as json.dumps does: float.__repr__, with the
// non-finite values spelled the JavaScript way (allow_nan defaults to
// True).
func pyJSONFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyFloatRepr(f)
}

// pyFloatRepr returns Python's repr of a finite float: the shortest
// digits that round-trip, positional when the decimal exponent is in
// [-4, 16) with ".0" added to integral values, scientific otherwise with
// a signed exponent of at least two digits (1e+16, 1.5e-05).
func pyFloatRepr(f float64) string {
	sci := strconv.FormatFloat(f, 'e', -1, 64) // e.g. "-1.2345e+06"
	sign := ""
	if sci[0] == '-' {
		sign, sci = "-", sci[1:]
	}
	mant, expStr, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}
