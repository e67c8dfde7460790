package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/llmgw/caddy-llmgw/internal/sim/simwords"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/localtok"
)

// The overhead section: what the gateway costs per request. Caddy
// processes run side by side in front of the same fast simulated engines —
// "llm" (llm_admission + lb_policy llm with KV events, the full precise
// path: body parse, /tokenize, block keys, index match, accounting),
// "plain" (reverse_proxy with round_robin), and the layers between them
// ("admission", "approx") — plus the engines directly, driven in
// alternating phases by the same closed-loop clients, so machine noise
// hits all of them alike.

// OverheadParams configure the section.
type OverheadParams struct {
	Engines     int            `json:"engines"`
	Concurrency int            `json:"concurrency"`
	Phase       float64        `json:"phase_seconds"`
	Rounds      int            `json:"rounds"`
	Warmup      float64        `json:"warmup_seconds"`
	TimeScale   float64        `json:"time_scale"`
	Bodies      []OverheadBody `json:"bodies"`
	// Tokenizer names a real tokenizer (realTokenizer: qwen3, llama3_1,
	// ...). The engines then tokenize with it, bodies are sized in its
	// tokens, and a third gateway, "llm-local", runs the llm path with
	// the same files as its local tokenizer. "" = the simulator's word
	// tokenizer and no llm-local.
	Tokenizer string `json:"tokenizer,omitempty"`
	// SerialPhase, when positive, follows each target's phase with one of
	// this many seconds driven by a single client: with the machine's
	// cores not saturated, the latency it adds is the gateway's own
	// time on the request's path rather than its CPU cost queueing
	// behind the other clients (the closed loop of Concurrency clients
	// saturates a 2-core host).
	SerialPhase float64 `json:"serial_phase_seconds,omitempty"`
	// Before, when set, is a Caddy binary built from an earlier commit:
	// every llm gateway then runs a second time on it ("llm@before",
	// "llm-local@before"), right after its counterpart in each rotation,
	// so a change is measured before and after in one alternating run
	// rather than in two runs on a machine whose speed drifts. Set by
	// BENCH_BEFORE_CADDY.
	Before string `json:"before_caddy,omitempty"`
}

// OverheadBody is one request shape.
type OverheadBody struct {
	Name         string `json:"name"`
	PromptTokens int    `json:"prompt_tokens"`
	MaxTokens    int    `json:"max_tokens"`
	// Bases is how many distinct prompts requests cycle through; each
	// request appends a unique word, so the gateway's tokenize cache
	// never hits while the engines' prefix caches (and the gateway's KV
	// index) match all but the last block.
	Bases int `json:"bases"`
	// Text is where the prompts' text comes from: "" = the simulator's
	// words (words and spaces: nothing a JSON string escapes); "doc" = a
	// Markdown document with code and quotes (overheadDoc), which JSON
	// escapes every 14 bytes or so, as it does real prompts' newlines and
	// quotes.
	Text string `json:"text,omitempty"`
}

// overheadDoc is the "doc" bodies' text, from the repository.
const overheadDoc = "tokenizer/testdata/prompt_8k.txt"

// OverheadStat is one (body, target) measurement over all its phases.
type OverheadStat struct {
	Body      string  `json:"body"`
	Target    string  `json:"target"`
	Requests  int     `json:"requests"`
	Errors    int     `json:"errors"`
	ReqPerSec float64 `json:"req_per_sec"`
	Latency   Pcts    `json:"latency"` // seconds, wall
	// SerialLatency is the latency with one client (SerialPhase).
	SerialLatency Pcts `json:"serial_latency"`
	// CPUPerReq is the Caddy process's user+system CPU per request, in
	// microseconds (0 for the direct target).
	CPUPerReq float64 `json:"cpu_us_per_request"`
	// CPURounds is CPUPerReq for each round's phase alone, in rotation
	// order: the report pairs them with plain Caddy's of the same round
	// (cpuVsPlain), so that the machine's speed, which drifts between
	// rounds, cancels out of the ratio.
	CPURounds []float64 `json:"cpu_us_per_request_rounds,omitempty"`
	// P50Rounds is each round's latency p50 alone (seconds), paired with
	// plain Caddy's the same way (addedP50VsPlain).
	P50Rounds []float64 `json:"latency_p50_rounds,omitempty"`
	RSS       int64     `json:"rss_bytes"`
	PeakRSS   int64     `json:"peak_rss_bytes"`
	// Profile is where the gateway's CPU went during one phase: the
	// caddy-llmgw and encoding/json frames of `go tool pprof -top -cum`
	// (the report shows the llm gateways').
	Profile []string `json:"profile,omitempty"`
	// CPUParts is the same phase's CPU per request, cut into parts of
	// the request path (cpuParts); plain Caddy has them too.
	CPUParts []CPUPart `json:"cpu_parts,omitempty"`
	// ProfiledRequests is how many requests that phase served.
	ProfiledRequests int `json:"profiled_requests,omitempty"`
}

// OverheadResult is the section's output.
type OverheadResult struct {
	Params OverheadParams `json:"params"`
	Stats  []OverheadStat `json:"stats"`
	// PromptTokens is each body's prompt length in the engines' tokens
	// (its first base prompt), by body name.
	PromptTokens map[string]int `json:"prompt_tokens,omitempty"`
}

func runOverhead(ctx context.Context, env *Env, p OverheadParams) (*OverheadResult, error) {
	res := &OverheadResult{Params: p, PromptTokens: map[string]int{}}
	cfg := vllmsim.Config{
		MaxNumSeqs: 256, NumGPUBlocks: 1 << 16, PrefillTokensPerSec: 1e6, TimeScale: p.TimeScale,
		KVEvents: &vllmsim.KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"},
	}
	var tokDir string
	if p.Tokenizer != "" {
		dir, m, err := realTokenizer(ctx, env.Root, p.Tokenizer)
		if err != nil {
			return nil, err
		}
		tokDir, cfg.Tokenizer = dir, m
	}
	fleet := &SimFleet{Config: cfg}
	defer fleet.Close()
	for i := 0; i < p.Engines; i++ {
		c := cfg
		kv := *cfg.KVEvents
		c.KVEvents = &kv
		e, err := vllmsim.Start(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("starting engine: %w", err)
		}
		fleet.Engines = append(fleet.Engines, e)
	}
	targets, stop, err := startOverheadTargets(ctx, env, fleet, tokDir, p.Before)
	defer stop()
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	phase := time.Duration(p.Phase * float64(time.Second))

	raw, err := os.ReadFile(filepath.Join(env.Root, overheadDoc))
	if err != nil {
		return nil, fmt.Errorf("the doc bodies' text: %w", err)
	}
	// The document is a rendered chat: its special-token markers are
	// defused so that a prompt of it is plain text, one section.
	doc := strings.ReplaceAll(string(raw), "<|", "< |")
	for _, body := range p.Bodies {
		gen, err := newBodyGen(body, cfg.Tokenizer, doc)
		if err != nil {
			return nil, err
		}
		res.PromptTokens[body.Name] = gen.tokens
		acc := map[string]*overheadAcc{}
		for _, t := range targets {
			acc[t.name] = &overheadAcc{}
		}
		// Warm every path (connections, tokenize, caches) before measuring.
		for _, t := range targets {
			urls := urlsFor(t.url, fleet)
			hammer(ctx, client, urls, gen, p.Concurrency, time.Duration(p.Warmup*float64(time.Second)))
		}
		for round := 0; round < p.Rounds; round++ {
			for _, t := range targets {
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				urls := urlsFor(t.url, fleet)
				var cpu0 time.Duration
				if t.pid != 0 {
					cpu0, _ = procCPU(t.pid)
				}
				var allocs chan struct{}
				if round == 1 && t.gw != nil && env.Profile {
					allocs = make(chan struct{})
					go func() {
						defer close(allocs)
						saveAllocs(ctx, t.gw, phase, filepath.Join(env.Out, "runs", "overhead", t.name+"-"+body.Name+".allocs.pprof"))
					}()
				}
				// Plain Caddy is profiled too: the breakdown sets the
				// gateways' parts beside its own.
				var prof chan phaseProfile
				if round == 0 && t.gw != nil && env.Profile {
					prof = make(chan phaseProfile, 1)
					go func() {
						prof <- profilePhase(ctx, t.gw, phase, filepath.Join(env.Out, "runs", "overhead", t.name+"-"+body.Name+".pprof"))
					}()
				}
				h := hammer(ctx, client, urls, gen, p.Concurrency, phase)
				a := acc[t.name]
				if prof != nil {
					pp := <-prof
					a.profile = pp.top
					if pp.cum != nil {
						a.parts, a.profiled = breakdown(pp.cum, pp.total, len(h.lat)), len(h.lat)
					}
				}
				if allocs != nil {
					<-allocs
				}
				if t.pid != 0 {
					cpu1, _ := procCPU(t.pid)
					a.cpu += cpu1 - cpu0
					perReq := 0.0 // a phase that served nothing pairs with no other
					if len(h.lat) > 0 {
						perReq = float64((cpu1 - cpu0).Microseconds()) / float64(len(h.lat))
					}
					a.rounds = append(a.rounds, perReq)
				}
				a.p50s = append(a.p50s, percentiles(h.lat).P50) // 0 when the phase served nothing
				a.lat = append(a.lat, h.lat...)
				a.errs += h.errs
				a.wall += h.wall
				if p.SerialPhase > 0 {
					sh := hammer(ctx, client, urls, gen, 1, time.Duration(p.SerialPhase*float64(time.Second)))
					a.serial = append(a.serial, sh.lat...)
					a.errs += sh.errs
				}
			}
		}
		for _, t := range targets {
			if t.gw != nil && env.Profile {
				// What the gateway holds after the body's phases, beside RSS.
				if err := saveProfile(ctx, t.gw, profileSpec{kind: "heap", path: filepath.Join(env.Out, "runs", "overhead", t.name+"-"+body.Name+".heap.pprof")}); err != nil {
					log.Printf("heap profile of the gateway: %v", err)
				}
			}
		}
		for _, t := range targets {
			a := acc[t.name]
			st := OverheadStat{Body: body.Name, Target: t.name, Requests: len(a.lat), Errors: a.errs}
			if a.wall > 0 {
				st.ReqPerSec = float64(len(a.lat)) / a.wall.Seconds()
			}
			if t.pid != 0 && len(a.lat) > 0 {
				st.CPUPerReq = float64(a.cpu.Microseconds()) / float64(len(a.lat))
				st.CPURounds = a.rounds
				st.RSS, st.PeakRSS, _ = procRSS(t.pid)
			}
			st.Latency, st.SerialLatency = percentiles(a.lat), percentiles(a.serial)
			st.P50Rounds = a.p50s
			st.Profile, st.CPUParts, st.ProfiledRequests = a.profile, a.parts, a.profiled
			log.Printf("overhead %-6s %-9s: %6.0f req/s, p50 %.2fms p99 %.2fms, 1 client p50 %.2fms, caddy cpu %.0fµs/req, rss %.0f MiB, errors %d",
				body.Name, t.name, st.ReqPerSec, st.Latency.P50*1000, st.Latency.P99*1000, st.SerialLatency.P50*1000, st.CPUPerReq, float64(st.RSS)/(1<<20), st.Errors)
			res.Stats = append(res.Stats, st)
		}
	}
	return res, nil
}

// overheadTarget is one thing the clients drive: a gateway, or the
// engines directly (gw nil, pid 0).
type overheadTarget struct {
	name, url string
	pid       int
	gw        *Gateway
}

// startOverheadTargets starts the gateways in front of fleet: plain Caddy,
// llm, and, when tokDir names a tokenizer directory, llm-local. stop
// stops every gateway started, also after an error.
func startOverheadTargets(ctx context.Context, env *Env, fleet *SimFleet, tokDir, before string) ([]overheadTarget, func(), error) {
	var gws []*Gateway
	stop := func() {
		for _, g := range gws {
			g.Stop()
		}
	}
	dir := filepath.Join(env.Out, "runs", "overhead")
	start := func(bin, name string, cfg GatewayConfig, kv bool) (overheadTarget, error) {
		g, err := startGateway(ctx, bin, filepath.Join(dir, name), cfg, kv)
		if err != nil {
			return overheadTarget{}, fmt.Errorf("starting the %s gateway: %w", name, err)
		}
		gws = append(gws, g)
		return overheadTarget{name: name, url: g.URL, pid: g.Pid(), gw: g}, nil
	}
	llmCfg := GatewayConfig{Engines: fleet.Refs(true), Policy: "llm", Admission: true, PollInterval: 250 * time.Millisecond}
	// The layers below the precise path, each the one before plus one
	// module: the llm app's admission alone (round robin), then lb_policy
	// llm on the approximate tree only (no KV events, no tokenization).
	// They split the gateway's cost by what buys it.
	admission := GatewayConfig{Engines: fleet.Refs(false), Policy: "round_robin", Admission: true, PollInterval: 250 * time.Millisecond}
	approx := admission
	approx.Policy, approx.PolicyBody = "llm", "disable_tokenize\n"
	type spec struct {
		name string
		cfg  GatewayConfig
		kv   bool // it subscribes to KV events: ready once every engine's is connected
		// before: run it on the earlier build too (Params.Before); the
		// layers are not what a change is measured on.
		before bool
	}
	configs := []spec{
		{name: "plain", cfg: GatewayConfig{Engines: fleet.Refs(false), Policy: "round_robin", PlainOnly: true}},
		{name: "admission", cfg: admission},
		{name: "approx", cfg: approx},
		{name: "llm", cfg: llmCfg, kv: true, before: true},
	}
	if tokDir != "" {
		local := llmCfg
		local.AppBody = fmt.Sprintf("tokenizer sim-model %q\n", tokDir)
		configs = append(configs, spec{name: "llm-local", cfg: local, kv: true, before: true})
	}
	var targets []overheadTarget
	for _, c := range configs {
		t, err := start(env.Caddy, c.name, c.cfg, c.kv)
		if err != nil {
			return nil, stop, err
		}
		targets = append(targets, t)
		if before != "" && c.before {
			t, err := start(before, c.name+beforeSuffix, c.cfg, c.kv)
			if err != nil {
				return nil, stop, err
			}
			targets = append(targets, t)
		}
	}
	return append(targets, overheadTarget{name: "direct"}), stop, nil
}

type overheadAcc struct {
	profile  []string
	parts    []CPUPart
	profiled int // requests in the profiled phase
	lat      []float64
	serial   []float64 // one client's latencies
	errs     int
	cpu      time.Duration
	rounds   []float64 // CPU per request of each round's phase, µs
	p50s     []float64 // latency p50 of each round's phase, seconds
	wall     time.Duration
}

// beforeSuffix marks a target run on OverheadParams.Before's binary.
const beforeSuffix = "@before"

// urlsFor is the gateway's URL, or every engine's for the direct target
// (requests spread round robin, as the plain gateway does).
func urlsFor(gw string, fleet *SimFleet) []string {
	if gw != "" {
		return []string{gw}
	}
	var urls []string
	for _, e := range fleet.Engines {
		urls = append(urls, e.URL()+"/v1/chat/completions")
	}
	return urls
}

// bodyGen makes unique request bodies cheaply: a pre-encoded JSON prefix
// holding a base prompt, a unique word, a pre-encoded tail.
type bodyGen struct {
	heads  [][]byte
	tail   []byte
	n      atomic.Int64
	tokens int // the first base prompt's length in the engines' tokens
}

// newBodyGen makes b's base prompts, from the simulator's words or from
// doc (OverheadBody.Text). With a real tokenizer (tok not nil) a word is
// not one token, so the length is scaled until the chat prompt has about
// b.PromptTokens of tok's tokens.
func newBodyGen(b OverheadBody, tok *localtok.Model, doc string) (*bodyGen, error) {
	g := &bodyGen{tail: []byte(fmt.Sprintf(`"}],"max_tokens":%d,"stream":false}`, b.MaxTokens))}
	nwords := b.PromptTokens
	for attempt := 0; ; attempt++ {
		g.heads = g.heads[:0]
		rng := rand.New(rand.NewPCG(uint64(b.PromptTokens), 9))
		for i := 0; i < max(1, b.Bases); i++ {
			text := simwords.Words(rng, "base"+strconv.Itoa(i), nwords)
			if b.Text == "doc" {
				text = docText(doc, "base"+strconv.Itoa(i), nwords)
			}
			enc, _ := json.Marshal(text) // a quoted JSON string
			head := []byte(`{"model":"sim-model","messages":[{"role":"user","content":`)
			head = append(head, enc[:len(enc)-1]...) // without the closing quote
			g.heads = append(g.heads, head)
		}
		g.tokens = nwords
		if tok == nil {
			return g, nil
		}
		n, err := chatTokens(tok, append(append([]byte{}, g.heads[0]...), g.tail...))
		if err != nil {
			return nil, fmt.Errorf("tokenizing the %s body: %w", b.Name, err)
		}
		g.tokens = n
		if attempt == 3 || math.Abs(float64(n-b.PromptTokens)) <= 0.02*float64(b.PromptTokens) {
			return g, nil
		}
		nwords = max(1, nwords*b.PromptTokens/n)
	}
}

// docText is tag, a blank line and doc repeated up to about 4n bytes (n
// stands for a word count: the simulator's words average about four bytes
// with their space), cut before a character.
func docText(doc, tag string, n int) string {
	var sb strings.Builder
	sb.WriteString(tag + "\n\n")
	for sb.Len() < 4*n {
		sb.WriteString(doc)
	}
	text := sb.String()
	cut := max(4*n, len(tag))
	for cut < len(text) && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut]
}

func (g *bodyGen) next() []byte {
	i := g.n.Add(1)
	head := g.heads[int(i)%len(g.heads)]
	out := make([]byte, 0, len(head)+len(g.tail)+24)
	out = append(out, head...)
	out = append(out, " u"...)
	out = strconv.AppendInt(out, i, 10)
	return append(out, g.tail...)
}

type hammerResult struct {
	lat  []float64
	errs int
	wall time.Duration
}

// hammer runs conc closed-loop clients for d, cycling over urls, and
// returns the latencies of successful requests.
func hammer(ctx context.Context, c *http.Client, urls []string, gen *bodyGen, conc int, d time.Duration) hammerResult {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var (
		mu  sync.Mutex
		out hammerResult
		wg  sync.WaitGroup
		rr  atomic.Int64
	)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []float64
			errs := 0
			for ctx.Err() == nil {
				u := urls[int(rr.Add(1))%len(urls)]
				t0 := time.Now()
				ok := post(ctx, c, u, gen.next())
				if ctx.Err() != nil {
					break // cut by the phase's end: not counted
				}
				if ok {
					lat = append(lat, time.Since(t0).Seconds())
				} else {
					errs++
				}
			}
			mu.Lock()
			out.lat = append(out.lat, lat...)
			out.errs += errs
			mu.Unlock()
		}()
	}
	wg.Wait()
	out.wall = time.Since(start)
	return out
}

func post(ctx context.Context, c *http.Client, url string, body []byte) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxLine))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// profileSpec is one pprof profile to take of a gateway.
type profileSpec struct {
	kind string        // profile, allocs, heap
	over time.Duration // the delta or CPU window; 0 takes it as it stands (the heap in use now)
	path string        // where it is written
}

// saveProfile fetches the profile p of the gateway through its admin API
// and writes it to p.path.
func saveProfile(ctx context.Context, gw *Gateway, p profileSpec) error {
	ctx, cancel := context.WithTimeout(ctx, p.over+30*time.Second)
	defer cancel()
	u := fmt.Sprintf("%s/debug/pprof/%s", gw.AdminBase, p.kind)
	if p.over > 0 {
		u += fmt.Sprintf("?seconds=%d", max(1, int(p.over.Seconds())))
	}
	return saveGet(ctx, http.DefaultClient, u, p.path)
}

// saveAllocs records what the gateway allocated during d (a delta of its
// allocs profile) into path, for `go tool pprof -sample_index=alloc_space`:
// a diagnostic, so failures are only logged.
func saveAllocs(ctx context.Context, gw *Gateway, d time.Duration, path string) {
	if err := saveProfile(ctx, gw, profileSpec{kind: "allocs", over: d, path: path}); err != nil {
		log.Printf("allocation profile of the gateway: %v", err)
	}
}

// phaseProfile is what one phase's CPU profile of a gateway shows.
type phaseProfile struct {
	top   []string           // the lines of `go tool pprof -top -cum` that name this module or encoding/json
	cum   map[string]float64 // seconds, by function
	total float64            // seconds
}

// profilePhase records a CPU profile of the gateway for d through its
// admin API and reads it with `go tool pprof -top -cum`; a failed step
// leaves the result empty (the profile is a diagnostic, not a result).
func profilePhase(ctx context.Context, gw *Gateway, d time.Duration, path string) phaseProfile {
	var pp phaseProfile
	if err := saveProfile(ctx, gw, profileSpec{kind: "profile", over: d, path: path}); err != nil {
		log.Printf("profiling the gateway: %v", err)
		return pp
	}
	// Every node, however small, so that each part of the breakdown
	// finds its frames.
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-cum", "-nodecount=1000000", "-nodefraction=0", "-edgefraction=0", path).Output()
	if err != nil {
		log.Printf("go tool pprof: %v", err)
		return pp
	}
	if pp.cum, pp.total, err = parsePprofTop(string(out)); err != nil {
		log.Printf("reading the profile %s: %v", path, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "caddy-llmgw/") || strings.Contains(l, "encoding/json.Unmarshal") || strings.Contains(l, "encoding/json.Marshal") ||
			strings.Contains(l, "Duration:") {
			pp.top = append(pp.top, strings.TrimSpace(l))
		}
		if len(pp.top) >= 24 {
			break
		}
	}
	return pp
}
