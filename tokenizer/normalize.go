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
	if n.isNormal(s) {
		return s
	}
	return n.form.String(s)
}

// isNormal reports whether s is normalized already, checking only the
// stretches of non-ASCII text with the ASCII byte before each. Every form
// maps ASCII to itself, and an ASCII character is a boundary: a starter
// that nothing before it composes with. So the text splits before every
// ASCII byte into pieces normalized on their own, and a piece of ASCII
// alone is normalized. The ASCII runs are skipped eight bytes at a time;
// norm's own check reads them one by one, which on a long prompt that is
// mostly English was most of the normalizer's cost. A stretch norm's quick
// check cannot vouch for (it answers "maybe" for some) reports false, and
// the caller normalizes the whole text: exact either way.
func (n unicodeNorm) isNormal(s string) bool {
	b := stringBytes(s)
	for i := bytescan.NonASCIIFrom(b, 0); i < len(b); i = bytescan.NonASCIIFrom(b, i) {
		start := max(i-1, 0) // a mark may compose with the ASCII letter before it
		for i < len(b) && b[i] >= 0x80 {
			i++
		}
		if seg := s[start:i]; n.form.QuickSpanString(seg) != len(seg) {
			return false
		}
	}
	return true
}

// stringBytes views s as bytes, for the bytescan functions, which only
// read them.
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

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
