package main

import (
	"math"
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
		mod + "caddymodule.(*Admission).ServeHTTP": 2.09,
		mod + "caddymodule.serveNext":              1.19,
		mod + "caddymodule.(*Admission).prepare":   0.08,
		mod + "caddymodule.enterGate":              0.09, // the inline mark dropped
		"net/http.(*persistConn).writeLoop":        0.65,
	} {
		if got := cum[f]; math.Abs(got-want) > 1e-9 {
			t.Errorf("cum[%s] = %v, want %v", f, got, want)
		}
	}
	if _, ok := cum["flat"]; ok {
		t.Error("the column header was read as a function")
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
		"whole Caddy process":                                        221, // 4.42 s over 20,000 requests
		"llm_admission, besides the proxying it wraps":               45,  // ServeHTTP less serveNext
		"body read and parsed":                                       4,
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
}

func TestParsePprofTopErrors(t *testing.T) {
	for name, out := range map[string]string{
		"no total":     "      flat  flat%   sum%        cum   cum%\n     0.03s  0.68%  0.68%      2.09s 47.29%  f\n",
		"unknown unit": "Duration: 5s, Total samples = 4.42s (88.37%)\n     0.03s  0.68%  0.68%      2.09xs 47.29%  f\n",
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
	for _, target := range []string{"plain", "llm", "llm" + beforeSuffix} {
		o.Stats = append(o.Stats, OverheadStat{Body: "small", Target: target, CPUParts: parts, ProfiledRequests: 20000})
	}
	o.Stats = append(o.Stats, OverheadStat{Body: "small", Target: "direct"}) // never profiled
	var b strings.Builder
	renderCPUParts(&b, o)
	md := b.String()
	for _, want := range []string{
		"| part | plain | llm |\n",
		"| whole Caddy process | 221.0 | 221.0 |\n",
		"| &nbsp;&nbsp;body read and parsed | 4.0 | 4.0 |\n",
		"below about 0.5 µs",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("breakdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, beforeSuffix) || strings.Contains(md, "direct") {
		t.Errorf("breakdown shows a target it should leave out:\n%s", md)
	}
}
