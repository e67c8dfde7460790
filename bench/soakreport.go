package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/llmgw/caddy-llmgw/internal/testutil/goroutines"
)

// The soak's part of the report: section 5, its line in the findings and
// its plots, all from the figures TestReliabilitySoak wrote.

// soakOutcome describes one way a soak request can end, in the test's
// words (soakRequest in caddymodule/reliability_soak_test.go).
type soakOutcome struct {
	key, label, meaning string
	// explained: a fault the soak injects (or the soak itself) accounts
	// for it; the test fails on any other outcome.
	explained bool
}

var soakOutcomes = []soakOutcome{
	{"ok", "served", "completed: a stream reached `data: [DONE]`, or a non-streaming 200 was read to its end", true},
	{"client_left", "client left", "the client closed its stream after 3 tokens, on purpose (one stream in ten)", true},
	{"sse_error_event", "SSE error event", "the stream ended with the gateway's `event: error`: its engine restarted or cut the stream after the response (or a parked request's SSE heartbeats) had started, so the error could only be reported in-band", true},
	{"http_502", "502", "no engine could take the request: the chosen ones were down (restarting) and the retries were spent", true},
	{"http_503", "503", "admission refused it: the park queue was full, or it waited longer than max_park", true},
	{"keepalive_race", "keep-alive race", "a config reload closed the idle keep-alive connection the request was sent on before the server read it; HTTP clients retry these", true},
	{"reload_reset", "reset by a reload", "a new connection reset or closed before any response while a config reload ran: Caddy binds each config's listener anew (SO_REUSEPORT) and the kernel resets connections queued on the old one; plain Caddy does the same, and clients retry these", true},
	{"shutdown", "cut at the end", "still in flight when the soak's time ran out", true},
	{"transport_error", "transport error", "the connection failed with no injected fault to explain it", false},
	{"stream_cut", "stream cut", "the stream's connection broke without an `event: error`", false},
	{"stream_truncated", "stream truncated", "the stream ended cleanly but without `[DONE]` or an error event", false},
	{"body_error", "body error", "a non-streaming response's body failed", false},
}

func soakOutcomeInfo(key string) soakOutcome {
	for _, o := range soakOutcomes {
		if o.key == key {
			return o
		}
	}
	if strings.HasPrefix(key, "http_") {
		return soakOutcome{key, strings.TrimPrefix(key, "http_"), "an HTTP status no fault of the soak explains", false}
	}
	return soakOutcome{key, key, "an outcome this report does not know", false}
}

// orderedOutcomes lists the keys of o in the order of soakOutcomes, then
// any others sorted.
func orderedOutcomes(o map[string]int) []string {
	var keys []string
	known := map[string]bool{}
	for _, so := range soakOutcomes {
		known[so.key] = true
		if _, ok := o[so.key]; ok {
			keys = append(keys, so.key)
		}
	}
	var rest []string
	for k := range o {
		if !known[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	return append(keys, rest...)
}

// unexplained counts the requests that ended in a way no fault explains.
func (r *SoakRun) unexplained() int {
	n := 0
	for k, v := range r.Outcomes {
		if !soakOutcomeInfo(k).explained {
			n += v
		}
	}
	return n
}

// minuteKind says whether minute m of the soak was entirely under load,
// partly, or after the end (requests draining).
func (r *SoakRun) minuteKind(m int) string {
	d := r.duration()
	switch start, end := time.Duration(m)*time.Minute, time.Duration(m+1)*time.Minute; {
	case end <= d:
		return "full"
	case start < d:
		return "partial"
	default:
		return "after"
	}
}

// fullMinutes are the windows entirely under load.
func (r *SoakRun) fullMinutes() []SoakMinute {
	var out []SoakMinute
	for _, m := range r.Minutes {
		if r.minuteKind(m.Minute) == "full" {
			out = append(out, m)
		}
	}
	return out
}

// gaugeFor is the last gauge taken within minute m (a gauge on the
// minute's closing second belongs to it, with 2 s for the ticker's
// lateness), or nil.
func (r *SoakRun) gaugeFor(m int) *SoakGauge {
	lo, hi := time.Duration(m)*time.Minute+2*time.Second, time.Duration(m+1)*time.Minute+2*time.Second
	var g *SoakGauge
	for i := range r.Gauges {
		if at := r.Gauges[i].at(); at > lo && at <= hi {
			g = &r.Gauges[i]
		}
	}
	return g
}

// wallMS formats a wall latency given in milliseconds.
func wallMS(v float64) string {
	switch {
	case v == 0:
		return "–"
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	default:
		return fmt.Sprintf("%.1f ms", v)
	}
}

// plural is "n thing" or "n things".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

func pctOf(n, total int) float64 {
	if total == 0 {
		return 0
	}
	return float64(n) / float64(total) * 100
}

// soakFinding is the soak's line in the report's findings.
func soakFinding(s *SoakResult) string {
	if !s.Passed || s.Run == nil {
		return fmt.Sprintf("**The soak failed** (section 5): %s.", strings.TrimSuffix(s.Problem, "."))
	}
	r := s.Run
	first, last := r.Gauges[0], r.Gauges[len(r.Gauges)-1]
	var ttft string
	if full := r.fullMinutes(); len(full) > 1 {
		ttft = fmt.Sprintf("; TTFT p99 %s in the first minute, %s in the last full one", wallMS(full[0].P99TTFT), wallMS(full[len(full)-1].P99TTFT))
	}
	clean := "every one ended in a way the injected faults explain"
	if n := r.unexplained(); n > 0 {
		clean = fmt.Sprintf("**%d ended in a way no fault explains**", n)
	}
	return fmt.Sprintf("**Under a %s soak** (mixed load with %s, %s and %s): %d requests, %.1f%% served, %s%s; the gateway's goroutines %.0f → %.0f and RSS %.0f → %.0f MiB from before the load to after it.",
		r.duration(), plural(r.Restarts, "engine restart"), plural(r.Cuts, "stream-cut episode"), plural(r.Reloads, "config reload"), r.Requests, pctOf(r.Outcomes["ok"], r.Requests), clean, ttft,
		first.Goroutines, last.Goroutines, first.RSSMiB, last.RSSMiB)
}

func renderSoak(b *strings.Builder, s *SoakResult, f SectionFile, plotsRel string, plots []string) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 5. Soak: mixed load while engines restart and the config reloads\n\n")
	rerun := f.rerun("soak")
	if s.Params.Duration > 0 && s.Params.Duration != soakDuration(f.Quick) {
		rerun = fmt.Sprintf("BENCH_SOAK=%s %s", s.Params.Duration, rerun)
	}
	w("Command: `%s` (%s of this run), which builds the gateway (`go build ./cmd/caddy`) and runs\n\n```sh\n%s\n```\n\n",
		rerun, time.Duration(f.Seconds*float64(time.Second)).Round(time.Second), s.Command)
	m := f.Machine
	w("Machine: %d × %s, %s, %s; load average at the end of the soak: %s (shared with other jobs).\n\n", m.CPUs, m.CPUModel, m.GoVersion, m.OS, m.Load)
	if !s.Passed || s.Run == nil {
		w("**The soak failed: %s.** A failed soak's figures are not shown; the end of the test's output (the gateway's JSON logs left out):\n\n```\n%s\n```\n\n",
			strings.TrimSuffix(s.Problem, "."), strings.Join(s.Tail, "\n"))
		return
	}
	r := s.Run
	w("%s\n\n", soakSetupText(r))
	w("**%d requests** in %s (%.1f served per second), by how they ended:\n\n", r.Requests, r.duration(), float64(r.Outcomes["ok"])/r.duration().Seconds())
	w("| outcome | requests | share | what it means |\n|---|---:|---:|---|\n")
	for _, k := range orderedOutcomes(r.Outcomes) {
		info := soakOutcomeInfo(k)
		label, meaning := info.label, info.meaning
		if !info.explained {
			label, meaning = "**"+label+"**", meaning+" — the test fails on it"
		}
		w("| %s (`%s`) | %d | %.2f%% | %s |\n", label, k, r.Outcomes[k], pctOf(r.Outcomes[k], r.Requests), meaning)
	}
	w("\n")

	for _, pl := range plots {
		w("![%s](%s)\n\n", strings.TrimSuffix(pl, filepath.Ext(pl)), filepath.ToSlash(filepath.Join(plotsRel, pl)))
	}
	others := orderedOutcomes(r.Outcomes)
	if len(others) > 0 && others[0] == "ok" {
		others = others[1:]
	}
	w("Per minute (requests counted in the minute they ended; goroutines and RSS from the last gauge taken in the minute, one every %s):\n\n| minute | requests | served |", every(r.Setup.Schedule.GaugeEvery))
	for _, k := range others {
		w(" %s |", soakOutcomeInfo(k).label)
	}
	w(" TTFT p50 | TTFT p99 | total p99 | goroutines | RSS | gauge at |\n|---|---:|---:|%s---:|---:|---:|---:|---:|---:|\n", strings.Repeat("---:|", len(others)))
	for _, mm := range r.Minutes {
		label := fmt.Sprint(mm.Minute)
		switch r.minuteKind(mm.Minute) {
		case "partial":
			label += fmt.Sprintf(" (partial, %s)", r.duration()-time.Duration(mm.Minute)*time.Minute)
		case "after":
			label += " (after the end)"
		}
		w("| %s | %d | %d |", label, mm.Requests, mm.Outcomes["ok"])
		for _, k := range others {
			w(" %d |", mm.Outcomes[k])
		}
		gor, rss, at := "–", "–", "–"
		if g := r.gaugeFor(mm.Minute); g != nil {
			gor, rss, at = fmt.Sprintf("%.0f", g.Goroutines), fmt.Sprintf("%.1f MiB", g.RSSMiB), g.At
		}
		w(" %s | %s | %s | %s | %s | %s |\n", wallMS(mm.P50TTFT), wallMS(mm.P99TTFT), wallMS(mm.P99Total), gor, rss, at)
	}
	w("\n**Drift.** %s\n\n", soakDrift(r))
	first, last, lim := r.Gauges[0], r.Gauges[len(r.Gauges)-1], r.Setup.Limits
	w("The test passed: every request ended in one of the outcomes the faults explain, at least 80%% were served, every scheduled fault happened, and after the load the gateway had %.0f goroutines and %.1f MiB RSS, within the bounds the test derived from its %.0f and %.1f MiB before the load (at most %.0f goroutines and %.1f MiB).\n\n",
		last.Goroutines, last.RSSMiB, first.Goroutines, first.RSSMiB, lim.Goroutines, lim.RSSMiB)
	if g := r.Idle; g != nil {
		w("**Once idle.** After the load, the soak waited for the gateway's idle keep-alive connections to time out (at most %s): at %s it had %.0f goroutines, %+.0f from the %.0f before the load (the bound: ±%.0f). %s\n\n",
			lim.IdleWait, g.At, g.Goroutines, g.Goroutines-first.Goroutines, first.Goroutines, lim.IdleSlack, heldFinding(first.Held, g.Held))
	}
	if lead := soakLeadText(r); lead != "" {
		w("%s\n\n", lead)
	}
}

// soakLeadText states the scrape lead local accounting used under the
// load (the gauges after the first and before the last), and the step
// times it was sized from; "" when the gauges do not have them.
func soakLeadText(r *SoakRun) string {
	if len(r.Gauges) < 3 {
		return ""
	}
	var leads, steps []float64
	for _, g := range r.Gauges[1 : len(r.Gauges)-1] {
		leads = append(leads, g.ScrapeLeadMs...)
		steps = append(steps, g.StepMs...)
	}
	if len(leads) == 0 || len(steps) == 0 {
		return ""
	}
	return fmt.Sprintf("**Scrape lead.** Under the load, local accounting began each scrape's epoch %.1f–%.1f ms before the scrape (each engine at every gauge, from `/llm/engines`): two of the engine's steps, %.1f–%.1f ms as the gateway measured them, plus 5 ms.",
		slices.Min(leads), slices.Max(leads), slices.Min(steps), slices.Max(steps))
}

// soakSetupText describes the soak that ran, from the setup the test
// wrote: a short soak's schedule is not the 10-minute one's.
func soakSetupText(r *SoakRun) string {
	c, sc := r.Setup, r.Setup.Schedule
	gateway := "the gateway is the Caddy binary built from this checkout, in its own process, so its goroutines and RSS are its own (`go_goroutines` and `process_resident_memory_bytes` from its `/metrics`)"
	if !r.external() {
		gateway = "the gateway is Caddy inside the test process, so goroutines and RSS are the whole test process's (engines and load included)"
	}
	slots := c.Engines * c.MaxInflight
	park := fmt.Sprintf("%d slots for %d clients, so requests park in `llm_admission`", slots, r.Workers)
	if slots >= r.Workers {
		park = fmt.Sprintf("%d slots for %d clients, so requests rarely park in `llm_admission`", slots, r.Workers)
	}
	return fmt.Sprintf("[`TestReliabilitySoak`](caddymodule/reliability_soak_test.go) runs for **%s**: %d clients in a closed loop (each sends its next request as soon as its last one ends) through the gateway, in front of %s (max_num_seqs %d, %g× faster than real time, KV events over ZeroMQ) with `max_inflight %d` each: %s (`max_park %s`, `queue_size %d`, SSE heartbeats every %s). The llm app polls the engines every %s (`poll_interval`); the proxy retries a failed request up to %s (`lb_retries`). Three requests in four stream; half continue one of %d long conversations (a shared prefix), 15%% ask for the high or low band, the rest are one-off prompts. Faults: an engine restarts every %s (%s), one engine cuts its streams after %d tokens for %s every %s (%s), and the config is reloaded every %s (%s); goroutines and RSS are read every %s. GOMAXPROCS %d; %s. Latencies are wall times measured by the clients, of served requests only: TTFT is the time to a stream's first token or to a non-streaming response, including any time parked in admission; total is to the end of the response.",
		r.duration(), r.Workers, plural(c.Engines, "[`vllmsim`](internal/sim/vllmsim) engine"), c.MaxNumSeqs, c.TimeScale, c.MaxInflight, park,
		c.MaxPark, c.QueueSize, every(c.Heartbeat), every(c.PollInterval), plural(c.LBRetries, "time"), c.Conversations,
		every(sc.RestartEvery), plural(r.Restarts, "restart"), c.CutAfter, every(sc.CutFor), every(sc.CutEvery), plural(r.Cuts, "episode"),
		every(sc.ReloadEvery), plural(r.Reloads, "reload"), every(sc.GaugeEvery), r.GOMAXPROCS, gateway)
}

// every formats an interval of the soak's schedule: whole minutes as
// such, anything else in seconds to a tenth.
func every(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return plural(int(d/time.Minute), "minute")
	}
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return strconv.FormatFloat(d.Round(100*time.Millisecond).Seconds(), 'f', -1, 64) + " s"
}

// soakDrift compares the first and last minutes and the gateway at the
// start, under load and at the end, in words.
func soakDrift(r *SoakRun) string {
	var b strings.Builder
	full := r.fullMinutes()
	switch {
	case len(full) > 1:
		a, z := full[0], full[len(full)-1]
		peak := a
		for _, m := range full {
			if m.P99TTFT > peak.P99TTFT {
				peak = m
			}
		}
		change := "unchanged"
		if a.P99TTFT > 0 {
			change = fmt.Sprintf("%+.0f%%", (z.P99TTFT/a.P99TTFT-1)*100)
		}
		fmt.Fprintf(&b, "TTFT p99 was %s in minute %d and %s in minute %d, the last full one (%s; the worst full minute was %d, at %s); TTFT p50 %s → %s; served requests per minute %d → %d. ",
			wallMS(a.P99TTFT), a.Minute, wallMS(z.P99TTFT), z.Minute, change, peak.Minute, wallMS(peak.P99TTFT), wallMS(a.P50TTFT), wallMS(z.P50TTFT), a.Outcomes["ok"], z.Outcomes["ok"])
	case len(full) == 1:
		fmt.Fprintf(&b, "The soak had one full minute, so there is no drift between minutes to report: TTFT p99 %s, p50 %s. ", wallMS(full[0].P99TTFT), wallMS(full[0].P50TTFT))
	default:
		b.WriteString("The soak was shorter than a minute, so there is no drift between minutes to report. ")
	}
	first, last := r.Gauges[0], r.Gauges[len(r.Gauges)-1]
	peakG, peakR := first.Goroutines, first.RSSMiB
	for _, g := range r.Gauges {
		peakG, peakR = math.Max(peakG, g.Goroutines), math.Max(peakR, g.RSSMiB)
	}
	fmt.Fprintf(&b, "The gateway had %.0f goroutines and %.1f MiB RSS before the load", first.Goroutines, first.RSSMiB)
	if len(r.Gauges) > 2 {
		g := r.Gauges[1]
		fmt.Fprintf(&b, ", %.0f and %.1f MiB under load at %s", g.Goroutines, g.RSSMiB, g.At)
	}
	fmt.Fprintf(&b, " (at most %.0f and %.1f MiB in any gauge), and %.0f and %.1f MiB at %s, once the load had stopped and the clients had closed their connections: goroutines %+.0f and RSS %+.1f MiB over the whole soak.",
		peakG, peakR, last.Goroutines, last.RSSMiB, last.At, last.Goroutines-first.Goroutines, last.RSSMiB-first.RSSMiB)
	if first.Held != nil && last.Held != nil {
		b.WriteString(" " + heldFinding(first.Held, last.Held))
	}
	return b.String()
}

// heldFinding says what holds the goroutines the gateway had after the
// load and not before it, by entry function.
func heldFinding(before, after map[string]int) string {
	changes, conns, others := goroutines.Diff(before, after)
	parts := make([]string, len(changes))
	for i, c := range changes {
		parts[i] = fmt.Sprintf("%+d `%s`", c.N, c.Fn)
	}
	return fmt.Sprintf("By entry function (a goroutine dump before and after), the difference is %+d goroutines of open HTTP connections (idle keep-alive connections to the engines, kept up to 2 minutes by Caddy's transport, each a read and a write loop; the `/tokenize` client's hold none) and %+d others: %s.", conns, others, strings.Join(parts, ", "))
}

// plotSoak draws TTFT p50 and p99 per minute, and the gateway's RSS at
// every gauge.
func plotSoak(dir, ext string, r *SoakRun) ([]string, error) {
	tt := plot.New()
	tt.Title.Text = fmt.Sprintf("Soak: TTFT of served requests per minute (%s, wall ms)", r.duration())
	tt.X.Label.Text = "minute of the soak"
	tt.Y.Label.Text = "TTFT (ms, log scale)"
	// p50 and p99 are orders of magnitude apart (p99 includes parking).
	tt.Y.Scale = plot.LogScale{}
	tt.Y.Tick.Marker = logTicks{}
	var ticks []plot.Tick
	for _, m := range r.Minutes {
		ticks = append(ticks, plot.Tick{Value: float64(m.Minute), Label: fmt.Sprint(m.Minute)})
	}
	tt.X.Tick.Marker = plot.ConstantTicks(ticks)
	tt.Legend.Top, tt.Legend.Left = true, true
	for i, s := range []struct {
		name string
		y    func(SoakMinute) float64
	}{
		{"p50", func(m SoakMinute) float64 { return m.P50TTFT }},
		{"p99", func(m SoakMinute) float64 { return m.P99TTFT }},
	} {
		var xys plotter.XYs
		for _, m := range r.Minutes {
			if r.minuteKind(m.Minute) != "after" && m.Outcomes["ok"] > 0 {
				xys = append(xys, plotter.XY{X: float64(m.Minute), Y: math.Max(s.y(m), 0.1)})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		tt.Add(l, pts)
		tt.Legend.Add("TTFT "+s.name, l, pts)
	}
	tt.Add(plotter.NewGrid())
	tt.Y.Max *= 4 // room for the legend above the lines
	if err := tt.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, "soak_ttft"+ext)); err != nil {
		return nil, err
	}

	rss := plot.New()
	rss.Title.Text = "Soak: the gateway's RSS, before, under and after the load"
	rss.X.Label.Text = "minutes since the load started"
	rss.Y.Label.Text = "RSS (MiB)"
	var xys plotter.XYs
	for _, g := range r.Gauges {
		xys = append(xys, plotter.XY{X: g.at().Minutes(), Y: g.RSSMiB})
	}
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return nil, err
	}
	l.Color, pts.Color = plotutil.Color(2), plotutil.Color(2)
	rss.Add(l, pts, plotter.NewGrid())
	rss.Y.Min, rss.Y.Max = 0, rss.Y.Max*1.2
	if err := rss.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, "soak_rss"+ext)); err != nil {
		return nil, err
	}
	return []string{"soak_ttft" + ext, "soak_rss" + ext}, nil
}
