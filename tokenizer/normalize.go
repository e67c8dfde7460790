package tokenizer

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
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
// stretches of text that could change, each with the character before it.
// A character that is normalized on its own and that nothing before it
// composes or reorders with (an inert one: every ASCII character, and most
// of CJK, kana, Hangul syllables and other scripts' letters, see inertRunes)
// is a boundary: the text splits before it into pieces normalized on their
// own. So only the stretches of other characters are given to norm's quick
// check, with the character before each (it may compose with the
// stretch's first). ASCII runs are skipped eight bytes at a time, inert
// characters one table look-up each; norm's own check of a long prompt
// read every character through its tries, which for Chinese text was
// most of the encoding's cost. A stretch the quick check cannot vouch for
// (it answers "maybe" for some) reports false, and the caller normalizes
// the whole text: exact either way.
func (n unicodeNorm) isNormal(s string) bool {
	b := stringBytes(s)
	inert := inertRunes(n.form)
	for i := bytescan.NonASCIIFrom(b, 0); i < len(b); {
		if b[i] < 0x80 {
			i = bytescan.NonASCIIFrom(b, i)
			continue
		}
		r, size := decodeRune(b, i)
		if inert.has(r) {
			i += size
			continue
		}
		// A stretch of characters that are not inert, from the one
		// before it to the next ASCII or inert character.
		_, before := utf8.DecodeLastRune(b[:i])
		start := i - before
		for i < len(b) && b[i] >= 0x80 {
			if r, size = decodeRune(b, i); inert.has(r) {
				break
			}
			i += size
		}
		if seg := s[start:i]; n.form.QuickSpanString(seg) != len(seg) {
			return false
		}
	}
	return true
}

// decodeRune is utf8.DecodeRune(b[i:]) with the three-byte sequences of
// most CJK text decoded in line (DecodeRune's own fast path is ASCII).
func decodeRune(b []byte, i int) (rune, int) {
	if i+2 < len(b) && b[i]&0xF0 == 0xE0 && b[i+1]&0xC0 == 0x80 && b[i+2]&0xC0 == 0x80 {
		r := rune(b[i]&0x0F)<<12 | rune(b[i+1]&0x3F)<<6 | rune(b[i+2]&0x3F)
		if r >= 0x800 && (r < 0xD800 || r > 0xDFFF) { // not overlong, no surrogate
			return r, 3
		}
	}
	return utf8.DecodeRune(b[i:])
}

// runeSet is a set of Basic Multilingual Plane runes, a bit each.
type runeSet [0x10000 / 64]uint64

func (t *runeSet) has(r rune) bool {
	return r >= 0 && r < 0x10000 && r != utf8.RuneError && t[r>>6]&(1<<(r&63)) != 0
}

// inertSets holds, by form (norm.Form is a small integer), the set
// inertRunes builds once: a read-only table after that, like the norm
// package's own.
var inertSets [4]struct {
	once sync.Once
	set  *runeSet
}

// inertRunes returns the BMP characters that form leaves as they are
// whatever surrounds them on the left: normalized on their own (their
// quick check says yes), of combining class 0, and boundaries before
// (nothing before them composes or reorders with them). A character after
// one may still compose with it (a kana with a following voicing mark):
// isNormal gives every checked stretch the character before it. Built on
// first use, about 65,536 property look-ups.
func inertRunes(f norm.Form) *runeSet {
	e := &inertSets[f]
	e.once.Do(func() {
		set := new(runeSet)
		var buf [utf8.UTFMax]byte
		for r := rune(0x80); r < 0x10000; r++ {
			if !utf8.ValidRune(r) {
				continue // surrogates
			}
			c := string(buf[:utf8.EncodeRune(buf[:], r)])
			if p := f.PropertiesString(c); p.BoundaryBefore() && p.CCC() == 0 && f.QuickSpanString(c) == len(c) {
				set[r>>6] |= 1 << (r & 63)
			}
		}
		e.set = set
	})
	return e.set
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
