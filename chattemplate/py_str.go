package chattemplate

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// pyStr is Python's str() of a template value, which is what jinja2
// writes for {{ value }}: None prints as "None", floats by their repr
// ("1.0", not the engine's "1"), and lists and dicts by their repr, with
// strings inside quoted the Python way. Undefined prints as nothing, as
// jinja2's default Undefined does.
func pyStr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsString():
		return v.AsString()
	}
	var b strings.Builder
	writePyRepr(&b, v, 0)
	return b.String()
}

// writePyRepr writes Python's repr of v.
func writePyRepr(b *strings.Builder, v jinja.Value, depth int) {
	if depth > maxDepth {
		b.WriteString("[...]")
		return
	}
	switch {
	case v.IsUndefined():
		// repr of a jinja2 Undefined inside a container.
		b.WriteString("Undefined")
	case v.IsNone():
		b.WriteString("None")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloatStr(v.AsFloat()))
	case v.IsString():
		writePyStringRepr(b, v.AsString())
	case v.IsList():
		b.WriteByte('[')
		for i, item := range v.AsList().Items {
			if i > 0 {
				b.WriteString(", ")
			}
			writePyRepr(b, item, depth+1)
		}
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		b.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writePyStringRepr(b, k)
			b.WriteString(": ")
			writePyRepr(b, d.Data[k], depth+1)
		}
		b.WriteByte('}')
	default:
		b.WriteString(v.String())
	}
}

// pyFloatStr is Python's str() of a float, non-finite values included.
func pyFloatStr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return pyFloatRepr(f)
}

// writePyStringRepr quotes s as Python's repr does: single quotes unless
// s holds a single quote and no double quote, backslash escapes for the
// quote, the backslash and \t \n \r, and \x, \u or \U escapes for other
// characters that are not printable.
func writePyStringRepr(b *strings.Builder, s string) {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == ' ' || (r >= 0x20 && r < 0x7f) || (r > 0x7f && unicode.IsPrint(r)):
			b.WriteRune(r)
		case r <= 0xff:
			fmt.Fprintf(b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			fmt.Fprintf(b, `\U%08x`, r)
		}
	}
	b.WriteByte(quote)
}
