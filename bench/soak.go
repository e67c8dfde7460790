package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The soak section: caddymodule's TestReliabilitySoak (a long mixed load
// through the gateway while engines restart, cut streams and the config
// reloads) run as a subprocess against the gateway binary built from this
// checkout, so the goroutines and RSS it reports are the gateway's own.
// The test writes its figures as JSON (LLMGW_SOAK_OUT); the section keeps
// them, or the end of the test's output when it failed.

// SoakParams configure the section.
type SoakParams struct {
	// Duration is the load's length (LLMGW_SOAK).
	Duration time.Duration `json:"duration_ns"`
	Test     string        `json:"test"`
	Package  string        `json:"package"`
}

// timeout is go test's -timeout: the load plus the test's setup, drain
// and settling, and compiling the package.
func (p SoakParams) timeout() time.Duration { return p.Duration + 15*time.Minute }

// args are go test's arguments.
func (p SoakParams) args() []string {
	return []string{"test", "-v", "-run", "^" + p.Test + "$", "-count=1", "-timeout", p.timeout().String(), p.Package}
}

// SoakResult is the section's output.
type SoakResult struct {
	Params SoakParams `json:"params"`
	// Command is the go test command line, with the environment that
	// matters (the binary's and the output's temporary paths elided).
	Command string `json:"command"`
	// Passed reports that the test passed and its figures were read.
	Passed bool `json:"passed"`
	// Problem says why the section failed; Tail is the end of the test's
	// output (Caddy's JSON log lines left out).
	Problem string   `json:"problem,omitempty"`
	Tail    []string `json:"tail,omitempty"`
	// Run is the test's figures (absent when it wrote none).
	Run *SoakRun `json:"run,omitempty"`
}

// SoakRun is the JSON TestReliabilitySoak writes to LLMGW_SOAK_OUT.
type SoakRun struct {
	Duration   string         `json:"duration"`
	Mode       string         `json:"mode"`
	GOMAXPROCS int            `json:"gomaxprocs"`
	Workers    int            `json:"workers"`
	Setup      *SoakSetup     `json:"setup"`
	Restarts   int            `json:"restarts"`
	Cuts       int            `json:"cuts"` // stream-cut episodes
	Reloads    int            `json:"reloads"`
	Requests   int            `json:"requests"`
	Outcomes   map[string]int `json:"outcomes"`
	Minutes    []SoakMinute   `json:"minutes"`
	Gauges     []SoakGauge    `json:"gauges"`
	// Idle is the gauge taken once the gateway's idle keep-alive
	// connections timed out after the load (full-length soaks of a Caddy
	// binary only); nil when not taken.
	Idle   *SoakGauge `json:"idle,omitempty"`
	Events []string   `json:"events"`
}

// SoakSetup is the configuration the test ran with, as it wrote it
// (soakSetup in caddymodule/reliability_soak_test.go), so that the report
// states what ran: a short soak's schedule is scaled to its length.
type SoakSetup struct {
	Engines       int           `json:"engines"`
	MaxNumSeqs    int           `json:"max_num_seqs"`
	TimeScale     float64       `json:"time_scale"`
	MaxInflight   int           `json:"max_inflight"`
	MaxPark       time.Duration `json:"max_park_ns"`
	QueueSize     int           `json:"queue_size"`
	Heartbeat     time.Duration `json:"heartbeat_ns"`
	PollInterval  time.Duration `json:"poll_interval_ns"`
	LBRetries     int           `json:"lb_retries"`
	Workers       int           `json:"workers"`
	Conversations int           `json:"conversations"`
	CutAfter      int           `json:"cut_after_tokens"`
	Schedule      SoakSchedule  `json:"schedule"`
	Limits        SoakLimits    `json:"limits"`
}

// SoakSchedule is when the soak injected its faults and gauged the gateway.
type SoakSchedule struct {
	RestartEvery time.Duration `json:"restart_every_ns"`
	CutEvery     time.Duration `json:"cut_every_ns"`
	CutFor       time.Duration `json:"cut_for_ns"`
	ReloadEvery  time.Duration `json:"reload_every_ns"`
	GaugeEvery   time.Duration `json:"gauge_every_ns"`
}

// SoakLimits are the most goroutines and RSS the test allowed the gateway
// once the load was over, derived from the gauge before the load.
type SoakLimits struct {
	Goroutines float64 `json:"max_goroutines"`
	RSSMiB     float64 `json:"max_rss_mib"`
	// IdleSlack and IdleWait bound the idle gauge (SoakRun.Idle): the
	// goroutines it may differ from the count before the load by, and
	// the longest wait for idle connections to time out.
	IdleSlack float64       `json:"idle_goroutine_slack"`
	IdleWait  time.Duration `json:"idle_wait_ns"`
}

// check refuses a setup the report cannot describe.
func (c *SoakSetup) check() error {
	if c == nil {
		return errors.New("no setup (written by an older TestReliabilitySoak?)")
	}
	if c.Engines <= 0 || c.MaxNumSeqs <= 0 || c.TimeScale <= 0 || c.MaxInflight <= 0 || c.Workers <= 0 || c.Conversations <= 0 || c.CutAfter <= 0 {
		return fmt.Errorf("setup: a count is not positive: %+v", *c)
	}
	if c.MaxPark <= 0 || c.Heartbeat <= 0 || c.PollInterval <= 0 {
		return fmt.Errorf("setup: max_park %v, heartbeat %v, poll_interval %v: want positive durations", c.MaxPark, c.Heartbeat, c.PollInterval)
	}
	sc := c.Schedule
	if sc.RestartEvery <= 0 || sc.CutEvery <= 0 || sc.CutFor <= 0 || sc.ReloadEvery <= 0 || sc.GaugeEvery <= 0 {
		return fmt.Errorf("setup: schedule %+v: want positive intervals", sc)
	}
	if c.Limits.Goroutines <= 0 || c.Limits.RSSMiB <= 0 {
		return fmt.Errorf("setup: limits %+v: want positive bounds", c.Limits)
	}
	return nil
}

// SoakMinute is one minute of the soak: the requests that ended in it.
// Latencies are in wall milliseconds, of served requests only.
type SoakMinute struct {
	Minute   int            `json:"minute"`
	Requests int            `json:"requests"`
	Outcomes map[string]int `json:"outcomes"`
	P50TTFT  float64        `json:"p50_ttft_ms"`
	P99TTFT  float64        `json:"p99_ttft_ms"`
	P99Total float64        `json:"p99_total_ms"`
}

// SoakGauge is the gateway's goroutines and RSS at one moment.
type SoakGauge struct {
	At         string  `json:"at"` // since the load started, a Go duration
	Goroutines float64 `json:"goroutines"`
	RSSMiB     float64 `json:"rss_mib"`
	// Held counts goroutines by entry function, before and after the
	// load (internal/testutil/goroutines).
	Held map[string]int `json:"held,omitempty"`
	// StepMs and ScrapeLeadMs are each engine's step time and local
	// accounting's scrape lead from /llm/engines, in milliseconds.
	StepMs       []float64 `json:"step_ms,omitempty"`
	ScrapeLeadMs []float64 `json:"scrape_lead_ms,omitempty"`
}

// maxSoakJSON bounds the test's JSON: a 10-minute soak writes a few KiB.
const maxSoakJSON = 16 << 20

// readSoakRun decodes and checks the test's JSON, so a report is never
// rendered from figures that do not add up.
func readSoakRun(r io.Reader) (*SoakRun, error) {
	dec := json.NewDecoder(io.LimitReader(r, maxSoakJSON+1))
	var run SoakRun
	if err := dec.Decode(&run); err != nil {
		return nil, fmt.Errorf("soak figures: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("soak figures: data after the JSON object (or larger than 16 MiB)")
	}
	if err := run.check(); err != nil {
		return nil, fmt.Errorf("soak figures: %w", err)
	}
	return &run, nil
}

// check refuses figures that do not add up, or that lack the setup the
// report describes.
func (r *SoakRun) check() error {
	d, err := time.ParseDuration(r.Duration)
	if err != nil || d <= 0 {
		return fmt.Errorf("duration %q is not a positive duration", r.Duration)
	}
	if err := r.Setup.check(); err != nil {
		return err
	}
	if r.Workers != r.Setup.Workers {
		return fmt.Errorf("%d workers, but the setup says %d", r.Workers, r.Setup.Workers)
	}
	if r.Restarts < 0 || r.Cuts < 0 || r.Reloads < 0 {
		return fmt.Errorf("negative fault counts: %d restarts, %d cuts, %d reloads", r.Restarts, r.Cuts, r.Reloads)
	}
	if r.Requests <= 0 {
		return fmt.Errorf("%d requests", r.Requests)
	}
	if sum, err := sumOutcomes(r.Outcomes); err != nil {
		return err
	} else if sum != r.Requests {
		return fmt.Errorf("outcomes add up to %d, not the %d requests", sum, r.Requests)
	}
	if err := r.checkMinutes(); err != nil {
		return err
	}
	return r.checkGauges()
}

// checkMinutes: the windows are in order and add up.
func (r *SoakRun) checkMinutes() error {
	if len(r.Minutes) == 0 {
		return errors.New("no per-minute windows")
	}
	inMinutes := 0
	for i, m := range r.Minutes {
		if m.Minute < 0 || (i > 0 && m.Minute <= r.Minutes[i-1].Minute) {
			return fmt.Errorf("minute %d out of order", m.Minute)
		}
		sum, err := sumOutcomes(m.Outcomes)
		if err != nil {
			return fmt.Errorf("minute %d: %w", m.Minute, err)
		}
		if sum != m.Requests {
			return fmt.Errorf("minute %d: outcomes add up to %d, not its %d requests", m.Minute, sum, m.Requests)
		}
		if m.P50TTFT < 0 || m.P99TTFT < m.P50TTFT || m.P99Total < 0 {
			return fmt.Errorf("minute %d: impossible latencies (TTFT p50 %v, p99 %v ms)", m.Minute, m.P50TTFT, m.P99TTFT)
		}
		inMinutes += m.Requests
	}
	// Requests still draining after the last window are counted in the
	// totals only.
	if inMinutes > r.Requests {
		return fmt.Errorf("the minutes hold %d requests, the totals %d", inMinutes, r.Requests)
	}
	return nil
}

// checkGauges: the start and the end at least, in time order, positive.
func (r *SoakRun) checkGauges() error {
	if len(r.Gauges) < 2 {
		return fmt.Errorf("%d gauges (want the start and the end at least)", len(r.Gauges))
	}
	var last time.Duration
	for i, g := range r.Gauges {
		at, err := time.ParseDuration(g.At)
		if err != nil || at < 0 || (i > 0 && at < last) {
			return fmt.Errorf("gauge %d: time %q not a duration after the previous one", i, g.At)
		}
		last = at
		if g.Goroutines <= 0 || g.RSSMiB <= 0 {
			return fmt.Errorf("gauge at %s: %v goroutines, %v MiB RSS", g.At, g.Goroutines, g.RSSMiB)
		}
	}
	return nil
}

func sumOutcomes(o map[string]int) (int, error) {
	sum := 0
	for k, n := range o {
		if n < 0 {
			return 0, fmt.Errorf("outcome %s: negative count %d", k, n)
		}
		sum += n
	}
	return sum, nil
}

// duration is the load's length; check has vouched for it.
func (r *SoakRun) duration() time.Duration {
	d, _ := time.ParseDuration(r.Duration)
	return d
}

// external reports that the gateway was a separate Caddy process, so the
// goroutines and RSS are its own rather than the whole test process's.
func (r *SoakRun) external() bool { return strings.HasPrefix(r.Mode, "Caddy binary") }

// at is a gauge's time since the load started.
func (g SoakGauge) at() time.Duration {
	d, _ := time.ParseDuration(g.At)
	return d
}

// runSoak runs the soak test against env.Caddy. A failing test is a
// result (Passed false, with the reason and the end of its output), not
// an error: errors are for a soak that could not be run at all.
func runSoak(ctx context.Context, env *Env, p SoakParams, tmp string) (*SoakResult, error) {
	dir, err := os.MkdirTemp(tmp, "soak-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	out := filepath.Join(dir, "soak.json")
	adminPort, err := freePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	vars := []string{
		"LLMGW_SOAK=" + p.Duration.String(),
		"LLMGW_SOAK_CADDY=" + env.Caddy,
		"LLMGW_SOAK_OUT=" + out,
		"XDG_CONFIG_HOME=" + dir,
		"XDG_DATA_HOME=" + dir,
		// The test's temporary directories go under the harness's, which
		// is removed even when a cancelled test could not clean up.
		"TMPDIR=" + dir,
		fmt.Sprintf("LLMGW_TEST_ADMIN_PORT=%d", adminPort),
		fmt.Sprintf("LLMGW_TEST_HTTP_PORT=%d", httpPort),
	}
	res := &SoakResult{
		Params: p,
		Command: fmt.Sprintf("LLMGW_SOAK=%s LLMGW_SOAK_CADDY=<go build ./cmd/caddy> LLMGW_SOAK_OUT=<file> go %s",
			p.Duration, strings.Join(quoteArgs(p.args()), " ")),
	}
	log.Printf("soak: %s for %s (go test, gateway %s)", p.Test, p.Duration, env.Caddy)
	cmd := exec.CommandContext(ctx, "go", p.args()...)
	cmd.Dir = env.Root
	// Later entries win, so these override any the harness inherited.
	cmd.Env = append(os.Environ(), vars...)
	lines := &lineLog{prefix: "soak: ", keep: 40}
	cmd.Stdout, cmd.Stderr = lines, lines
	// The test binary and the Caddy process it starts share go's process
	// group, so cancelling (and cleaning up after a crashed test) reaches
	// them all; the kernel ends go if the harness dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	runErr := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever a crashed test left behind
	}
	lines.flush()
	res.Tail = lines.tail()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if runErr != nil {
		res.Problem = fmt.Sprintf("go test %s failed: %v", p.Test, runErr)
	}
	f, err := os.Open(out)
	if err != nil {
		if res.Problem == "" {
			res.Problem = fmt.Sprintf("the test wrote no figures (%v) — was it skipped or renamed?", err)
		}
		return res, nil
	}
	defer f.Close()
	run, err := readSoakRun(f)
	if err != nil {
		if res.Problem == "" {
			res.Problem = err.Error()
		}
		return res, nil
	}
	res.Run = run
	res.Passed = res.Problem == ""
	if res.Passed {
		res.Tail = nil // the figures say it all
	}
	return res, nil
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, "^$ *") {
			a = "'" + a + "'"
		}
		out[i] = a
	}
	return out
}

// lineLog is an io.Writer that logs a subprocess's output line by line,
// leaving out JSON lines (the gateway's and engines' structured logs),
// and keeps the last few lines for the report. Lines are cut at
// maxLogLine so a runaway writer cannot grow it.
type lineLog struct {
	prefix string
	keep   int

	mu    sync.Mutex
	buf   []byte
	long  bool // inside a line already cut at maxLogLine
	lines []string
}

const maxLogLine = 4 << 10

// Write implements io.Writer.
func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		take := min(maxLogLine-len(l.buf), len(chunk))
		l.buf = append(l.buf, chunk[:take]...)
		if take < len(chunk) {
			l.long = true
		}
		if i < 0 {
			break
		}
		l.emit()
		p = p[i+1:]
	}
	return n, nil
}

// emit logs the buffered line; the caller holds mu.
func (l *lineLog) emit() {
	line := strings.TrimRight(string(l.buf), "\r")
	if l.long {
		line += " …"
	}
	l.buf, l.long = l.buf[:0], false
	if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "{") {
		return
	}
	log.Printf("%s%s", l.prefix, line)
	l.lines = append(l.lines, line)
	if len(l.lines) > l.keep {
		l.lines = l.lines[len(l.lines)-l.keep:]
	}
}

// flush emits a last line without a newline.
func (l *lineLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emit()
	}
}

// tail returns the kept lines.
func (l *lineLog) tail() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}
