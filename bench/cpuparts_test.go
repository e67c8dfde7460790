package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pprofTopSample is the shape of `go tool pprof -top -cum` output, as Go
// 1.26's pprof prints it: a header, then flat, flat%, sum%, cum, cum% and
// the function, "0" for no time and a mark after an inlined function.
const pprofTopSample = `File: caddy
Build ID: deda93ffe1aaffddf1831b0a01e9ce47b96b487f
Type: cpu
Time: 2026-12-04 11:46:14 UTC
Duration: 5s, Total samples = 4.42s (88.37%)
Showing nodes accounting for 4.42s, 100% of 4.42s total
      flat  flat%   sum%        cum   cum%
     0.03s  0.68%  0.68%      2.09s 47.29%  github.com/llmgw/caddy-llmgw/caddymodule.(*Admission).ServeHTTP
         0     0%  0.68%      1.19s 26.92%  github.com/llmgw/caddy-llmgw/caddymodule.serveNext
         0     0%  0.68%      80ms  1.81%  github.com/llmgw/caddy-llmgw/caddymodule.(*Admission).prepare
     0.01s  0.23%  0.91%      0.32s  7.24%  github.com/llmgw/caddy-llmgw/localtok.(*Set).AppendTokenize
         0     0%  0.91%      0.09s  2.04%  github.com/llmgw/caddy-llmgw/caddymodule.enterGate (inline)
     0.65s 14.71% 15.62%      0.65s 14.71%  net/http.(*persistConn).writeLoop
     0.02s  0.45% 16.07%      0.28s  6.33%  net/http.(*persistConn).readLoop
     0.01s  0.23% 16.30%      0.56s 12.67%  runtime.mallocgc
         0     0% 16.30%      0.10s  2.26%  github.com/llmgw/caddy-llmgw/caddymodule.(*observingWriter).finish
     0.01s  0.23% 16.53%      0.06s  1.36%  github.com/llmgw/caddy-llmgw/caddymodule.(*observingWriter).WriteHeader
         0     0% 16.53%      0.04s   0.9%  net/http.(*response).WriteHeader
`

func TestParsePprofTop(t *testing.T) {
	cum, total, err := parsePprofTop(pprofTopSample)
	if err != nil {
		t.Fatal(err)
	}
	if total != 4.42 {
		t.Errorf("total = %v, want 4.42", total)
	}
	for f, want := range map[string]float64{
		modPath + "caddymodule.(*Admission).ServeHTTP": 2.09,
		modPath + "caddymodule.serveNext":              1.19,
		modPath + "caddymodule.(*Admission).prepare":   0.08,
		modPath + "caddymodule.enterGate":              0.09, // the inline mark dropped
		"net/http.(*persistConn).writeLoop":            0.65,
	} {
		if got := cum[f]; math.Abs(got-want) > 1e-9 {
			t.Errorf("cum[%s] = %v, want %v", f, got, want)
		}
	}

	parts := breakdown(cum, total, 20000)
	if len(parts) != len(cpuParts) {
		t.Fatalf("%d parts, want %d", len(parts), len(cpuParts))
	}
	got := map[string]float64{}
	for _, p := range parts {
		got[strings.TrimSpace(p.Part)] = p.PerReq
	}
	for part, want := range map[string]float64{
		"whole Caddy process": 221, // 4.42 s over 20,000 requests
		"llm_admission, besides the proxying it wraps and the response observer": 40, // ServeHTTP less serveNext and finish
		"body read and parsed":                                       4,
		"response observed (usage, metrics)":                         6, // finish and WriteHeader, less net/http's WriteHeader
		"HTTP client connections' goroutines (upstreams, /tokenize)": 46.5,
		"engine /metrics scrapes":                                    0, // not in the profile
	} {
		if math.Abs(got[part]-want) > 1e-6 {
			t.Errorf("%s: %v µs per request, want %v", part, got[part], want)
		}
	}
	if breakdown(cum, total, 0) != nil {
		t.Error("a phase without requests has a breakdown")
	}

	// Plain Caddy: net/http's WriteHeader without the observing writer
	// around it leaves the response row at 0, not below.
	plain := map[string]float64{"net/http.(*response).WriteHeader": 0.04}
	for _, p := range breakdown(plain, 1, 1000) {
		if p.PerReq < 0 || strings.HasPrefix(p.Part, "response") && p.PerReq != 0 {
			t.Errorf("plain Caddy's %s: %v µs per request, want 0", p.Part, p.PerReq)
		}
	}
}

func TestParsePprofTopErrors(t *testing.T) {
	for name, out := range map[string]string{
		"no total":     "      flat  flat%   sum%        cum   cum%\n     0.03s  0.68%  0.68%      2.09s 47.29%  f\n",
		"unknown unit": "Duration: 5s, Total samples = 4.42s (88.37%)\n     0.03s  0.68%  0.68%      2.09m 47.29%  f\n",
		"bad total":    "Duration: 5s, Total samples = lots (88.37%)\n",
	} {
		if _, _, err := parsePprofTop(out); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	for in, want := range map[string]float64{"0": 0, "10ms": 0.01, "1.5s": 1.5, "250us": 250e-6, "2mins": 120} {
		if got, err := pprofSeconds(in); err != nil || math.Abs(got-want) > 1e-12 {
			t.Errorf("pprofSeconds(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

// TestRenderCPUParts: the breakdown table has a column per profiled Caddy,
// plain Caddy's first, and leaves out an earlier build's.
func TestRenderCPUParts(t *testing.T) {
	cum, total, err := parsePprofTop(pprofTopSample)
	if err != nil {
		t.Fatal(err)
	}
	parts := breakdown(cum, total, 20000)
	o := &OverheadResult{Params: OverheadParams{Bodies: []OverheadBody{{Name: "small"}}, Before: "/bin/caddy-before"}}
	// The llm gateway served fewer requests than plain Caddy in its phase:
	// one sample weighs more per request there, and the threshold is its.
	for target, n := range map[string]int{"plain": 20000, "llm": 12500, "llm" + beforeSuffix: 5000} {
		o.Stats = append(o.Stats, OverheadStat{Body: "small", Target: target, CPUParts: parts, ProfiledRequests: n})
	}
	o.Stats = append(o.Stats, OverheadStat{Body: "small", Target: "direct"}) // never profiled
	var b strings.Builder
	renderCPUParts(&b, o)
	md := b.String()
	for _, want := range []string{
		"| part | plain | llm |\n",
		"| whole Caddy process | 221.0 | 221.0 |\n",
		"| &nbsp;&nbsp;body read and parsed | 4.0 | 4.0 |\n",
		"below about 0.8 µs", // 10 ms over llm's 12,500 requests; @before's 5,000 are not shown
	} {
		if !strings.Contains(md, want) {
			t.Errorf("breakdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, beforeSuffix) || strings.Contains(md, "direct") {
		t.Errorf("breakdown shows a target it should leave out:\n%s", md)
	}
}

// TestCPUPartsNameRealFunctions: every frame of this module that a part
// names is a function declared in the module, so a rename cannot leave a
// part silently at zero.
func TestCPUPartsNameRealFunctions(t *testing.T) {
	declared := map[string]bool{} // "pkg.Func" and "pkg.(*Recv).Method"
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for _, p := range cpuParts {
		for _, f := range append(slices.Clone(p.add), p.sub...) {
			name, ok := strings.CutPrefix(f, modPath)
			if !ok {
				continue // the runtime's, net/http's and zmq4's frames
			}
			dir := name[:strings.Index(name, ".")] // the package's path in the module
			if !seen[dir] {
				seen[dir] = true
				addDeclared(t, fset, filepath.Join("..", dir), declared)
			}
			if !declared[name] {
				t.Errorf("part %q names %s, which the module does not declare", strings.TrimSpace(p.name), f)
			}
		}
	}
}

// addDeclared records the functions and methods declared in the non-test
// files of the package in dir, named as a profile names them.
func addDeclared(t *testing.T, fset *token.FileSet, dir string, declared map[string]bool) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	pkg := strings.TrimPrefix(filepath.ToSlash(filepath.Clean(dir)), "../")
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := pkg + "." + fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				switch r := fd.Recv.List[0].Type.(type) {
				case *ast.StarExpr:
					if id, ok := r.X.(*ast.Ident); ok {
						name = pkg + ".(*" + id.Name + ")." + fd.Name.Name
					}
				case *ast.Ident:
					name = pkg + "." + r.Name + "." + fd.Name.Name
				}
			}
			declared[name] = true
		}
	}
}
