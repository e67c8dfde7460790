package openai

import (
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// vLLM's Anthropic conversion turns some JSON values into text with
// Python: a tool_use block's input with json.dumps, an assistant's
// tool_result content with str(). The text is part of the prompt, so it
// must be byte for byte what Python prints: json.dumps' default separators
// (", " and ": ") and ASCII escapes, Python's float repr, and str()'s
// quoting of dicts and lists.

// pyStyle selects json.dumps or repr rendering.
type pyStyle int

const (
	pyJSON pyStyle = iota // json.dumps(v) with Python's defaults
	pyRepr                // repr(v), which is str(v) for dicts and lists
)

// pyDumps returns Python's json.dumps of the value JSON v decodes to.
func pyDumps(v []byte) string { return string(appendPy(nil, v, pyJSON)) }

// pyStr returns Python's str() of the value JSON v decodes to: a string
// itself, anything else its repr.
func pyStr(v []byte) string {
	if s, ok := decodeString(v); ok {
		return s
	}
	return string(appendPy(nil, v, pyRepr))
}

// appendPy appends the rendering of the validated JSON value v.
func appendPy(dst, v []byte, style pyStyle) []byte {
	switch c := v[0]; {
	case c == '{':
		dst = append(dst, '{')
		for i, m := range parseObject(v) {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPyString(dst, m.key, style)
			dst = append(dst, ": "...)
			dst = appendPy(dst, m.val, style)
		}
		return append(dst, '}')
	case c == '[':
		dst = append(dst, '[')
		for i, e := range parseElems(v) {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPy(dst, e, style)
		}
		return append(dst, ']')
	case c == '"':
		s, _ := decodeString(v)
		return appendPyString(dst, s, style)
	case c == 't', c == 'f', c == 'n':
		if style == pyJSON {
			return append(dst, v...)
		}
		return append(dst, map[byte]string{'t': "True", 'f': "False", 'n': "None"}[c]...)
	}
	return appendPyNumber(dst, v, style)
}

// appendPyNumber renders a JSON number as Python does after json.loads
// (pydantic's parser agrees): an int when it has no fraction or exponent,
// kept exactly at any size, else a float, printed with repr.
func appendPyNumber(dst, v []byte, style pyStyle) []byte {
	s := string(v)
	if !strings.ContainsAny(s, ".eE") {
		if strings.Trim(s, "-0") == "" {
			return append(dst, '0') // -0 is the int 0
		}
		return append(dst, s...)
	}
	f, _ := jsonlex.ParseFloat(v) // out of range: ±Inf, as in Python
	switch {
	case math.IsInf(f, 1):
		return append(dst, map[pyStyle]string{pyJSON: "Infinity", pyRepr: "inf"}[style]...)
	case math.IsInf(f, -1):
		return append(dst, map[pyStyle]string{pyJSON: "-Infinity", pyRepr: "-inf"}[style]...)
	}
	return appendPyFloat(dst, f)
}

// appendPyFloat appends Python's repr of f: the shortest digits that read
// back as f, in positional notation when the decimal exponent is in
// [-5, 16), with ".0" for integral values, else as d.ddde±XX.
func appendPyFloat(dst []byte, f float64) []byte {
	e := strconv.AppendFloat(nil, f, 'e', -1, 64)
	exp, _ := strconv.Atoi(string(e[strings.LastIndexByte(string(e), 'e')+1:]))
	if exp < -4 || exp >= 16 {
		return append(dst, e...) // Go's form is Python's: 1e+16, 1.5e-05
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'f', -1, 64)
	if !strings.ContainsRune(string(dst[start:]), '.') {
		dst = append(dst, ".0"...)
	}
	return dst
}

// appendPyString appends s quoted as json.dumps (ensure_ascii) or repr
// quotes it.
func appendPyString(dst []byte, s string, style pyStyle) []byte {
	if style == pyJSON {
		return appendPyJSONString(dst, s)
	}
	return appendPyReprString(dst, s)
}

// appendPyJSONString is json.dumps' ensure_ascii quoting: everything
// outside ' '..'~' escaped, non-ASCII as \uXXXX (surrogate pairs above
// the BMP), lower-case hex.
func appendPyJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r == '\b':
			dst = append(dst, `\b`...)
		case r == '\f':
			dst = append(dst, `\f`...)
		case r >= ' ' && r <= '~':
			dst = append(dst, byte(r))
		case r > 0xffff:
			r -= 0x10000
			dst = appendU(dst, 0xd800+(r>>10))
			dst = appendU(dst, 0xdc00+(r&0x3ff))
		default:
			dst = appendU(dst, r)
		}
	}
	return append(dst, '"')
}

// appendU appends \uXXXX.
func appendU(dst []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	return append(dst, '\\', 'u', hex[r>>12&15], hex[r>>8&15], hex[r>>4&15], hex[r&15])
}

// appendPyReprString is repr(str): single quotes unless the text has a
// single quote and no double quote; non-printable characters escaped as
// \xXX, \uXXXX or \UXXXXXXXX. Go's unicode.IsPrint has Python's
// definition of printable (no C* or Z* category but the space).
func appendPyReprString(dst []byte, s string) []byte {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	const hex = "0123456789abcdef"
	dst = append(dst, q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r < 0x80 && r >= ' ' && r < 0x7f, r >= 0x80 && unicode.IsPrint(r):
			dst = utf8.AppendRune(dst, r)
		case r < 0x100:
			dst = append(dst, '\\', 'x', hex[r>>4], hex[r&15])
		case r < 0x10000:
			dst = appendU(dst, r)
		default:
			dst = append(dst, `\U`...)
			for sh := 28; sh >= 0; sh -= 4 {
				dst = append(dst, hex[r>>sh&15])
			}
		}
	}
	return append(dst, q)
}
