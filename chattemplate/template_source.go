package chattemplate

import (
	"fmt"
	"strings"
)

// The engine's own scanner splits a template at {{ }}, {% %} and {# #}
// tags, skipping quoted strings inside the first two. prepareSource walks
// the template the same way so that it touches only what the engine will
// read as expressions, never the template's literal text, and so that the
// content-format detection sees the statements the engine will run.

// tojsonName is the filter name that `|tojson` is renamed to. The engine
// looks its built-in filters up before the render context and offers no
// way to replace one, yet its tojson formats floats the Go way (1.0 as
// "1") and escapes like Go rather than like Python's json.dumps; renaming
// the call sends it to our filter, which the render context supplies.
const tojsonName = "llmgw_tojson"

// preparedSource is a template's source made ready for the engine, with
// the statements found in it.
type preparedSource struct {
	src        string
	statements [][]exprToken // the tokens of each {% %} tag outside raw blocks
	// names holds every name the tags give the engine to look up (see
	// addNames): Jinja names a variable only by a name token, so the
	// render context needs no other.
	names map[string]bool
}

// strName is the function every {{ }} output is wrapped in: the engine
// prints values the Go way (None as "", 1.0 as "1"), jinja2 with
// Python's str().
const strName = "llmgw_str"

// prepareSource rewrites src for the engine so that it renders as jinja2
// does for transformers: line endings become "\n" and one trailing
// newline is dropped (jinja2's lexer with keep_trailing_newline off),
// Python string-literal escapes the engine does not know (\x41, \u00e9,
// \r, ...) are decoded, `|tojson` calls are renamed to tojsonName, and
// each {{ }} output goes through strName.
func prepareSource(src string) (preparedSource, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	var out strings.Builder
	out.Grow(len(src) + 64)
	var stmts [][]exprToken
	names := make(map[string]bool)
	inRaw := false
	pos := 0
	for pos < len(src) {
		open := strings.IndexByte(src[pos:], '{')
		if open < 0 || pos+open+1 >= len(src) {
			break
		}
		start := pos + open
		closer := tagCloser(src[start+1])
		if closer == "" {
			out.WriteString(src[pos : start+1])
			pos = start + 1
			continue
		}
		end, ok := findTagEnd(src, start+2, closer, closer != "#}")
		if !ok {
			return preparedSource{}, fmt.Errorf("unclosed tag at byte %d", start)
		}
		out.WriteString(src[pos:start])
		body := src[start:end]
		if closer != "#}" {
			content, off := tagContent(body)
			toks, err := tokenizeExpr(content)
			if err != nil {
				return preparedSource{}, fmt.Errorf("tag at byte %d: %w", start, err)
			}
			inRaw, body = rawState(toks, inRaw, body, closer)
			if !inRaw && closer == "%}" {
				stmts = append(stmts, toks)
			}
			if !inRaw {
				body = rewriteTag(body, off, toks)
				if closer == "}}" && len(toks) > 0 {
					body = splitOutput(body)
				}
				addNames(names, toks, closer)
			}
		}
		out.WriteString(body)
		pos = end
	}
	out.WriteString(src[pos:])
	return preparedSource{src: out.String(), statements: stmts, names: names}, nil
}

// tagCloser returns the closing delimiter for a tag whose opener's second
// byte is c, or "" when "{c" opens no tag.
func tagCloser(c byte) string {
	switch c {
	case '{':
		return "}}"
	case '%':
		return "%}"
	case '#':
		return "#}"
	}
	return ""
}

// findTagEnd returns the offset just past the closer of the tag whose
// content starts at i, skipping quoted strings when quotes is set, as the
// engine's scanner does.
func findTagEnd(src string, i int, closer string, quotes bool) (int, bool) {
	for i < len(src) {
		c := src[i]
		if quotes && (c == '\'' || c == '"') {
			i++
			for i < len(src) && src[i] != c {
				if src[i] == '\\' && i+1 < len(src) {
					i++
				}
				i++
			}
			i++
			continue
		}
		if strings.HasPrefix(src[i:], closer) {
			return i + len(closer), true
		}
		i++
	}
	return 0, false
}

// tagContent strips the delimiters and whitespace-control marks, and
// returns where the content starts within the tag.
func tagContent(tag string) (string, int) {
	s, off := tag[2:len(tag)-2], 2
	if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		s, off = s[1:], 3
	}
	if strings.HasSuffix(s, "-") || strings.HasSuffix(s, "+") {
		s = s[:len(s)-1]
	}
	return s, off
}

// rawState tracks {% raw %} blocks, whose contents the engine keeps as
// text and which therefore must not be rewritten.
func rawState(toks []exprToken, inRaw bool, body, closer string) (bool, string) {
	if closer != "%}" || len(toks) == 0 || toks[0].kind != tokName {
		return inRaw, body
	}
	switch toks[0].text {
	case "raw":
		return true, body
	case "endraw":
		return false, body
	}
	return inRaw, body
}

// rewriteTag applies the literal and filter rewrites to one tag, leaving
// it byte for byte alone when neither applies.
func rewriteTag(tag string, off int, toks []exprToken) string {
	needs := false
	for i, t := range toks {
		if (t.kind == tokString && t.escaped) || isTojsonFilter(toks, i) {
			needs = true
			break
		}
	}
	if !needs {
		return tag
	}
	var b strings.Builder
	last := 0
	for i, t := range toks {
		switch {
		case t.kind == tokString && t.escaped:
			b.WriteString(tag[last : t.start+off])
			b.WriteString(engineLiteral(t.text))
			last = t.end + off
		case isTojsonFilter(toks, i):
			b.WriteString(tag[last : t.start+off])
			b.WriteString(tojsonName)
			last = t.end + off
		}
	}
	b.WriteString(tag[last:])
	return b.String()
}

// splitOutput wraps an output tag (wrapOutput), first splitting a
// concatenation that starts with a string literal, {{ 'a' + x + y }},
// into one output per operand, {{ 'a' }}{{ x }}{{ y }}. Chat templates
// write each message that way, and the engine builds every partial sum:
// a long message was copied once per + after it, most of what rendering
// allocated. The two print the same whenever jinja2 renders the first
// at all (its + on a str and a non-str raises; strName prints each
// string as itself). Anything but + at the top level — a conditional, a
// boolean or comparison operator, ~, arithmetic — leaves the tag whole.
func splitOutput(tag string) string {
	content, off := tagContent(tag)
	toks, err := tokenizeExpr(content)
	if err != nil || len(toks) < 3 || toks[0].kind != tokString {
		return wrapOutput(tag)
	}
	var cuts []int // offsets in content of the top-level +
	depth := 0
	for _, t := range toks {
		depth += nesting(t)
		if depth > 0 || nesting(t) != 0 {
			continue
		}
		switch {
		case isOp(t, "+"):
			cuts = append(cuts, t.start)
		case t.kind == tokOp && t.text != "." && t.text != "|":
			return wrapOutput(tag)
		case t.kind == tokName && splitStoppers[t.text]:
			return wrapOutput(tag)
		}
	}
	if len(cuts) == 0 || depth != 0 {
		return wrapOutput(tag)
	}
	open, end := tag[:off], tag[off+len(content):]
	var b strings.Builder
	prev := 0
	for i, c := range append(cuts, len(content)) {
		left, right := "{{", "}}"
		if i == 0 {
			left = open
		}
		if i == len(cuts) {
			right = end
		}
		b.WriteString(left + " " + strName + "((" + content[prev:c] + ")) " + right)
		prev = c + 1
	}
	return b.String()
}

// splitStoppers are the keywords that bind looser than + (or are no part
// of a plain sum): an output using them is not split.
var splitStoppers = map[string]bool{"if": true, "else": true, "and": true, "or": true, "not": true, "in": true, "is": true}

// wrapOutput turns {{ expr }} into {{ strName((expr)) }}, keeping the
// whitespace-control marks where they were.
func wrapOutput(tag string) string {
	content, off := tagContent(tag)
	return tag[:off] + " " + strName + "((" + content + ")) " + tag[off+len(content):]
}

// isTojsonFilter reports whether toks[i] names the tojson filter.
func isTojsonFilter(toks []exprToken, i int) bool {
	return i > 0 && toks[i].kind == tokName && toks[i].text == "tojson" &&
		toks[i-1].kind == tokOp && toks[i-1].text == "|"
}

// engineLiteral quotes s with only the escapes the engine decodes
// (\\, \', \n and \t); every other character is written as itself.
func engineLiteral(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`, "\t", `\t`)
	return "'" + r.Replace(s) + "'"
}

// addNames adds the names a tag's tokens give the engine to look up: its
// own, and those the rewrite puts in (strName around an output, tojsonName
// for the tojson filter).
func addNames(names map[string]bool, toks []exprToken, closer string) {
	for _, t := range toks {
		if t.kind == tokName {
			names[t.text] = true
		}
	}
	if closer == "}}" && len(toks) > 0 {
		names[strName] = true
	}
	if names["tojson"] {
		names[tojsonName] = true
	}
}
