package tokenizer

import (
	"fmt"
	"strings"

	"github.com/dlclark/regexp2/v2"
)

// regexSplitter runs a pattern that has no hand-written scanner through
// regexp2, a backtracking engine with look-around. Its syntax is .NET's,
// which agrees with Oniguruma on what tokenizer patterns use: \s is Unicode
// whitespace, \p{..} are general categories, and (?i:...) is supported,
// though we rewrite simple case-insensitive groups to ASCII classes first
// because HF's engines fold only ASCII there.
type regexSplitter struct {
	re *regexp2.Regexp
}

func compileRegex(pattern string) (*regexSplitter, error) {
	re, err := regexp2.Compile(foldCaseGroups(pattern), regexp2.OptionMaxBacktrackingStackSize(-1))
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pattern, err)
	}
	return &regexSplitter{re: re}, nil
}

// spans implements finder. A match error (which regexp2 reports only for
// exhausted limits, none of which we set) leaves the rest of s unmatched.
func (r *regexSplitter) spans(dst []span, s string) []span {
	idx, _ := r.re.FindAllStringIndex(s, -1)
	gap := 0
	for _, m := range idx {
		if gap < m[0] {
			dst = append(dst, span{gap, m[0], false})
		}
		dst = append(dst, span{m[0], m[1], true})
		gap = m[1]
	}
	if gap < len(s) {
		dst = append(dst, span{gap, len(s), false})
	}
	return dst
}

// replaceAll replaces every match in s with content, taken literally.
func (r *regexSplitter) replaceAll(s, content string) string {
	idx, _ := r.re.FindAllStringIndex(s, -1)
	if len(idx) == 0 {
		return s
	}
	var b strings.Builder
	prev := 0
	for _, m := range idx {
		b.WriteString(s[prev:m[0]])
		b.WriteString(content)
		prev = m[1]
	}
	b.WriteString(s[prev:])
	return b.String()
}

// foldCaseGroups rewrites each (?i:...) group whose body is plain literals
// and alternation, such as (?i:'s|'t|'re), into (?:...) with every ASCII
// letter x written [xX]. Groups with classes, escapes of properties or
// nested groups are left to the engine.
func foldCaseGroups(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); {
		switch {
		case p[i] == '\\' && i+1 < len(p):
			b.WriteString(p[i : i+2])
			i += 2
			continue
		case p[i] == '[':
			end := classEnd(p, i)
			b.WriteString(p[i:end])
			i = end
			continue
		case strings.HasPrefix(p[i:], "(?i:"):
			if body, ok := plainGroupBody(p[i+4:]); ok {
				b.WriteString("(?:")
				for k := 0; k < len(body); k++ {
					c := body[k]
					if isASCIILetter(c) {
						b.WriteString("[" + string(c|0x20) + string(c&^0x20) + "]")
					} else {
						b.WriteByte(c)
					}
				}
				b.WriteByte(')')
				i += 4 + len(body) + 1
				continue
			}
		}
		b.WriteByte(p[i])
		i++
	}
	return b.String()
}

// plainGroupBody returns the body of a group up to its closing parenthesis
// when it contains nothing but literal characters and '|'.
func plainGroupBody(p string) (string, bool) {
	for k := 0; k < len(p); k++ {
		switch p[k] {
		case ')':
			return p[:k], true
		case '(', '[', '\\', '.', '*', '+', '?', '{', '^', '$':
			return "", false
		}
	}
	return "", false
}

// classEnd returns the index just past the character class starting at
// p[i] == '['.
func classEnd(p string, i int) int {
	j := i + 1
	if j < len(p) && p[j] == '^' {
		j++
	}
	if j < len(p) && p[j] == ']' {
		j++
	}
	for j < len(p) {
		switch p[j] {
		case '\\':
			j += 2
			continue
		case '[':
			j = classEnd(p, j)
			continue
		case ']':
			return j + 1
		}
		j++
	}
	return len(p)
}
