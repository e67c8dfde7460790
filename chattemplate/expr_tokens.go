package chattemplate

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// tokKind classifies the tokens of a tag's expression.
type tokKind uint8

const (
	tokName tokKind = iota
	tokString
	tokNumber
	tokOp
)

// exprToken is one token of a tag's content. For strings, text is the
// value as Python's jinja2 decodes the literal, and start/end span the
// literal including its quotes.
type exprToken struct {
	kind       tokKind
	text       string
	start, end int
	// escaped marks a string literal that the engine would decode
	// differently from jinja2 (it knows only \n, \t, \\, \' and \").
	escaped bool
}

// tokenizeExpr splits a tag's content into names, strings, numbers and
// operators. It is deliberately small: it serves the source rewrite and
// the content-format detection, and the engine does the real parsing.
func tokenizeExpr(s string) ([]exprToken, error) {
	var toks []exprToken
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '\'' || c == '"':
			t, err := stringToken(s, i)
			if err != nil {
				return nil, err
			}
			toks = append(toks, t)
			i = t.end
		case isNameStart(c):
			j := i + 1
			for j < len(s) && (isNameStart(s[j]) || isDigit(s[j])) {
				j++
			}
			toks = append(toks, exprToken{kind: tokName, text: s[i:j], start: i, end: j})
			i = j
		case isDigit(c):
			j := i + 1
			for j < len(s) && (isDigit(s[j]) || s[j] == '.' || s[j] == '_') {
				j++
			}
			toks = append(toks, exprToken{kind: tokNumber, text: s[i:j], start: i, end: j})
			i = j
		default:
			n := opLen(s[i:])
			toks = append(toks, exprToken{kind: tokOp, text: s[i : i+n], start: i, end: i + n})
			i += n
		}
	}
	return toks, nil
}

func isNameStart(c byte) bool { return c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isDigit(c byte) bool     { return c >= '0' && c <= '9' }

// opLen returns the length of the operator at the start of s.
func opLen(s string) int {
	for _, op := range [...]string{"**", "//", "==", "!=", "<=", ">="} {
		if strings.HasPrefix(s, op) {
			return 2
		}
	}
	_, n := utf8.DecodeRuneInString(s)
	return n
}

// stringToken reads the quoted literal starting at s[i].
func stringToken(s string, i int) (exprToken, error) {
	quote := s[i]
	j := i + 1
	for j < len(s) && s[j] != quote {
		if s[j] == '\\' && j+1 < len(s) {
			j++
		}
		j++
	}
	if j >= len(s) {
		return exprToken{}, errors.New("unterminated string literal")
	}
	raw := s[i+1 : j]
	val, err := pyUnescape(raw)
	if err != nil {
		return exprToken{}, err
	}
	return exprToken{kind: tokString, text: val, start: i, end: j + 1,
		escaped: val != engineUnescape(raw)}, nil
}

// pyUnescape decodes a string literal's body as jinja2 does, through
// Python's unicode-escape codec: the C escapes, octal, \xhh, \uhhhh and
// \Uhhhhhhhh, a backslash-newline continuation, and any other backslash
// kept as written. Lone surrogates, which Go strings cannot hold, become
// U+FFFD; \N{...} names are not supported.
func pyUnescape(raw string) (string, error) {
	if !strings.Contains(raw, `\`) {
		return raw, nil
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' || i+1 >= len(raw) {
			b.WriteByte(raw[i])
			continue
		}
		i++
		n, err := pyEscape(&b, raw[i:])
		if err != nil {
			return "", err
		}
		i += n - 1
	}
	return b.String(), nil
}

// pyEscape writes the escape whose letter starts s and returns how many
// bytes of s it used.
func pyEscape(b *strings.Builder, s string) (int, error) {
	simple := map[byte]string{'\\': `\`, '\'': `'`, '"': `"`, 'a': "\a", 'b': "\b",
		'f': "\f", 'n': "\n", 'r': "\r", 't': "\t", 'v': "\v", '\n': ""}
	if v, ok := simple[s[0]]; ok {
		b.WriteString(v)
		return 1, nil
	}
	switch s[0] {
	case 'x':
		return hexEscape(b, s, 2)
	case 'u':
		return hexEscape(b, s, 4)
	case 'U':
		return hexEscape(b, s, 8)
	case 'N':
		return 0, errors.New(`\N{...} escapes in string literals are not supported`)
	}
	if s[0] >= '0' && s[0] <= '7' {
		n := 1
		for n < 3 && n < len(s) && s[n] >= '0' && s[n] <= '7' {
			n++
		}
		v, _ := strconv.ParseUint(s[:n], 8, 32)
		b.WriteRune(rune(v))
		return n, nil
	}
	b.WriteByte('\\')
	b.WriteByte(s[0])
	return 1, nil
}

func hexEscape(b *strings.Builder, s string, digits int) (int, error) {
	if len(s) < 1+digits {
		return 0, errors.New("truncated \\" + s[:1] + " escape in string literal")
	}
	v, err := strconv.ParseUint(s[1:1+digits], 16, 32)
	if err != nil || v > utf8.MaxRune {
		return 0, errors.New("bad \\" + s[:1+digits] + " escape in string literal")
	}
	b.WriteRune(rune(v)) // surrogates become U+FFFD
	return 1 + digits, nil
}

// engineUnescape decodes a literal the way the engine does, so that
// literals it already reads right are left as written.
func engineUnescape(raw string) string {
	if !strings.Contains(raw, `\`) {
		return raw
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' || i+1 >= len(raw) {
			b.WriteByte(raw[i])
			continue
		}
		i++
		switch raw[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case '\\', '\'', '"':
			b.WriteByte(raw[i])
		default:
			b.WriteByte('\\')
			b.WriteByte(raw[i])
		}
	}
	return b.String()
}
