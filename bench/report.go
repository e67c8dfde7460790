package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The report is rendered from the saved section results, so it always
// describes exactly the numbers in the JSON files next to it.

// loaded holds every section result found in the results directory.
type loaded struct {
	quality   *QualityResult
	scenarios *QualityResult
	fleet     *FleetResult
	overhead  *OverheadResult
	soak      *SoakResult
	trace     *TraceResult
	files     map[string]SectionFile
}

func loadSections(dir string) (*loaded, error) {
	l := &loaded{files: map[string]SectionFile{}}
	// Each section's result is decoded into a fresh value behind its
	// field, which stays nil when the section has no file.
	sections := []struct {
		name string
		set  func() any
	}{
		{"quality", func() any { l.quality = &QualityResult{}; return l.quality }},
		{"scenarios", func() any { l.scenarios = &QualityResult{}; return l.scenarios }},
		{"fleet", func() any { l.fleet = &FleetResult{}; return l.fleet }},
		{"overhead", func() any { l.overhead = &OverheadResult{}; return l.overhead }},
		{"soak", func() any { l.soak = &SoakResult{}; return l.soak }},
		{"trace", func() any { l.trace = &TraceResult{}; return l.trace }},
	}
	for _, sec := range sections {
		name := sec.name
		b, err := os.ReadFile(filepath.Join(dir, name+".json"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var f SectionFile
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("%s.json: %w", name, err)
		}
		l.files[name] = f
		if err := json.Unmarshal(f.Result, sec.set()); err != nil {
			return nil, fmt.Errorf("%s.json result: %w", name, err)
		}
	}
	// The soak's figures come from another program's JSON: check them
	// again, so a report is never rendered from figures that do not add up.
	if s := l.soak; s != nil && s.Run != nil {
		if err := s.Run.check(); err != nil {
			return nil, fmt.Errorf("soak.json: %w", err)
		}
	}
	return l, nil
}

// at returns the run of (workload, policy) at rate multiple x.
func (q *QualityResult) at(workload, policy string, x float64) *QualityRun {
	for i := range q.Runs {
		r := &q.Runs[i]
		if r.Workload == workload && r.Policy == policy && math.Abs(r.RateX-x) < 1e-9 {
			return r
		}
	}
	return nil
}

// rates lists a workload's rate multiples, ascending.
func (q *QualityResult) rates(workload string) []float64 {
	seen := map[float64]bool{}
	var out []float64
	for _, r := range q.Runs {
		if r.Workload == workload && !seen[r.RateX] {
			seen[r.RateX] = true
			out = append(out, r.RateX)
		}
	}
	sort.Float64s(out)
	return out
}

// refRate is the workload's rate closest to its no-hit capacity (1.0×).
func (q *QualityResult) refRate(workload string) float64 {
	best := math.Inf(1)
	for _, x := range q.rates(workload) {
		if math.Abs(x-1) < math.Abs(best-1) {
			best = x
		}
	}
	return best
}

// satRate is the lowest rate at which round_robin is saturated: its TTFT
// p90 at least doubled from the lowest rate (queues grow), or admission
// answered 503. Falls back to refRate.
func (q *QualityResult) satRate(workload string) float64 {
	rates := q.rates(workload)
	if len(rates) == 0 {
		return math.NaN()
	}
	base := q.at(workload, "round_robin", rates[0])
	if base == nil {
		return q.refRate(workload)
	}
	for _, x := range rates[1:] {
		r := q.at(workload, "round_robin", x)
		if r == nil {
			continue
		}
		if r.Summary.TTFT.P90 >= 2*base.Summary.TTFT.P90 || r.Summary.Rejected > 0 {
			return x
		}
	}
	return q.refRate(workload)
}

func (q *QualityResult) workload(name string) *QualityWorkload {
	for i := range q.Workloads {
		if q.Workloads[i].Spec.Name == name {
			return &q.Workloads[i]
		}
	}
	return nil
}

// render writes the markdown report.
func render(l *loaded, plotsRel string, plots map[string][]string, total time.Duration) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Benchmarks\n\n")
	w("Everything below — tables and plots — is produced by one command, from scratch:\n\n```sh\ngo -C bench run .\n```\n\n")
	if total > 0 {
		w("That run took **%s** of wall time.", total.Round(time.Second))
	}
	var m Machine
	for _, f := range l.files {
		m = f.Machine
		break
	}
	w(" Machine: %d × %s, %s, %s (load average at the end of the last section: %s; the machine was shared with other jobs, so absolute speeds are noisy — every comparison below is between configurations measured in the same run, alternating or back to back).\n\n",
		m.CPUs, m.CPUModel, m.GoVersion, m.OS, m.Load)
	w("`go -C bench run . -quick` is a smoke run of every section (< 7 minutes, with a soak of %s); `go -C bench run . -only quality|fleet|overhead|soak` re-runs one section and re-renders this file from the results saved under `bench/results/` (not committed). The harness lives in [`bench/`](bench/), a Go module of its own (so that the plotting library stays out of the gateway module's dependencies): load generator (`loadgen.go`), workloads (`workload.go`), Caddy runner (`caddyrun.go`), routing-quality runs (`quality.go`), fleet simulation (`fleetsim.go`, driving [`internal/sim/fleetsim`](internal/sim/fleetsim)), production-trace replays (`trace.go`, `tracecaddy.go`: `-trace FILE`), overhead runs (`overhead.go`), the soak (`soak.go`, running [`caddymodule/reliability_soak_test.go`](caddymodule/reliability_soak_test.go)), this report (`report.go`, `plots.go`, `soakreport.go`); every parameter is in `plans.go`.\n\n", every(soakDuration(true)))

	if l.quality != nil || l.scenarios != nil || l.overhead != nil || l.soak != nil {
		w("## Headline\n\n")
		renderHeadline(&b, l)
		renderFindings(&b, l)
	}
	if l.quality != nil {
		renderQuality(&b, l.quality, l.files["quality"], plotsRel, plots)
	}
	if l.scenarios != nil {
		renderScenarios(&b, l.scenarios, l.files["scenarios"], plotsRel, plots["scenarios"])
	}
	if l.fleet != nil {
		renderFleet(&b, l.fleet, l.files["fleet"], plotsRel, plots["fleet"])
	}
	if l.trace != nil {
		renderTrace(&b, l.trace, l.files["trace"])
	}
	if l.overhead != nil {
		renderOverhead(&b, l.overhead, l.files["overhead"], plotsRel, plots["overhead"])
	}
	if l.soak != nil {
		renderSoak(&b, l.soak, l.files["soak"], plotsRel, plots["soak"])
	}
	return b.String()
}

func renderHeadline(b *strings.Builder, l *loaded) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if q := l.quality; q != nil {
		name := "prefix-high"
		if q.workload(name) == nil && len(q.Workloads) > 0 {
			name = q.Workloads[0].Spec.Name
		}
		x := q.satRate(name)
		qw := q.workload(name)
		if qw != nil {
			w("Workload **%s** (%s, scaled: %s) on %d simulated vLLM engines behind a real Caddy, at **%.1f requests/s** — the lowest rate of the ladder at which `round_robin` saturates (its TTFT p90 at least doubles; %.2f× the fleet's estimated no-cache-hit capacity). Latencies in simulated seconds; the full ladder is in section 1.\n\n",
				name, qw.Spec.Reference, qw.Spec.Shape(), q.Params.Engines, x*qw.CapMiss, x)
		}
		w("| policy | hit rate | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | output tok/s | completed | 503 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, pol := range q.Params.Policies {
			r := q.at(name, pol.Name, x)
			if r == nil {
				continue
			}
			s := r.Summary
			w("| `%s` | %.1f%% | %s | %s | %s | %s | %.0f | %d/%d | %d |\n", pol.Name, s.HitRate*100, secs(s.TTFT.P50), secs(s.TTFT.P90), secs(s.TTFT.P99), ms(s.ITL.P50), s.OutputTPS, s.OK, s.Requests, s.Rejected)
		}
		w("\n")
	}
	if q := l.scenarios; q != nil {
		renderScenarioHeadline(b, q)
	}
	if o := l.overhead; o != nil {
		w("Gateway overhead (same run, alternating phases, closed loop of %d clients; CPU of the Caddy process only):\n\n", o.Params.Concurrency)
		w("| request | gateway | CPU/request vs plain Caddy | the same, round by round: median (range) | added latency p50 / p99 vs plain | added p50, round by round: median (range) | req/s vs plain |\n|---|---|---:|---:|---:|---:|---:|\n")
		for _, body := range o.Params.Bodies {
			plain := o.find(body.Name, "plain")
			for _, t := range o.targets()[2:] {
				llm := o.find(body.Name, t)
				if llm == nil || plain == nil || plain.CPUPerReq == 0 || plain.ReqPerSec == 0 || !isProduct(t) {
					continue
				}
				byRound, addedByRound := "–", "–"
				if r, ok := cpuVsPlain(llm, plain); ok {
					byRound = r.ratio()
				}
				if r, ok := addedP50VsPlain(llm, plain); ok {
					addedByRound = r.millis()
				}
				w("| %s | `%s` | %.0f µs vs %.0f µs (**%.2f×**) | %s | %+.2f ms / %+.2f ms | %s | %.0f vs %.0f (%.2f×) |\n", o.bodyLabel(body), t,
					llm.CPUPerReq, plain.CPUPerReq, llm.CPUPerReq/plain.CPUPerReq, byRound,
					(llm.Latency.P50-plain.Latency.P50)*1000, (llm.Latency.P99-plain.Latency.P99)*1000, addedByRound,
					llm.ReqPerSec, plain.ReqPerSec, llm.ReqPerSec/plain.ReqPerSec)
			}
		}
		w("\n")
	}
}

// renderFindings summarises the sections in a few sentences, every number
// taken from the results.
func renderFindings(b *strings.Builder, l *loaded) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("**In short:**\n\n")
	if q := l.quality; q != nil {
		var wins []string
		for _, name := range []string{"prefix-high", "prefix-long", "multiturn"} {
			x := q.refRate(name)
			llm, rr := q.at(name, "llm", x), q.at(name, "round_robin", x)
			if llm == nil || rr == nil {
				continue
			}
			wins = append(wins, fmt.Sprintf("%s %.0f%% vs %.0f%% (TTFT p50 %s vs %s)", name, llm.Summary.HitRate*100, rr.Summary.HitRate*100, secs(llm.Summary.TTFT.P50), secs(rr.Summary.TTFT.P50)))
		}
		if len(wins) > 0 {
			w("- **Where `lb_policy llm` wins:** on shared prefixes and chat sessions it finds the cache that `round_robin` and `least_conn` scatter — hit rate `llm` vs `round_robin`: %s.\n", strings.Join(wins, "; "))
		}
		var lo, hi, q2, rr *QualityRun
		if rates := q.rates("prefix-high"); len(rates) > 1 {
			x := q.satRate("prefix-high")
			lo, hi, q2 = q.at("prefix-high", "llm", rates[0]), q.at("prefix-high", "llm", x), q.at("prefix-high", "llm-queue2x", x)
			rr = q.at("prefix-high", "round_robin", x)
		}
		if lo != nil && hi != nil && q2 != nil && rr != nil {
			w("- **Under overload, cache-aware admission keeps the affinity:** with `max_inflight` = `--max-num-seqs` and `engine_queue 1` (the README's advice) a parked request goes to the engine holding its prefix when it frees, or queues there while the wait costs less than the prefill it saves, so on prefix-high `llm`'s hit rate goes from %.0f%% at %.1f req/s to %.0f%% at %.1f req/s (TTFT p90 %s; `round_robin` %s). Letting every engine queue instead (`max_inflight` = 2 × max_num_seqs, `llm-queue2x`, the old workaround) gives %.0f%% hits and TTFT p90 %s at the same rate.%s\n",
				lo.Summary.HitRate*100, lo.Rate, hi.Summary.HitRate*100, hi.Rate, secs(hi.Summary.TTFT.P90), secs(rr.Summary.TTFT.P90), q2.Summary.HitRate*100, secs(q2.Summary.TTFT.P90), fleetScope(l.fleet))
		}
		var losses []string
		for _, name := range []string{"prefix-low", "random"} {
			x := q.refRate(name)
			llm := q.at(name, "llm", x)
			best := q.bestBuiltin(name, x)
			if llm != nil && best != nil {
				losses = append(losses, fmt.Sprintf("%s: TTFT p90 %s vs %s for `%s`", name, secs(llm.Summary.TTFT.P90), secs(best.Summary.TTFT.P90), best.Policy))
			}
		}
		if len(losses) > 0 {
			w("- **Where it has nothing to gain:** with little or nothing shared it can only balance load, and it does that about as well as Caddy's own policies — %s (see the sections for why).\n", strings.Join(losses, "; "))
		}
	}
	if q := l.scenarios; q != nil {
		if gap := scenarioFinding(q); gap != "" {
			w("- **Where only the engines know** (section 2, real Caddy): %s.\n", gap)
		}
	}
	if f := l.fleet; f != nil {
		var small, large *FleetRun
		for i := range f.Runs {
			r := &f.Runs[i]
			if r.Variant != "llm" {
				continue
			}
			if small == nil || r.Engines < small.Engines {
				small = r
			}
			if large == nil || r.Engines > large.Engines {
				large = r
			}
		}
		if small != nil && large != nil {
			w("- **At scale** (fleet simulation, the gateway's own routing and index code): from %d to %d engines the hit rate stays %.0f%%–%.0f%%; a decision costs %.0f µs → %.0f µs (mean) and KV-event upkeep %.0f µs → %.0f µs per request; the index holds %d blocks in %.0f MiB at %d engines.\n",
				small.Engines, large.Engines, small.HitRate*100, large.HitRate*100, small.DecisionNs.Mean/1000, large.DecisionNs.Mean/1000, small.EventUsPerReq, large.EventUsPerReq, large.IndexBlocks, float64(large.IndexBytes)/(1<<20), large.Engines)
		}
	}
	if o := l.overhead; o != nil {
		var parts []string
		for _, body := range o.Params.Bodies {
			plain := o.find(body.Name, "plain")
			for _, t := range o.targets()[2:] {
				llm := o.find(body.Name, t)
				if llm != nil && plain != nil && plain.CPUPerReq > 0 && isProduct(t) {
					parts = append(parts, fmt.Sprintf("`%s` %.1f× plain Caddy's CPU per request on %s requests (%.0f vs %.0f µs), RSS %.0f vs %.0f MiB", t, llm.CPUPerReq/plain.CPUPerReq, body.Name, llm.CPUPerReq, plain.CPUPerReq, float64(llm.RSS)/(1<<20), float64(plain.RSS)/(1<<20)))
				}
			}
		}
		if len(parts) > 0 {
			where, layers := "section 4's breakdown by part and its profiles", layersFinding(o)
			if layers != "" {
				where = "section 4's layers, its breakdown by part and its profiles"
			}
			w("- **What it costs:** %s; where it goes is in %s.%s\n", strings.Join(parts, "; "), where, layers)
		}
	}
	if s := l.soak; s != nil {
		w("- %s\n", soakFinding(s))
	}
	w("\n")
}

// engineRange names the fleet sizes of the simulation: "8 to 256
// engines", or "4 engines" for a single size.
func engineRange(sizes []int) string {
	if len(sizes) == 0 {
		return "no engines"
	}
	lo, hi := slices.Min(sizes), slices.Max(sizes)
	if lo == hi {
		return plural(lo, "engine")
	}
	return fmt.Sprintf("%d to %d engines", lo, hi)
}

// fleetScope points from the findings to section 3, with the fleet sizes
// it ran, when it ran.
func fleetScope(f *FleetResult) string {
	if f == nil {
		return ""
	}
	return fmt.Sprintf(" Section 2 shows the same choice at %s.", engineRange(f.Params.Sizes))
}

func (o *OverheadResult) find(body, target string) *OverheadStat {
	for i := range o.Stats {
		if o.Stats[i].Body == body && o.Stats[i].Target == target {
			return &o.Stats[i]
		}
	}
	return nil
}

// roundStats are the median and range of one figure taken round by round
// against plain Caddy's of the same round: the two phases of a round run
// seconds apart, so the machine's speed, which drifts over a run by more
// than the differences measured, weighs on both alike.
type roundStats struct {
	median, lo, hi float64
	n              int
}

// pairRounds applies f to each round's pair of s's and plain's figures,
// skipping rounds where either is 0 (a phase that served nothing); ok is
// false when no round has both.
func pairRounds(s, plain []float64, f func(x, p float64) float64) (r roundStats, ok bool) {
	var v []float64
	for i := 0; i < min(len(s), len(plain)); i++ {
		if s[i] > 0 && plain[i] > 0 {
			v = append(v, f(s[i], plain[i]))
		}
	}
	if len(v) == 0 {
		return roundStats{}, false
	}
	slices.Sort(v)
	n := len(v)
	r = roundStats{lo: v[0], hi: v[n-1], n: n, median: v[n/2]}
	if n%2 == 0 {
		r.median = (v[n/2-1] + v[n/2]) / 2
	}
	return r, true
}

// cpuVsPlain is s's CPU per request over plain's, round by round.
func cpuVsPlain(s, plain *OverheadStat) (roundStats, bool) {
	return pairRounds(s.CPURounds, plain.CPURounds, func(x, p float64) float64 { return x / p })
}

// addedP50VsPlain is s's latency p50 minus plain's, in milliseconds, round
// by round.
func addedP50VsPlain(s, plain *OverheadStat) (roundStats, bool) {
	return pairRounds(s.P50Rounds, plain.P50Rounds, func(x, p float64) float64 { return (x - p) * 1000 })
}

// ratio writes r as ratios.
func (r roundStats) ratio() string {
	return fmt.Sprintf("%.2f× (%.2f–%.2f×, %d rounds)", r.median, r.lo, r.hi, r.n)
}

// millis writes r as differences in milliseconds.
func (r roundStats) millis() string {
	return fmt.Sprintf("%+.2f ms (%+.2f to %+.2f, %d rounds)", r.median, r.lo, r.hi, r.n)
}

// micros writes r as differences in microseconds.
func (r roundStats) micros() string {
	return fmt.Sprintf("%+.0f µs (%+.0f to %+.0f, %d rounds)", r.median, r.lo, r.hi, r.n)
}

func (b OverheadBody) label() string {
	return fmt.Sprintf("%s (%d-token prompt, %d output tokens, non-streaming)", b.Name, b.PromptTokens, b.MaxTokens)
}

// overheadIntro is section 4's description of the run.
func overheadIntro(o *OverheadResult) string {
	p := o.Params
	// The gateways are the targets but the engines themselves (direct,
	// first), which the rotation drives last.
	var gws []string
	for _, t := range o.targets()[1:] {
		if o.ran(t) {
			gws = append(gws, t)
		}
	}
	gateways := countWord(len(gws)) + " Caddy processes run"
	rotation := strings.Join(append(slices.Clone(gws), "direct"), " → ")
	local, tok := "", "the simulator's word tokenizer (one word, one token)"
	if p.Tokenizer != "" {
		local = fmt.Sprintf("; **llm-local** = the same with `tokenizer sim-model <dir>` in the llm app: the engines' own %s tokenizer files, read by the gateway (chat template rendered and prompt encoded in-process, no `/tokenize`; the default 1%% of requests still checked against an engine's `/tokenize` in the background)", p.Tokenizer)
		tok = fmt.Sprintf("the real %s tokenizer and chat template (vllmsim's Config.Tokenizer), and bodies are sized in its tokens", p.Tokenizer)
	}
	before := ""
	if p.Before != "" {
		before = "; **…@before** = the same gateway built from an earlier commit (`BENCH_BEFORE_CADDY`), right after it in every rotation, so that a change is measured before and after in one run"
	}
	before += layersNote(o)
	before += docNote(p.Bodies)
	return fmt.Sprintf("%s side by side in front of the same %d fast simulated engines (time scale %g, so an engine answers in well under a millisecond), which tokenize with %s: **llm** = `llm_admission` + `reverse_proxy { lb_policy llm }` with KV events (the full precise path: body parse, `/tokenize` on an engine, block keys, index match, accounting, event upkeep)%s; **plain** = `reverse_proxy { lb_policy round_robin }` with no llm app; **direct** = the engines without a proxy%s. %d closed-loop clients drive one target at a time for %.0f s, rotating %s, %d rounds (after a %.0f s warm-up each), so machine noise hits all of them alike. Every request is unique (a counter appended to one of a few base prompts), so the gateway's tokenize cache never hits, while the engines' prefix caches — and the gateway's KV index — match all but the last block, the most work for the index. CPU is the Caddy process's user+system time (`/proc/<pid>/stat`) per request, over all rounds; **by round** divides each round's figure by plain Caddy's of the same round (for added latency, subtracts plain Caddy's p50 of that round from the target's) and gives the median and range over the rounds, which the machine's drift in speed between rounds does not move; the `/tokenize` call's own CPU is spent in the engine and is not included. Memory is Caddy's RSS after the runs (peak in parentheses).%s\n\n",
		gateways, p.Engines, p.TimeScale, tok, local, before, p.Concurrency, p.Phase, rotation, p.Rounds, p.Warmup, serialNote(p))
}

// layersNote describes the layers between plain Caddy and llm when the
// run measured them; "" for results saved before it did.
func layersNote(o *OverheadResult) string {
	if !o.ran("admission") || !o.ran("approx") {
		return ""
	}
	return "; and between plain Caddy and llm, its layers, each the one before plus one module: **admission** = the llm app (polling the engines' gauges, no KV events) and `llm_admission` (body read and parsed, the gate and its reservation, the response observed) in front of `lb_policy round_robin`; **approx** = the same with `lb_policy llm { disable_tokenize }`: the choice on the approximate prefix tree alone, no tokenization; llm and llm-local then add KV events and the precise tier (tokens, block keys, index match)"
}

// ran says the run measured target t on some body.
func (o *OverheadResult) ran(t string) bool {
	for _, body := range o.Params.Bodies {
		if o.find(body.Name, t) != nil {
			return true
		}
	}
	return false
}

// docNote says which bodies are a real document's text rather than the
// simulator's words; "" when none is.
func docNote(bodies []OverheadBody) string {
	var names []string
	for _, b := range bodies {
		if b.Text == "doc" {
			names = append(names, "**"+b.Name+"**")
		}
	}
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf(". The prompts are the simulator's words (words and spaces), but those of %s: a Markdown document with code (`%s`), whose newlines and quotes JSON escapes every 14 bytes or so, as it does in real prompts, where the gateway's JSON readers stop at every escape", strings.Join(names, " and "), overheadDoc)
}

// countWord spells a small count, capitalized, for the start of a
// sentence.
func countWord(n int) string {
	if words := []string{"No", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight"}; n >= 0 && n < len(words) {
		return words[n]
	}
	return strconv.Itoa(n)
}

func serialNote(p OverheadParams) string {
	if p.SerialPhase <= 0 {
		return ""
	}
	return fmt.Sprintf(" After each phase one client alone drives the same target for %.0f s (**1 client** column): %d clients saturate these cores, so their added latency is mostly the gateway's CPU cost queueing behind the others; with one client the difference to plain Caddy is the time the gateway adds on the request's own path.", p.SerialPhase, p.Concurrency)
}

// targets are the section's targets in the order of its tables: the
// engines directly, plain Caddy, the layers (admission, approx), the llm
// gateway, and llm-local when the run had a real tokenizer; each llm
// gateway followed by its run on an earlier build when the run had one
// (OverheadParams.Before). Results saved before the layers were measured
// have no admission or approx: their rows are left out.
func (o *OverheadResult) targets() []string {
	t := []string{"direct", "plain", "admission", "approx"}
	llm := []string{"llm"}
	if o.Params.Tokenizer != "" {
		llm = append(llm, "llm-local")
	}
	for _, name := range llm {
		t = append(t, name)
		if o.Params.Before != "" {
			t = append(t, name+beforeSuffix)
		}
	}
	return t
}

// isGateway says the target is a gateway built with this module, compared
// with plain Caddy: neither the engines directly nor plain Caddy itself.
func isGateway(t string) bool { return t != "direct" && t != "plain" }

// isProduct says the target is one of the precise paths the headline
// reports (llm, llm-local), not a layer below them or an earlier build.
func isProduct(t string) bool {
	return strings.HasPrefix(t, "llm") && !strings.HasSuffix(t, beforeSuffix)
}

// bodyLabel is a body's label, with its length in the real tokenizer's
// tokens when the run had one.
func (o *OverheadResult) bodyLabel(b OverheadBody) string {
	if n := o.PromptTokens[b.Name]; o.Params.Tokenizer != "" && n > 0 {
		return fmt.Sprintf("%s (%d %s tokens, %d output tokens, non-streaming)", b.Name, n, o.Params.Tokenizer, b.MaxTokens)
	}
	return b.label()
}

func secs(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f s", v)
}

func ms(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f ms", v*1000)
}

func renderQuality(b *strings.Builder, q *QualityResult, f SectionFile, plotsRel string, plots map[string][]string) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p := q.Params
	w("## 1. Routing quality: real Caddy, simulated vLLM fleet\n\n")
	w("Command: `%s` (%s of this run).\n\n", f.rerun("quality"), time.Duration(f.Seconds*float64(time.Second)).Round(time.Second))
	w("**Setup.** For every (workload, rate, policy) the harness starts a fresh fleet of %d [`vllmsim`](internal/sim/vllmsim) engines in its own process (cold caches for everyone; max_num_seqs %d, block size %d, prefill %.0f tokens/s, decode step %.0f ms, %d-token steps, KV events over ZeroMQ) and a fresh Caddy process built from this checkout (`go build ./cmd/caddy`) with a generated Caddyfile: `llm { poll_interval %s; engine … { max_inflight %d; kv_events …; kv_replay … } }`, `llm_admission { max_park %.0fs (simulated); engine_queue 1 }`, `reverse_proxy <%d engines> { lb_policy …; flush_interval -1 }`. Only the policy differs:\n\n",
		p.Engines, p.Model.MaxNumSeqs, p.Model.BlockSize, p.Model.PrefillTokensPerSec, p.Model.DecodeStepSeconds*1000, p.Model.MaxBatchedTokens, p.PollInterval, p.Model.MaxNumSeqs, p.MaxPark, p.Engines)
	for _, pol := range p.Policies {
		w("- `%s`: %s\n", pol.Name, pol.Desc)
	}
	w("\nThe load generator (Go, OpenAI chat completions with `stream: true` and `stream_options.include_usage`) starts sessions as a Poisson process at the offered rate and records per request the time to the first content token (TTFT), the gaps between content chunks (ITL), end-to-end latency, and `usage` (prompt, completion and `prompt_tokens_details.cached_tokens`). **Hit rate** is Σ cached ÷ Σ prompt tokens of completed requests, as the engines report it. The engines run %g× faster than real time; all latencies are in *simulated* seconds (wall × %g), so the host's own overheads (Caddy, the load generator, the simulators, all on these %d cores) are magnified %g× too — the overhead section measures them in wall time. To keep the host from being the bottleneck, every streamed token stands for %d (the simulator's decode step is %d × %.0f ms and requests ask for a quarter of their nominal output; ITL and output tokens below are per nominal token), which keeps each request's decode time and the fleet's capacity while cutting the per-token work of the simulators, Caddy and the load generator; it also means a first token takes at least one %.0f ms step. The **sim lag** column checks that the simulation kept time: the mean gap between a request's tokens over the decode step, corrected for the prefill steps the engines had to interleave — 1.00 means on time; a run above %.2f (the host could not run the simulators on time) is run again, up to %d times per section, keeping the attempt that lagged least, and is flagged if it still lags. It is not estimated (–) when the load was uneven across engines or engines preempted, which its correction does not model.\n\n",
		p.TimeScale, p.TimeScale, f.Machine.CPUs, p.TimeScale, p.Model.tokenScale(), p.Model.tokenScale(), p.Model.DecodeStepSeconds*1000,
		p.Model.DecodeStepSeconds*1000*float64(p.Model.tokenScale()), p.LagThreshold, p.MaxRetries)
	w("**Workloads and the capacity rule.** Workloads are parameters, not data: text is generated so the simulator's tokenizer (one word ≈ one token) yields the wanted counts. The field's shapes are scaled down in group count so a run sends a few hundred requests, and each engine's KV cache is sized so that the workload's *resident set* — the distinct shared tokens: every group's system prompt, or every chat session's full history — fills ρ = %.2f of the fleet's total KV cache (never less than 1.25 × the working set of max_num_seqs requests running at once, so a full batch stays below admission's kv_limit of 0.9; ρ below is the effective value). A router that keeps each group on one engine then needs about ρ of each engine's cache for prefixes; a router that spreads every group over every engine asks each engine to hold ρ × %d of its capacity. Rates are multiples of the fleet's estimated capacity with no cache hits (cap₀: decode time shared by max_num_seqs sequences plus the full prefill); cap₁ is the estimate with every shared prefix cached.\n\n", p.Rho, p.Engines)
	w("| workload | reference shape | scaled shape | requests | KV blocks/engine | ρ | cap₀ req/s | cap₁ req/s | rates (× cap₀) |\n|---|---|---|---:|---:|---:|---:|---:|---|\n")
	for _, qw := range q.Workloads {
		var rs []string
		for _, x := range q.rates(qw.Spec.Name) {
			rs = append(rs, fmt.Sprintf("%g", x))
		}
		w("| %s | %s | %s | %d | %d | %.2f | %.1f | %.1f | %s |\n", qw.Spec.Name, qw.Spec.Reference, qw.Spec.Shape(), qw.Spec.Requests(), qw.KVBlocks, qw.Rho, qw.CapMiss, qw.CapHit, strings.Join(rs, ", "))
	}
	w("\nShapes are groups × prompts per group, system/question/output tokens; multi-turn: sessions × turns, system/user-turn/answer tokens (each turn's prompt carries the whole history; %.0f s think time between turns).\n\n", thinkOf(q))

	if hr := plots["hit_rate"]; len(hr) > 0 {
		w("![hit rate per policy](%s)\n\n", filepath.ToSlash(filepath.Join(plotsRel, hr[0])))
	}
	w("Hit rate per workload and policy at the rate closest to cap₀:\n\n| workload | rate |")
	for _, pol := range p.Policies {
		w(" `%s` |", pol.Name)
	}
	w("\n|---|---:|%s\n", strings.Repeat("---:|", len(p.Policies)))
	for _, qw := range q.Workloads {
		x := q.refRate(qw.Spec.Name)
		w("| %s | %.1f/s |", qw.Spec.Name, x*qw.CapMiss)
		for _, pol := range p.Policies {
			if r := q.at(qw.Spec.Name, pol.Name, x); r != nil {
				w(" %.1f%% |", r.Summary.HitRate*100)
			} else {
				w(" – |")
			}
		}
		w("\n")
	}
	w("\n")

	for _, qw := range q.Workloads {
		name := qw.Spec.Name
		w("### %s — %s\n\n", name, qw.Spec.Reference)
		for _, f := range plots["ttft:"+name] {
			w("![TTFT p90 vs rate, %s](%s)\n\n", name, filepath.ToSlash(filepath.Join(plotsRel, f)))
		}
		w("| rate | policy | hit rate | TTFT p50 | p90 | p99 | ITL p50 | ITL p90 | E2E p90 | output tok/s | completed | 503 | errors | sim lag | Caddy CPU | TTFT prediction error | decisions |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, x := range q.rates(name) {
			for _, pol := range p.Policies {
				r := q.at(name, pol.Name, x)
				if r == nil {
					continue
				}
				s := r.Summary
				flag := ""
				if r.Stalled {
					flag = " **stalled**"
				}
				lag := lagText(r, p)
				w("| %.1f/s (%g×) | `%s`%s | %.1f%% | %s | %s | %s | %s | %s | %s | %.0f | %d/%d | %d | %d | %s | %.1f s | %s | %s |\n",
					r.Rate, x, pol.Name, flag, s.HitRate*100, secs(s.TTFT.P50), secs(s.TTFT.P90), secs(s.TTFT.P99), ms(s.ITL.P50), ms(s.ITL.P90), secs(s.E2E.P90),
					s.OutputTPS, s.OK, s.Requests, s.Rejected, s.Errors+s.Timeouts, lag, r.CaddyCPU, calibrationText(s.Calibration), decisions(r.Decisions))
			}
		}
		w("\n")
		if c := q.calibrationLine(name); c != "" {
			w("- %s\n", c)
		}
		for _, v := range verdicts(q, name) {
			w("- %s\n", v)
		}
		if why := whyText(qw.Spec, p); why != "" {
			w("\n%s\n", why)
		}
		w("\n")
	}
	var problems []string
	for _, r := range q.Runs {
		if r.SimLag > p.LagThreshold {
			problems = append(problems, fmt.Sprintf("%s / `%s` / %.1f req/s: the simulated engines ran %.0f%% slower than scheduled (host contention; %d attempts) — its latencies overstate that configuration's",
				r.Workload, r.Policy, r.Rate, (r.SimLag-1)*100, r.Attempts))
		}
		if r.Stalled || r.Summary.Errors > 0 || r.Summary.Timeouts > 0 {
			problems = append(problems, fmt.Sprintf("%s / `%s` / %.1f req/s: %d errors, %d timeouts%s (first error: %q)",
				r.Workload, r.Policy, r.Rate, r.Summary.Errors, r.Summary.Timeouts, map[bool]string{true: ", run cut after 60 s without progress", false: ""}[r.Stalled], r.Summary.FirstErr))
		}
	}
	w("### Problems seen in this run\n\n")
	if len(problems) == 0 {
		w("None: every request of every run completed or was answered 503 by admission.\n\n")
	} else {
		for _, p := range problems {
			w("- %s\n", p)
		}
		w("\n")
	}
}

func thinkOf(q *QualityResult) float64 {
	for _, w := range q.Workloads {
		if w.Spec.Kind == "multiturn" {
			return w.Spec.ThinkSeconds
		}
	}
	return 0
}

// calibrationText is a run's TTFT prediction error for the quality table:
// the median relative absolute error and, in parentheses, the median
// signed one; empty for runs without predictions.
func calibrationText(c *Calibration) string {
	if c == nil {
		return ""
	}
	return fmt.Sprintf("%.0f%% (%+.0f%%)", c.AbsP50*100, c.BiasP50*100)
}

// calibrationLine states the routing model's calibration on a workload:
// the median, over the workload's runs with predictions, of each run's
// median |predicted − observed| ÷ observed TTFT, against the 25% target.
func (q *QualityResult) calibrationLine(name string) string {
	var meds []float64
	for _, r := range q.Runs {
		if r.Workload == name && r.Summary.Calibration != nil {
			meds = append(meds, r.Summary.Calibration.AbsP50)
		}
	}
	if len(meds) == 0 {
		return ""
	}
	return fmt.Sprintf("**TTFT prediction (lb_policy llm):** median |predicted − observed| ÷ observed %.0f%% over %d runs (per-run medians %s; target ≤ 25%%). Observed from the client's send less the time admission parked the request (its X-LLM-Queue-Wait), predicted from dispatch.",
		percentiles(slices.Clone(meds)).P50*100, len(meds), pctList(meds))
}

// pctList formats fractions as a comma-separated list of percentages.
func pctList(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.0f%%", x*100)
	}
	return strings.Join(parts, ", ")
}

// decisions condenses the policy's decision counters ("precise/hit": n).
func decisions(d map[string]float64) string {
	if len(d) == 0 {
		return ""
	}
	var total float64
	for _, v := range d {
		total += v
	}
	if total == 0 {
		return ""
	}
	keys := make([]string, 0, len(d))
	for k, v := range d {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return d[keys[i]] > d[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", k, d[k]/total*100))
	}
	return strings.Join(parts, ", ")
}

// bestBuiltin is the run of Caddy's built-in policies with the lowest TTFT
// p90 for a workload at rate x, among runs that served anything (a run
// that served nothing has a TTFT p90 of 0); nil if there is none.
func (q *QualityResult) bestBuiltin(name string, x float64) *QualityRun {
	var best *QualityRun
	for _, pol := range []string{"least_conn", "round_robin"} {
		if r := q.at(name, pol, x); r != nil && r.Summary.OK > 0 && (best == nil || r.Summary.TTFT.P90 < best.Summary.TTFT.P90) {
			best = r
		}
	}
	return best
}

// verdicts compares the lb_policy llm configurations with the best of
// Caddy's built-in policies at every rate, in words.
func verdicts(q *QualityResult, name string) []string {
	var out []string
	for _, x := range q.rates(name) {
		best := q.bestBuiltin(name, x)
		if best == nil {
			continue
		}
		for _, pol := range []string{"llm", "llm-queue2x"} {
			llm := q.at(name, pol, x)
			if llm == nil || llm.Summary.OK == 0 {
				continue
			}
			a, c := llm.Summary, best.Summary
			ratio := c.TTFT.P90 / a.TTFT.P90
			verb := "beats"
			switch {
			case ratio < 0.9:
				verb = "**loses to**"
			case ratio < 1.1:
				verb = "ties with"
			}
			out = append(out, fmt.Sprintf("%.1f req/s: `%s` %s `%s` on TTFT p90 (%s vs %s, %.2f×), hit rate %.1f%% vs %.1f%%, output %.0f vs %.0f tok/s.",
				llm.Rate, pol, verb, best.Policy, secs(a.TTFT.P90), secs(c.TTFT.P90), ratio, a.HitRate*100, c.HitRate*100, a.OutputTPS, c.OutputTPS))
		}
	}
	return out
}

// whyText explains, per workload, what the policies can and cannot gain;
// it follows from the workload's shape, the fleet's size and the gateway's
// rules, not from one run's numbers.
func whyText(w WorkloadSpec, p QualityParams) string {
	shared := 100 * float64(w.SystemTokens) / float64(w.SystemTokens+w.QuestionTokens)
	switch w.Name {
	case "prefix-high":
		return fmt.Sprintf("Why: %.0f%% of every prompt is its group's system prompt, and the fleet's caches can keep every group resident only if each group lives on one engine. `round_robin` and `least_conn` send every group everywhere, so each engine cycles through all groups' prefixes and evicts them before they are reused (their hit rate is what survives by chance). `lb_policy llm` sends a group where its prefix is, so most prompts prefill only their question: shorter TTFT, and a higher saturation point because engines spend less time prefilling. The approximate tier does as well as the precise one here because this gateway is the only client and the prefixes are byte-identical, so its prefix tree is right; it cannot see evictions, which the precise tier can.\n\n"+
			"Past `round_robin`'s saturation `llm` keeps most of that advantage through cache-aware admission (the README's rule): with `max_inflight` = `--max-num-seqs`, a request that parks is placed on its group's engine once — a slot freed there goes to it before the head of the queue, and it may queue at that engine while the expected wait (queue ahead ÷ the engine's drain rate) is below the prefill of its %d shared tokens times the batch that prefill would stall elsewhere; otherwise it takes a cold engine. Without that rule its requests would spill to whichever engine had a free slot, miss there and evict other groups' prefixes. `llm-queue2x` (max_inflight = 2 × max_num_seqs, the old workaround) lets every engine queue a second batch; it is no longer needed for the hits and adds queueing delay. `cache_key_header` pins groups by hashing the key and ignores load: hashing %d groups onto %d engines gives some engines well over their share, which shows as a long TTFT tail and lower throughput at high rates, although its hit rate is the highest.", shared, w.SystemTokens, w.Groups, p.Engines)
	case "prefix-low":
		return fmt.Sprintf("Why: only the %d-token system prompt (%.0f%% of each prompt) is shared, so affinity can save at most about that share of the prefill, and the policies differ mainly in how they balance load. Affinity still pulls a group's requests towards the engine holding those %d tokens — and with them their %d-token uncached questions — so the cost model prices what each engine has still to prefill: the uncached tokens of this gateway's requests there until their first token, and until when the last of them is predicted to end. About one request in five finds every engine prefilling; it goes where the prefill ahead ends soonest, as `round_robin`'s cycle does by sending each request to the engine served longest ago. It pays for a `/tokenize` call per request and decides on gauges up to one poll interval old. There is little for cache-aware routing to sell here: the goal is not to lose. `cache_key_header` hot-spots as on prefix-high.", w.SystemTokens, shared, w.SystemTokens, w.QuestionTokens)
	case "prefix-long":
		return fmt.Sprintf("Why: a %d-token shared prefix makes a miss cost %.1f s of prefill, so keeping groups together pays in TTFT; but each request also decodes %d tokens, so the fleet's capacity is mostly decode time and the prefill saved changes throughput little. With %d requests per group, at most %d in %d can hit.",
			w.SystemTokens, float64(w.SystemTokens)/p.Model.PrefillTokensPerSec, w.OutputTokens, w.PerGroup, w.PerGroup-1, w.PerGroup)
	case "multiturn":
		return fmt.Sprintf("Why: every turn's prompt is the previous turn's prompt plus the answer plus a new question, so the engine that served the last turn holds almost the whole prompt. All `lb_policy llm` variants (and `cache_key_header` with the session id) follow the session; `round_robin` and `least_conn` find the history on the right engine only by chance (1 in %d) and otherwise reuse only the shared system prompt. Sessions pace themselves (think time, one turn at a time), so the fleet does not saturate at these rates.", p.Engines)
	case "random":
		return "Why: the control. Nothing is shared, so no policy can get hits and the best a router can do is balance load. `lb_policy llm` then decides on load alone (the decisions column shows `load_only`); it pays for tokenizing each prompt and decides on gauges up to one poll interval old, so matching Caddy's policies is the goal. At this rate the fleet fills up near the end of the run and requests park in admission: with `engine_queue 1` (every policy has it) a full engine refills a freed slot from its own queue at once, where a request parked at the gateway would reach it a step later. `cache_key_header` with a unique key per request is random placement, which shows in its tail."
	}
	return ""
}

func renderFleet(b *strings.Builder, f *FleetResult, sf SectionFile, plotsRel string, plots []string) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p := f.Params
	w("## 3. Fleet simulation: %s\n\n", engineRange(p.Sizes))
	w("Command: `%s` (%s of this run).\n\n", sf.rerun("fleet"), time.Duration(sf.Seconds*float64(time.Second)).Round(time.Second))
	w("One machine cannot run hundreds of engines, so this section runs [`internal/sim/fleetsim`](internal/sim/fleetsim): the gateway's own core — a real [`fleet.Fleet`](fleet), the code `llm_admission` and `lb_policy llm` call — in-process against a discrete-event model of N engines. Admission is the real `admission.Gate` on the simulation's clock. An engine has room while running + waiting − finished + dispatched < max_inflight — max_num_seqs, or twice that for the `-queue2x` variants — and KV usage < %.2f (`Fleet.TryReserve`); for the `llm` policy admission is cache-aware (`Fleet.Place` once per request, `Placement.Reserve` at every try: the request goes to an engine holding its prefix, or queues there while the wait costs less than the prefill it saves, see the README's *Cache-aware admission*). Requests that find no room park, at most %d, for at most %.0f s, then get 503. The `llm` policy sends a placed request where admission counted it, else routes it with `Fleet.Route` (candidates, the KV index's matches, routing.Pick); the returned `Pick`'s `Commit` records it and the `Attempt`'s `Dispatch` counts it, with the registry's own accounting (in flight, dispatched since the scrape, finished since the scrape); the engines are scraped every %.0f ms of simulated time through the registry, as its pollers would. The index's mirrors are fed the engines' KV events as vLLM's msgpack batches through `kvindex.Feed`, so event decoding and mirror upkeep are measured too. `TestPolicyMatchesFleetSim` checks that `Policy.Select` makes the simulation's decisions. The engine model follows `vllmsim` (and so vLLM): prefix-cache hits at admission, whole-prompt block reservation, chunked prefill under an %d-token step budget, one token per decoding sequence per step (%.0f ms), prefill at %.0f tokens/s, LRU eviction of freed cached blocks with BlockRemoved events, recompute preemption; max_num_seqs %d. `least_conn` is Caddy's (fewest requests in flight, a random one among ties), `round_robin` cycles; both are modelled, as is the fallback to least_conn when `Route` has no pick.\n\n",
		p.KVLimit, p.QueueSize, p.MaxPark, p.PollInterval*1000, p.Model.MaxBatchedTokens, p.Model.DecodeStepSeconds*1000, p.Model.PrefillTokensPerSec, p.Model.MaxNumSeqs)
	w("Workload: shared prefixes (%d/%d/%d tokens), %d groups per engine (so the resident set grows with the fleet), each request's group chosen uniformly at random, Poisson arrivals at the variant's load × the fleet's no-hit capacity, %d requests per run; KV cache per engine by the same rule as section 1 (ρ = %.2f). Times are simulated seconds; the gateway's CPU figures are host time of this process (single-threaded, on a shared machine) and index memory is the heap the collector frees when the index is dropped.\n\n",
		p.Workload.SystemTokens, p.Workload.QuestionTokens, p.Workload.OutputTokens, p.GroupsPerEngine, p.Requests, p.Rho)
	for _, pl := range plots {
		w("![%s](%s)\n\n", strings.TrimSuffix(pl, ".svg"), filepath.ToSlash(filepath.Join(plotsRel, pl)))
	}
	w("| engines | variant | groups | rate req/s | completed | 503 | hit rate | TTFT p50 | p90 | p99 | parked p90 | free slots when refused | output tok/s | decision µs mean / p99 | events µs/request | index | sim wall |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range f.Runs {
		cost, ev, idx := "–", "–", "–"
		if r.Policy == "llm" {
			cost = fmt.Sprintf("%.1f / %.1f", r.DecisionNs.Mean/1000, r.DecisionNs.P99/1000)
			ev = fmt.Sprintf("%.1f", r.EventUsPerReq)
			idx = fmt.Sprintf("%.1f MiB, %d blocks", float64(r.IndexBytes)/(1<<20), r.IndexBlocks)
		}
		idle := "–"
		if r.Refusals > 0 {
			idle = fmt.Sprintf("%.1f (%d refusals)", r.IdleWhenRefused, r.Refusals)
		}
		w("| %d | `%s` | %d | %.0f | %d | %d | %.1f%% | %s | %s | %s | %s | %s | %.0f | %s | %s | %s | %.0f s |\n",
			r.Engines, r.Variant, r.Groups, r.Rate, r.Completed, r.Rejected, r.HitRate*100, secs(r.TTFT.P50), secs(r.TTFT.P90), secs(r.TTFT.P99), secs(r.Park.P90), idle, r.OutputTPS, cost, ev, idx, r.WallSeconds)
	}
	w("\n")
	for _, r := range f.Runs {
		if r.MirrorProblems > 0 {
			w("- **%d engines: the mirrors counted %d unchainable, malformed or undecodable events** — the model's events and the index disagree somewhere.\n", r.Engines, r.MirrorProblems)
		}
	}
	renderBursts(b, p, f.Bursts)
	renderFleetScenarios(b, p, f.Scenarios)
	renderCPUTier(b, p, f.CPUTier)
	w("Reading it: the decision is `Fleet.Place` (plus `Fleet.Route` for a request admission did not place): the candidates' load snapshot, hashing the prompt into block keys and matching them (proportional to prompt blocks, and to engines ÷ 64 per block), and `routing.Pick` over N candidates; event upkeep is per stored or evicted block, so it grows with the miss rate rather than with N. Memory is the mirrors' blocks (N × KV blocks at most) plus the index's key table.\n\n")
}

func renderOverhead(b *strings.Builder, o *OverheadResult, sf SectionFile, plotsRel string, plots []string) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p := o.Params
	w("## 4. Gateway overhead: `llm_admission` + `lb_policy llm` vs plain Caddy\n\n")
	w("Command: `%s` (%s of this run).\n\n", sf.rerun("overhead"), time.Duration(sf.Seconds*float64(time.Second)).Round(time.Second))
	w("%s", overheadIntro(o))
	for _, pl := range plots {
		w("![%s](%s)\n\n", strings.TrimSuffix(pl, ".svg"), filepath.ToSlash(filepath.Join(plotsRel, pl)))
	}
	w("| request | target | requests | req/s | latency p50 | p99 | added p50 / p99 vs plain | 1 client: p50 (added) | Caddy CPU/request | CPU vs plain by round: median (range) | RSS (peak) | errors |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, body := range p.Bodies {
		plain := o.find(body.Name, "plain")
		for _, t := range o.targets() {
			s := o.find(body.Name, t)
			if s == nil {
				continue
			}
			added, cpu, rss := "", "–", "–"
			if isGateway(t) && plain != nil {
				added = fmt.Sprintf("%+.2f / %+.2f ms", (s.Latency.P50-plain.Latency.P50)*1000, (s.Latency.P99-plain.Latency.P99)*1000)
			}
			serial := "–"
			if s.SerialLatency.N > 0 {
				serial = fmt.Sprintf("%.2f ms", s.SerialLatency.P50*1000)
				if isGateway(t) && plain != nil && plain.SerialLatency.N > 0 {
					serial += fmt.Sprintf(" (%+.2f)", (s.SerialLatency.P50-plain.SerialLatency.P50)*1000)
				}
			}
			byRound := "–"
			if plain != nil && isGateway(t) {
				if r, ok := cpuVsPlain(s, plain); ok {
					byRound = r.ratio()
				}
			}
			if t != "direct" {
				cpu = fmt.Sprintf("%.0f µs", s.CPUPerReq)
				rss = fmt.Sprintf("%.0f MiB (%.0f)", float64(s.RSS)/(1<<20), float64(s.PeakRSS)/(1<<20))
			}
			w("| %s | %s | %d | %.0f | %.2f ms | %.2f ms | %s | %s | %s | %s | %s | %d |\n", o.bodyLabel(body), t, s.Requests, s.ReqPerSec, s.Latency.P50*1000, s.Latency.P99*1000, added, serial, cpu, byRound, rss, s.Errors)
		}
	}
	renderLayers(b, o)
	renderCPUParts(b, o)
	for _, body := range p.Bodies {
		for _, t := range o.targets()[2:] {
			if !isProduct(t) {
				continue // the layers' and the earlier build's profiles are saved, not shown
			}
			if s := o.find(body.Name, t); s != nil && len(s.Profile) > 0 {
				w("\nWhere the `%s` gateway's CPU went during one %s phase (`go tool pprof -top -cum` of a profile taken through Caddy's admin API, lines of this module and encoding/json; flat, flat%%, sum%%, cum, cum%%):\n\n```\n%s\n```\n", t, body.Name, strings.Join(s.Profile, "\n"))
			}
		}
	}
	w("\nOn %s the load generator, the engines and Caddy compete for the same CPUs, so req/s is a property of the whole machine; the CPU per request of the Caddy process is the number that carries over to a dedicated gateway host.\n\n", plural(sf.Machine.CPUs, "shared core"))
}

// layers stack the section's gateways from plain Caddy up, each adding one
// part of the precise path to the one below it.
var layers = []struct{ name, below, adds string }{
	{"admission", "plain", "the llm app and `llm_admission`"},
	{"approx", "admission", "`lb_policy llm`, approximate tree only"},
	{"llm-local", "approx", "KV events and the precise tier, local tokenizer"},
	{"llm", "approx", "KV events and the precise tier, `/tokenize`"},
}

// renderLayers writes what each layer adds to the CPU per request of the
// one below it, over all rounds and round by round (the difference of the
// two in the same round), and where it stands against plain Caddy.
func renderLayers(b *strings.Builder, o *OverheadResult) {
	var rows []string
	for _, body := range o.Params.Bodies {
		plain := o.find(body.Name, "plain")
		for _, l := range layers {
			s, below := o.find(body.Name, l.name), o.find(body.Name, l.below)
			if s == nil || below == nil || plain == nil || plain.CPUPerReq == 0 {
				continue
			}
			step := "–"
			if r, ok := pairRounds(s.CPURounds, below.CPURounds, func(x, p float64) float64 { return x - p }); ok {
				step = r.micros()
			}
			rows = append(rows, fmt.Sprintf("| %s | `%s` over `%s`: %s | %+.0f µs | %s | %.0f µs, %.2f× plain |\n",
				body.Name, l.name, l.below, l.adds, s.CPUPerReq-below.CPUPerReq, step, s.CPUPerReq, s.CPUPerReq/plain.CPUPerReq))
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "\nLayer by layer: the Caddy CPU per request each layer adds to the one below it, over all rounds and round by round (the two phases of a round ran seconds apart), and the layer's own figure:\n\n| request | layer | CPU/request added | the same, round by round: median (range) | the layer's CPU/request |\n|---|---|---:|---:|---:|\n%s", strings.Join(rows, ""))
}

// layersFinding is the headline's sentence on the layers below the precise
// path, for the last body the run measured them on (the bodies go from the
// smallest up); "" without them.
func layersFinding(o *OverheadResult) string {
	for i := len(o.Params.Bodies) - 1; i >= 0; i-- {
		name := o.Params.Bodies[i].Name
		plain, adm, apx := o.find(name, "plain"), o.find(name, "admission"), o.find(name, "approx")
		if plain == nil || adm == nil || apx == nil || plain.CPUPerReq == 0 {
			continue
		}
		return fmt.Sprintf(" Of the %s figures, `llm_admission` alone (round robin) takes %.2f× plain Caddy's CPU per request and with `lb_policy llm` on the approximate tree (no tokens, no KV events) %.2f×: the rest is the precise tier's.",
			name, adm.CPUPerReq/plain.CPUPerReq, apx.CPUPerReq/plain.CPUPerReq)
	}
	return ""
}

// renderCPUParts writes, for each body, the CPU per request of each
// profiled Caddy (an earlier build's left out) by part of the request path.
func renderCPUParts(b *strings.Builder, o *OverheadResult) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	for _, body := range o.Params.Bodies {
		var cols []*OverheadStat
		for _, t := range o.targets() {
			if s := o.find(body.Name, t); s != nil && len(s.CPUParts) == len(cpuParts) && !strings.HasSuffix(t, beforeSuffix) {
				cols = append(cols, s)
			}
		}
		if len(cols) == 0 {
			continue
		}
		w("\nWhere the CPU of each Caddy went per %s request, in µs, during one phase (its CPU profile, sampled at 100 Hz: a part below about %.1f µs is within one sample of nothing; indented rows are within the row above):\n\n| part |", body.Name, 1e4/float64(max(1, fewestProfiled(cols))))
		for _, s := range cols {
			w(" %s |", s.Target)
		}
		w("\n|---|%s\n", strings.Repeat("---:|", len(cols)))
		for i, p := range cpuParts {
			w("| %s |", strings.ReplaceAll(p.name, "  ", "&nbsp;&nbsp;"))
			for _, s := range cols {
				w(" %.1f |", s.CPUParts[i].PerReq)
			}
			w("\n")
		}
	}
}

// fewestProfiled is the smallest number of requests a column's profiled
// phase served: there one sample weighs the most per request.
func fewestProfiled(cols []*OverheadStat) int {
	n := cols[0].ProfiledRequests
	for _, s := range cols[1:] {
		n = min(n, s.ProfiledRequests)
	}
	return n
}
