package tokenizer

import (
	"strings"
	"unicode"
	"unsafe"

	"golang.org/x/text/unicode/norm"

	"github.com/llmgw/caddy-llmgw/internal/bytescan"
)

// normalizer rewrites a section of text before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

// unicodeNorm is one of NFC, NFD, NFKC and NFKD. norm.Form.String returns
// its input unchanged when it is already normalized, which is the common
// case and costs no allocation.
type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) normalize(s string) string {
	if isASCII(s) {
		// Every form maps ASCII to itself. The check reads eight bytes
		// at a time, norm's quick check one: on a long English prompt
		// this is most of the normalizer's cost.
		return s
	}
	return n.form.String(s)
}

// isASCII reports whether s holds only bytes below 0x80.
func isASCII(s string) bool {
	return bytescan.IsASCII(unsafe.Slice(unsafe.StringData(s), len(s))) // read only
}

// lowercaseNorm lowercases rune by rune, as Rust's char::to_lowercase does:
// İ becomes "i̇" and there is no final-sigma rule.
type lowercaseNorm struct{}

func (lowercaseNorm) normalize(s string) string {
	if !strings.ContainsRune(s, 'İ') {
		return strings.ToLower(s)
	}
	var b strings.Builder
	for _, r := range s {
		if r == 'İ' {
			b.WriteString("i\u0307")
		} else {
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

// stripNorm removes leading and/or trailing whitespace.
type stripNorm struct{ left, right bool }

func (n stripNorm) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, isSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, isSpace)
	}
	return s
}

// stripAccentsNorm removes combining marks.
type stripAccentsNorm struct{}

func (stripAccentsNorm) normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if classOf(r)&clsM != 0 {
			return -1
		}
		return r
	}, s)
}

// prependNorm puts a string in front of non-empty text.
type prependNorm struct{ prefix string }

func (n prependNorm) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prefix + s
}

// replaceNorm replaces every match of a literal or a regex with content.
type replaceNorm struct {
	literal string
	re      *regexSplitter
	content string
}

func (n replaceNorm) normalize(s string) string {
	if n.re == nil {
		if n.literal == "" {
			return s
		}
		return strings.ReplaceAll(s, n.literal, n.content)
	}
	return n.re.replaceAll(s, n.content)
}

// sequenceNorm applies normalizers in turn.
type sequenceNorm []normalizer

func (q sequenceNorm) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}
