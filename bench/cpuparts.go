package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The overhead section's CPU breakdown: one phase's CPU profile of each
// gateway, plain Caddy's included, cut into the parts of the request path
// it goes to, per request. Beside plain Caddy's figures it shows where the
// gateway's extra CPU goes, so a goal missed says by how much each part
// misses it rather than only by how much the whole does.

// CPUPart is one part of a gateway's CPU during a profiled phase.
type CPUPart struct {
	Part string `json:"part"`
	// PerReq is the part's CPU time per request served in the phase, in
	// microseconds.
	PerReq float64 `json:"us_per_request"`
}

// cpuPart names the frames whose cumulative time makes up a part: the sum
// of add's minus the sum of sub's. Frames of one part must not call each
// other, or their time counts twice.
type cpuPart struct {
	name     string
	add, sub []string
}

// modPath prefixes the gateway module's function names in a profile.
const modPath = gatewayModule + "/"

// cpuParts are the rows of the breakdown; nil add is the whole profile.
// Indented names are within the row above them.
var cpuParts = []cpuPart{
	{name: "whole Caddy process"},
	// The response observer's finish runs in the handler after the proxy
	// returns; it has its own row.
	{name: "llm_admission, besides the proxying it wraps and the response observer", add: []string{modPath + "caddymodule.(*Admission).ServeHTTP"},
		sub: []string{modPath + "caddymodule.serveNext", modPath + "caddymodule.(*observingWriter).finish"}},
	{name: "  body read and parsed", add: []string{modPath + "caddymodule.(*Admission).prepare"}},
	{name: "  placement (tokens, block keys, index match)", add: []string{modPath + "caddymodule.(*Admission).place"}},
	{name: "    local tokenizer (chat template and encoding)", add: []string{modPath + "localtok.(*Set).AppendTokenize"}},
	{name: "      of which the chat template", add: []string{modPath + "chattemplate.(*Template).Render"}},
	{name: "    /tokenize call (the gateway's side)", add: []string{modPath + "remotetok.(*Tokenizer).TokenizeDerived"}},
	// Block keys are hashed where the ids arrive (inside the /tokenize
	// call, as its answer's derived keys, or beside the local tokenizer),
	// else in the match: these two rows may overlap, and the first may
	// lie within the /tokenize row.
	{name: "    block keys, wherever hashed", add: []string{modPath + "fleet.(*keyKeep).blockKeys"}},
	{name: "    index match (block keys too, when hashed there)", add: []string{modPath + "fleet.(*Fleet).prefixes"}},
	{name: "  admission gate and reservation", add: []string{modPath + "caddymodule.enterGate"}},
	{name: "lb_policy llm (choice, speculative entries, approximate tree)", add: []string{modPath + "caddymodule.(*Policy).Select"}},
	// The observing writer's WriteHeader passes the status on to net/http,
	// which plain Caddy pays for too. All of net/http's WriteHeader is
	// taken off: in a loaded llm gateway nearly every call comes through
	// the observing writer.
	{name: "response observed (usage, metrics)", add: []string{modPath + "caddymodule.(*observingWriter).finish", modPath + "caddymodule.(*observingWriter).WriteHeader"},
		sub: []string{"net/http.(*response).WriteHeader"}},
	// Connect mode reads and applies on the engine's worker; bind mode's
	// readers are goroutines of their own. go-zeromq/zmq4's reader is for
	// a BENCH_BEFORE_CADDY built before the subscriber spoke ZMTP itself.
	{name: "KV events received and applied", add: []string{modPath + "fleet.(*Fleet).kvWorker",
		modPath + "kvindex/zmqsub.(*boundSession).servePeer", "github.com/go-zeromq/zmq4.(*qreader).listen"}},
	{name: "engine /metrics scrapes", add: []string{modPath + "upstreams.(*Engine).pollLoop"}},
	{name: "HTTP client connections' goroutines (upstreams, /tokenize)", add: []string{"net/http.(*persistConn).readLoop", "net/http.(*persistConn).writeLoop"}},
	{name: "memory allocation (within the rows above)", add: []string{"runtime.mallocgc"}},
	{name: "garbage collection workers", add: []string{"runtime.gcBgMarkWorker", "runtime.bgsweep"}},
}

// pprofTopLine is a line of `go tool pprof -top -cum`: flat, flat%, sum%,
// cum, cum%, function. Times are "0" or a number and a unit.
var pprofTopLine = regexp.MustCompile(`^\s*(\S+)\s+\S+%\s+\S+%\s+(\S+)\s+\S+%\s+(.+?)\s*$`)

// pprofTotal finds the profile's total in its header.
var pprofTotal = regexp.MustCompile(`Total samples = (\S+)`)

// parsePprofTop reads `go tool pprof -top -cum` output into each
// function's cumulative seconds and the profile's total seconds.
func parsePprofTop(out string) (cum map[string]float64, total float64, err error) {
	cum = map[string]float64{}
	for _, l := range strings.Split(out, "\n") {
		if m := pprofTotal.FindStringSubmatch(l); m != nil {
			if total, err = pprofSeconds(m[1]); err != nil {
				return nil, 0, err
			}
			continue
		}
		m := pprofTopLine.FindStringSubmatch(l) // the column header has too few fields to match
		if m == nil {
			continue
		}
		s, err := pprofSeconds(m[2])
		if err != nil {
			return nil, 0, fmt.Errorf("line %q: %w", l, err)
		}
		// An inlined function's line carries a mark after its name.
		name, _ := strings.CutSuffix(m[3], " (inline)")
		name, _ = strings.CutSuffix(name, " (partial-inline)")
		cum[name] += s
	}
	if total == 0 {
		return nil, 0, fmt.Errorf("no total samples in the pprof output")
	}
	return cum, total, nil
}

// pprofSeconds parses a pprof time such as 0, 10ms, 1.53s or 2.1mins.
func pprofSeconds(s string) (float64, error) {
	if s == "0" {
		return 0, nil
	}
	for _, u := range []struct {
		suffix string
		scale  float64
	}{{"mins", 60}, {"hrs", 3600}, {"ns", 1e-9}, {"us", 1e-6}, {"µs", 1e-6}, {"ms", 1e-3}, {"s", 1}} { // longest first: "mins" ends in "ns"
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("pprof time %q: %w", s, err)
			}
			return f * u.scale, nil
		}
	}
	return 0, fmt.Errorf("pprof time %q: unknown unit", s)
}

// breakdown divides each part's CPU by the requests the profiled phase
// served.
func breakdown(cum map[string]float64, total float64, requests int) []CPUPart {
	if requests <= 0 {
		return nil
	}
	per := func(s float64) float64 { return s * 1e6 / float64(requests) }
	parts := make([]CPUPart, 0, len(cpuParts))
	for _, p := range cpuParts {
		s := total
		if p.add != nil {
			s = 0
			for _, f := range p.add {
				s += cum[f]
			}
			for _, f := range p.sub {
				s -= cum[f]
			}
		}
		parts = append(parts, CPUPart{Part: p.name, PerReq: per(max(s, 0))})
	}
	return parts
}
