package manifesttest

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// InferencePaths are the only request paths the gateway may forward to the
// engines: vLLM's inference endpoints and its model list. Everything else an
// engine serves (/metrics, /tokenize, /reset_prefix_cache, /health,
// /v1/load_lora_adapter, /sleep, ...) must stay inside the cluster
// (SECURITY.md). Paths are exact: a wildcard such as /v1/* also matches
// vLLM's LoRA loading endpoints.
var InferencePaths = []string{
	"/v1/chat/completions",
	"/v1/completions",
	"/v1/responses",
	"/v1/messages",
	"/v1/embeddings",
	"/v1/audio/transcriptions",
	"/v1/audio/translations",
	"/v1/rerank",
	"/v1/score",
	"/v1/models",
}

// RequiredPaths are the paths a site that proxies to engines must serve: the
// OpenAI API the gateway's admission and routing are built for, and the model
// list clients discover it with.
var RequiredPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/models"}

// DefaultAdminPort is the port of Caddy's admin listener when the Caddyfile
// does not set one.
const DefaultAdminPort = 2019

// A Caddyfile is the part of a parsed Caddyfile that the checks read.
type Caddyfile struct {
	Global []*Directive // the global options block
	Sites  []*Site
}

// A Site is one site block.
type Site struct {
	Line      int
	Addresses []string
	Ports     []int
	Body      []*Directive
}

// A Directive is one line of a Caddyfile and the block it opens, if any.
type Directive struct {
	Line  int
	Args  []string // Args[0] is the directive's (or matcher's, or option's) name
	Block []*Directive
}

// Name is the directive's name, "" for a line without tokens (only the
// global options block has none).
func (d *Directive) Name() string {
	if len(d.Args) == 0 {
		return ""
	}
	return d.Args[0]
}

// ParseCaddyfile parses the subset of the Caddyfile syntax that deploy/ uses:
// a global options block, site blocks (or a single site without braces),
// directives with nested blocks, quoted tokens and comments. It is no
// substitute for Caddy's parser, which CheckAdapted brings in; it exists so
// that the route check runs without a Caddy binary. What it does not follow
// (import, heredocs) is an error rather than a guess.
func ParseCaddyfile(src string) (*Caddyfile, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	top, err := parseBlocks(toks)
	if err != nil {
		return nil, err
	}
	cf := &Caddyfile{}
	if len(top) > 0 && top[0].Name() == "" {
		cf.Global = top[0].Block
		top = top[1:]
	}
	for i, d := range top {
		if d.Name() == "" {
			return nil, fmt.Errorf("line %d: a block without a site address", d.Line)
		}
		if strings.HasPrefix(d.Name(), "(") {
			continue // a snippet: only import uses it, and the route check rejects import
		}
		site := &Site{Line: d.Line, Body: d.Block}
		if d.Block == nil {
			// A single site without braces: the rest of the file is its body.
			site.Body = top[i+1:]
		}
		for _, a := range d.Args {
			for addr := range strings.SplitSeq(a, ",") {
				if addr = strings.TrimSpace(addr); addr == "" {
					continue
				}
				port, err := addressPort(addr)
				if err != nil {
					return nil, fmt.Errorf("line %d: %w", d.Line, err)
				}
				site.Addresses = append(site.Addresses, addr)
				site.Ports = append(site.Ports, port)
			}
		}
		cf.Sites = append(cf.Sites, site)
		if d.Block == nil {
			break
		}
	}
	return cf, nil
}

// addressPort is the port Caddy listens on for a site address: the explicit
// one, else 80 for http:// and 443 otherwise.
func addressPort(addr string) (int, error) {
	a, scheme := addr, ""
	if i := strings.Index(a, "://"); i >= 0 {
		scheme, a = a[:i], a[i+3:]
	}
	if i := strings.IndexByte(a, '/'); i >= 0 {
		a = a[:i]
	}
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		if scheme == "http" {
			return 80, nil
		}
		return 443, nil
	}
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n > 65535 {
		return 0, fmt.Errorf("site address %q: port %q is not a number this check can follow", addr, port)
	}
	return n, nil
}

// AdminListener checks the global admin option and returns the admin port:
// the admin API can reload the config and drain engines, so it must stay on
// loopback (or a Unix socket, or be off).
func (cf *Caddyfile) AdminListener() (port int, err error) {
	for _, d := range cf.Global {
		if d.Name() != "admin" || len(d.Args) < 2 {
			continue
		}
		addr := d.Args[1]
		if addr == "off" || strings.HasPrefix(addr, "unix/") {
			return 0, nil
		}
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			return 0, fmt.Errorf("line %d: admin address %q: %w", d.Line, addr, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return 0, fmt.Errorf("line %d: the admin API listens on %q, beyond the pod's loopback", d.Line, addr)
		}
		if port, err = strconv.Atoi(p); err != nil {
			return 0, fmt.Errorf("line %d: admin address %q: port is not a number", d.Line, addr)
		}
		return port, nil
	}
	return DefaultAdminPort, nil
}

// RouteReport is what CheckRoutes found in one site.
type RouteReport struct {
	Site     *Site
	Proxies  int      // reverse_proxy directives
	Served   []string // the paths that reach an engine, sorted
	Problems []error
}

// CheckRoutes checks every site's routing: each reverse_proxy is reached only
// through matchers that admit nothing but InferencePaths (exact paths, a path
// matcher token or a named matcher whose path matchers list only those), sits
// in the scope of llm_admission, and does not rewrite the path; nothing
// rewrites paths in a site that proxies; and such a site serves
// RequiredPaths and answers everything else itself from a catch-all
// `handle { respond ... 404 }`.
func (cf *Caddyfile) CheckRoutes() []RouteReport {
	reports := make([]RouteReport, 0, len(cf.Sites))
	for _, s := range cf.Sites {
		c := &routeCheck{matchers: map[string]matcher{}, served: map[string]bool{}}
		c.collectMatchers(s.Body)
		c.walk(s.Body, nil, false, true)
		if c.proxies > 0 {
			for _, line := range c.rewrites {
				c.problemf(line, "rewrites the request path in a site that proxies to engines, so the path an engine sees is not the one matched")
			}
			if !c.catchAll {
				c.problemf(s.Line, "a site that proxies to engines needs a catch-all `handle { respond 404 }`, so Caddy answers every other path itself")
			}
			for _, p := range RequiredPaths {
				if !c.served[p] {
					c.problemf(s.Line, "%s does not reach the engines", p)
				}
			}
		}
		served := make([]string, 0, len(c.served))
		for p := range c.served {
			served = append(served, p)
		}
		slices.Sort(served)
		reports = append(reports, RouteReport{Site: s, Proxies: c.proxies, Served: served, Problems: c.problems})
	}
	return reports
}

// matcher is a named matcher's path restriction.
type matcher struct {
	paths      []string
	restricted bool // it has a path matcher and every path is an inference path
}

type routeCheck struct {
	matchers map[string]matcher
	served   map[string]bool
	proxies  int
	catchAll bool
	rewrites []int
	problems []error
}

func (c *routeCheck) problemf(line int, format string, args ...any) {
	c.problems = append(c.problems, fmt.Errorf("line %d: "+format, append([]any{line}, args...)...))
}

// collectMatchers records every named matcher definition, at any depth.
func (c *routeCheck) collectMatchers(body []*Directive) {
	for _, d := range body {
		name := d.Name()
		if !strings.HasPrefix(name, "@") {
			c.collectMatchers(d.Block)
			continue
		}
		var m matcher
		hasPath := false
		addPaths := func(args []string) {
			hasPath = true
			m.paths = append(m.paths, args...)
		}
		switch {
		case len(d.Args) > 1 && d.Args[1] == "path":
			addPaths(d.Args[2:])
		case len(d.Args) > 1 && strings.HasPrefix(d.Args[1], "/"):
			addPaths(d.Args[1:])
		}
		for _, line := range d.Block {
			// Other matchers in the set (method, header, not ...) are ANDed
			// with the path matcher: they can only narrow it.
			if line.Name() == "path" {
				addPaths(line.Args[1:])
			}
		}
		m.restricted = hasPath && len(m.paths) > 0 && allInference(m.paths)
		c.matchers[name] = m
	}
}

func allInference(paths []string) bool {
	for _, p := range paths {
		if !slices.Contains(InferencePaths, p) {
			return false
		}
	}
	return true
}

// narrow applies a directive's matcher token (args[0], if it is one) to the
// set of paths that can reach it; nil means any path.
func (c *routeCheck) narrow(scope map[string]bool, args []string) map[string]bool {
	if len(args) == 0 {
		return scope
	}
	var paths []string
	switch tok := args[0]; {
	case strings.HasPrefix(tok, "@"):
		m, ok := c.matchers[tok]
		if !ok || !m.restricted {
			return scope
		}
		paths = m.paths
	case strings.HasPrefix(tok, "/"):
		if !slices.Contains(InferencePaths, tok) {
			return scope
		}
		paths = []string{tok}
	default:
		return scope
	}
	narrowed := map[string]bool{}
	for _, p := range paths {
		if scope == nil || scope[p] {
			narrowed[p] = true
		}
	}
	return narrowed
}

// walk checks the directives of one block. scope is the set of paths that can
// reach it (nil: any), admission whether llm_admission is in scope.
func (c *routeCheck) walk(body []*Directive, scope map[string]bool, admission, siteLevel bool) {
	for _, d := range body {
		if d.Name() == "llm_admission" {
			admission = true
		}
	}
	for _, d := range body {
		switch d.Name() {
		case "reverse_proxy", "php_fastcgi":
			c.proxies++
			s := c.narrow(scope, d.Args[1:])
			if s == nil {
				c.problemf(d.Line, "%s forwards every path to the engines (their /metrics, /tokenize, /reset_prefix_cache ...); put it under a matcher of the inference paths", d.Name())
			}
			for p := range s {
				c.served[p] = true
			}
			if !admission {
				c.problemf(d.Line, "%s to the engines without llm_admission in scope", d.Name())
			}
			for _, sub := range d.Block {
				if sub.Name() == "rewrite" {
					c.problemf(sub.Line, "%s rewrites the path it sends to the engines", d.Name())
				}
			}
		case "handle", "route":
			if siteLevel && d.Name() == "handle" && (len(d.Args) == 1 || d.Args[1] == "*") && responds404(d.Block) {
				c.catchAll = true
			}
			c.walk(d.Block, c.narrow(scope, d.Args[1:]), admission, false)
		case "handle_errors":
			// An error can follow a request for any path.
			c.walk(d.Block, nil, admission, false)
		case "handle_path", "rewrite", "uri":
			c.rewrites = append(c.rewrites, d.Line)
			c.walk(d.Block, scope, admission, false)
		case "import":
			c.problemf(d.Line, "import: this check does not follow imports; inline the snippet")
		}
	}
}

// responds404 reports whether a block answers with a 404 of its own.
func responds404(body []*Directive) bool {
	for _, d := range body {
		if d.Name() == "respond" && slices.Contains(d.Args[1:], "404") {
			return true
		}
	}
	return false
}

// token is one Caddyfile token.
type token struct {
	text   string
	line   int
	quoted bool // a quoted "{" is text, not a block
}

// lex splits a Caddyfile into tokens the way Caddy's lexer does for the
// syntax ParseCaddyfile supports.
func lex(src string) ([]token, error) {
	var toks []token
	line := 1
	for i := 0; i < len(src); {
		ch := src[i]
		switch {
		case ch == '\n':
			line++
			i++
		case ch == ' ' || ch == '\t' || ch == '\r':
			i++
		case ch == '\\' && i+1 < len(src) && src[i+1] == '\n':
			line++ // a line continuation
			i += 2
		case ch == '#':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case ch == '"' || ch == '`':
			start, quote := line, ch
			var b strings.Builder
			i++
			for ; i < len(src) && src[i] != quote; i++ {
				if quote == '"' && src[i] == '\\' && i+1 < len(src) && src[i+1] == '"' {
					i++
				}
				if src[i] == '\n' {
					line++
				}
				b.WriteByte(src[i])
			}
			if i == len(src) {
				return nil, fmt.Errorf("line %d: unterminated quoted token", start)
			}
			i++
			toks = append(toks, token{text: b.String(), line: start, quoted: true})
		default:
			j := i
			for j < len(src) && !strings.ContainsRune(" \t\r\n", rune(src[j])) {
				j++
			}
			if strings.HasPrefix(src[i:j], "<<") {
				return nil, fmt.Errorf("line %d: heredocs are not supported by this check", line)
			}
			toks = append(toks, token{text: src[i:j], line: line})
			i = j
		}
	}
	return toks, nil
}

// parseBlocks groups tokens into lines and lines into nested blocks: a line
// ending in "{" opens a block, a line that is only "}" closes it.
func parseBlocks(toks []token) ([]*Directive, error) {
	root := &Directive{}
	stack := []*Directive{root}
	for i := 0; i < len(toks); {
		j := i
		for j < len(toks) && toks[j].line == toks[i].line {
			j++
		}
		lineToks := toks[i:j]
		i = j
		first, last := lineToks[0], lineToks[len(lineToks)-1]
		parent := stack[len(stack)-1]
		switch {
		case len(lineToks) == 1 && first.text == "}" && !first.quoted:
			if len(stack) == 1 {
				return nil, fmt.Errorf("line %d: unexpected }", first.line)
			}
			stack = stack[:len(stack)-1]
		case last.text == "{" && !last.quoted:
			d := &Directive{Line: first.line, Args: texts(lineToks[:len(lineToks)-1]), Block: []*Directive{}}
			parent.Block = append(parent.Block, d)
			stack = append(stack, d)
		default:
			parent.Block = append(parent.Block, &Directive{Line: first.line, Args: texts(lineToks)})
		}
	}
	if len(stack) > 1 {
		return nil, fmt.Errorf("line %d: block not closed", stack[len(stack)-1].Line)
	}
	return root.Block, nil
}

func texts(toks []token) []string {
	s := make([]string, len(toks))
	for i, t := range toks {
		s[i] = t.text
	}
	return s
}
