package chattemplate

import "slices"

// ContentFormat is how vLLM hands a message's content to a template.
type ContentFormat string

const (
	// ContentString joins a message's text parts into one string with
	// "\n"; it is the format of templates that print message content.
	ContentString ContentFormat = "string"
	// ContentOpenAI keeps content as a list of {"type": "text", "text": ...}
	// parts, even when the request sent a plain string; it is the format
	// of templates that loop over message content.
	ContentOpenAI ContentFormat = "openai"
)

// detectContentFormat mirrors vLLM's _detect_content_format
// (vllm/entrypoints/chat_utils.py): a template is "openai" when it has a
// for loop over the content of a message variable, where message
// variables are the targets of for loops over `messages` or over a
// variable assigned from it (`set loop_messages = messages[1:]`), and
// "string" otherwise. vLLM walks jinja2's AST; this walks the statement
// tokens, recognising the same shapes: a name, optionally indexed by the
// constant key or read as an attribute, then slices, filters and tests.
// Where vLLM's walk would fail (a loop or assignment with a tuple or
// namespace target), it falls back to "string" as vLLM does.
func detectContentFormat(stmts [][]exprToken) ContentFormat {
	var loops []forStmt
	var sets []setStmt
	for _, toks := range stmts {
		if f, ok := parseFor(toks); ok {
			loops = append(loops, f)
		} else if s, ok := parseSet(toks); ok {
			sets = append(sets, s)
		}
	}
	msgs, ok := messagesAliases(sets)
	if !ok {
		return ContentString
	}
	var itemVars []string
	for _, f := range loops {
		for _, name := range msgs {
			if accessesVar(f.iter, name, "") {
				if f.target == "" {
					return ContentString
				}
				itemVars = append(itemVars, f.target)
				break
			}
		}
	}
	for _, f := range loops {
		for _, name := range itemVars {
			if accessesVar(f.iter, name, "content") {
				if f.target == "" {
					return ContentString
				}
				return ContentOpenAI
			}
		}
	}
	return ContentString
}

// forStmt is a for tag: its target when it is a single name ("" for a
// tuple), and its iterable's tokens without a loop filter or `recursive`.
type forStmt struct {
	target string
	iter   []exprToken
}

// setStmt is an assignment tag; target is "" unless it is a single name.
type setStmt struct {
	target string
	value  []exprToken
}

func parseFor(toks []exprToken) (forStmt, bool) {
	if len(toks) < 4 || !isName(toks[0], "for") {
		return forStmt{}, false
	}
	in := -1
	for i := 1; i < len(toks); i++ {
		if isName(toks[i], "in") {
			in = i
			break
		}
	}
	if in < 2 {
		return forStmt{}, false
	}
	f := forStmt{}
	if in == 2 && toks[1].kind == tokName {
		f.target = toks[1].text
	}
	iter := toks[in+1:]
	if n := len(iter); n > 0 && isName(iter[n-1], "recursive") {
		iter = iter[:n-1]
	}
	depth := 0
	for i, t := range iter {
		depth += nesting(t)
		if depth == 0 && isName(t, "if") {
			iter = iter[:i]
			break
		}
	}
	f.iter = iter
	return f, true
}

func parseSet(toks []exprToken) (setStmt, bool) {
	if len(toks) < 2 || !isName(toks[0], "set") {
		return setStmt{}, false
	}
	for i := 1; i < len(toks); i++ {
		if toks[i].kind == tokOp && toks[i].text == "=" {
			s := setStmt{value: toks[i+1:]}
			if i == 2 && toks[1].kind == tokName {
				s.target = toks[1].text
			}
			return s, true
		}
	}
	return setStmt{}, false // a {% set x %}...{% endset %} block
}

// messagesAliases is vLLM's _iter_nodes_assign_var_or_elems for
// "messages": the name itself and, breadth first, every variable assigned
// from one already found. It reports false where vLLM's walk would fail
// on an assignment to something other than a plain name.
func messagesAliases(sets []setStmt) ([]string, bool) {
	names := []string{"messages"}
	for i := 0; i < len(names); i++ {
		for _, s := range sets {
			if !accessesVar(s.value, names[i], "") {
				continue
			}
			if s.target == "" {
				return nil, false
			}
			// vLLM skips only self-assignment and would loop forever on
			// a cycle such as a = b, b = a; each name is taken once here.
			if !slices.Contains(names, s.target) {
				names = append(names, s.target)
			}
		}
	}
	return names, true
}

// accessesVar is vLLM's _is_var_or_elems_access: toks is `name` (or, with
// key, `name[key]` / `name.key`), followed by any slices, filters and
// tests, and nothing else.
func accessesVar(toks []exprToken, name, key string) bool {
	if len(toks) == 0 || !isName(toks[0], name) {
		return false
	}
	rest := toks[1:]
	if key != "" {
		switch {
		case len(rest) >= 3 && isOp(rest[0], "[") && rest[1].kind == tokString && rest[1].text == key && isOp(rest[2], "]"):
			rest = rest[3:]
		case len(rest) >= 2 && isOp(rest[0], ".") && isName(rest[1], key):
			rest = rest[2:]
		default:
			return false
		}
	}
	for len(rest) > 0 && isOp(rest[0], "[") {
		n, slice := bracketGroup(rest)
		if n == 0 || !slice {
			return false
		}
		rest = rest[n:]
	}
	return onlyFiltersAndTests(rest)
}

// onlyFiltersAndTests reports whether toks is a chain of `| name(args)`
// filters and `is [not] name(args)` tests.
func onlyFiltersAndTests(toks []exprToken) bool {
	for len(toks) > 0 {
		switch {
		case isOp(toks[0], "|") && len(toks) > 1 && toks[1].kind == tokName:
			toks = toks[2:]
		case isName(toks[0], "is") && len(toks) > 1:
			toks = toks[1:]
			if isName(toks[0], "not") {
				toks = toks[1:]
			}
			if len(toks) == 0 || toks[0].kind != tokName {
				return false
			}
			toks = toks[1:]
		default:
			return false
		}
		if len(toks) > 0 && isOp(toks[0], "(") {
			n, _ := bracketGroup(toks)
			if n == 0 {
				return false
			}
			toks = toks[n:]
		}
	}
	return true
}

// bracketGroup measures the bracketed group opening toks and reports
// whether a colon sits at its top level (a slice). n is 0 when the group
// is not closed.
func bracketGroup(toks []exprToken) (n int, slice bool) {
	depth := 0
	for i, t := range toks {
		depth += nesting(t)
		if depth == 1 && isOp(t, ":") {
			slice = true
		}
		if depth == 0 {
			return i + 1, slice
		}
	}
	return 0, false
}

// nesting is +1 for an opening bracket, -1 for a closing one.
func nesting(t exprToken) int {
	if t.kind != tokOp {
		return 0
	}
	switch t.text {
	case "(", "[", "{":
		return 1
	case ")", "]", "}":
		return -1
	}
	return 0
}

func isName(t exprToken, name string) bool { return t.kind == tokName && t.text == name }
func isOp(t exprToken, op string) bool     { return t.kind == tokOp && t.text == op }
