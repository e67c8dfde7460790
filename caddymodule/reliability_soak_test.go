package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
)

// The soak: a long mixed load through the gateway while engines restart
// periodically. It runs only when LLMGW_SOAK is set to a duration:
//
//	LLMGW_SOAK=10m go test -run TestReliabilitySoak -timeout 30m ./caddymodule
//
// With LLMGW_SOAK_CADDY=/path/to/caddy (go build -o /tmp/caddy ./cmd/caddy)
// the gateway is that binary in its own process, and its goroutines and
// RSS come from its own metrics; otherwise it is the in-process Caddy and
// the figures are the whole test process's (engines and load included).
// LLMGW_SOAK_OUT=file.json writes the figures as JSON.

// soakSample is one finished request of the soak.
type soakSample struct {
	at      time.Duration // since the start, when it ended
	ttft    time.Duration // to the first token (streams) or the response (others)
	total   time.Duration
	outcome string
}

// soakWindow is one minute of the soak.
type soakWindow struct {
	Minute   int            `json:"minute"`
	Requests int            `json:"requests"`
	Outcomes map[string]int `json:"outcomes"`
	P50TTFT  float64        `json:"p50_ttft_ms"`
	P99TTFT  float64        `json:"p99_ttft_ms"`
	P99Total float64        `json:"p99_total_ms"`
}

// soakGauge is the gateway's goroutines and RSS at a moment.
type soakGauge struct {
	At         string  `json:"at"`
	Goroutines float64 `json:"goroutines"`
	RSSMiB     float64 `json:"rss_mib"`
}

func pct(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(float64(len(d)-1) * p)
	return float64(d[i].Microseconds()) / 1000
}

// soakGateway runs the gateway as a separate Caddy process.
type soakGateway struct {
	cmd  *exec.Cmd
	done chan error
}

func startSoakGateway(t *testing.T, bin, cfg string) *soakGateway {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", file, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	logf, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &soakGateway{cmd: cmd, done: make(chan error, 1)}
	go func() { g.done <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-g.done
		}
	})
	eventually(t, 30*time.Second, "the Caddy process's admin endpoint", func() bool {
		res, err := client.Get("http://" + adminAddr + "/llm/engines")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return g
}

// soakGaugeNow reads the gateway's goroutines and RSS.
func soakGaugeNow(t *testing.T, external bool, start time.Time) soakGauge {
	g := soakGauge{At: time.Since(start).Round(time.Second).String()}
	if external {
		g.Goroutines = metricValue(t, "go_goroutines")
		g.RSSMiB = metricValue(t, "process_resident_memory_bytes") / (1 << 20)
		return g
	}
	g.Goroutines = float64(runtime.NumGoroutine())
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				g.RSSMiB = kb / 1024
			}
		}
	}
	return g
}

// soakRequest sends one request of the mix and classifies its outcome.
func soakRequest(ctx context.Context, rng *rand.Rand, convs []string) soakSample {
	start := time.Now()
	kind := rng.IntN(100)
	stream := kind < 75
	var content string
	header := map[string]string{}
	switch {
	case kind < 50: // a conversation: a shared, growing prefix
		content = convs[rng.IntN(len(convs))] + fmt.Sprintf(" turn %d", rng.IntN(1000))
	case kind < 65: // a band other than normal
		content = fmt.Sprintf("prioritised %d %s", rng.Int(), longText(20+rng.IntN(60)))
		header["X-Priority"] = []string{"high", "low"}[rng.IntN(2)]
	default:
		content = fmt.Sprintf("one-off %d %s", rng.Int(), longText(10+rng.IntN(200)))
	}
	cancelAfter := 0
	if stream && rng.IntN(100) < 10 {
		cancelAfter = 3 // a client that leaves mid-stream
	}
	maxTokens := 16 + rng.IntN(64)
	b, _ := json.Marshal(map[string]any{
		"model": "sim-model", "stream": stream, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var reused bool
	rctx = httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, "http://"+gatewayAddr+"/v1/chat/completions", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	s := soakSample{}
	res, err := client.Do(req)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			s.outcome = "shutdown"
		case reused:
			// A reload closed the idle keep-alive connection the request
			// went out on, before the server read it (see
			// TestReliabilityReloadUnderLoad); clients retry these.
			s.outcome = "keepalive_race"
		default:
			s.outcome = "transport_error"
		}
		s.total = time.Since(start)
		return s
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
		s.ttft, s.total = time.Since(start), time.Since(start)
		s.outcome = fmt.Sprintf("http_%d", res.StatusCode)
		return s
	}
	if !stream {
		_, err := io.Copy(io.Discard, res.Body)
		s.ttft, s.total = time.Since(start), time.Since(start)
		s.outcome = "ok"
		if err != nil {
			s.outcome = "body_error"
		}
		return s
	}
	br := bufio.NewReader(res.Body)
	tokens, done, errEvent := 0, false, false
	for {
		line, err := br.ReadString('\n')
		l := strings.TrimRight(line, "\r\n")
		switch {
		case l == "event: error":
			errEvent = true
		case l == "data: [DONE]":
			done = true
		case strings.HasPrefix(l, "data: ") && !errEvent:
			if tokens == 0 {
				s.ttft = time.Since(start)
			}
			tokens++
		}
		if cancelAfter > 0 && tokens >= cancelAfter {
			cancel()
			s.total, s.outcome = time.Since(start), "client_left"
			return s
		}
		if err != nil {
			s.total = time.Since(start)
			switch {
			case ctx.Err() != nil:
				s.outcome = "shutdown"
			case err != io.EOF:
				s.outcome = "stream_cut"
			case errEvent:
				s.outcome = "sse_error_event"
			case done:
				s.outcome = "ok"
			default:
				s.outcome = "stream_truncated"
			}
			return s
		}
	}
}

// TestReliabilitySoak: mixed load (48 clients over 4 engines of
// max_inflight 8, so requests park; streams and not, shared prefixes and
// one-offs, three bands, 10% of clients leaving mid-stream) for LLMGW_SOAK,
// with an engine restarted every 45 s, one engine cutting its streams for
// 10 s every 100 s, and a config reload every 2 minutes.
// It reports requests served, outcomes by cause, TTFT percentiles per
// minute (drift), and the gateway's goroutines and RSS over time; it fails
// if a request ends in a way no fault explains (a truncated stream, a
// transport error) or goroutines and RSS do not stay flat.
func TestReliabilitySoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("LLMGW_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set LLMGW_SOAK=10m to run the soak")
	}
	engines := startEngines(t, 4, vllmsim.Config{TimeScale: 5, MaxNumSeqs: 16})
	cfg := func(reload int) relGateway {
		g := relGateway{
			engines:     relEngines(engines...),
			pollIntervl: "500ms",
			appExtra:    fmt.Sprintf("\t\tstale_after %d\n", 3+reload%2),
			admission:   "\t\tmax_park 10s\n\t\tqueue_size 512\n\t\theartbeat 2s\n",
			proxyExtra:  "\t\tlb_retries 2\n",
		}
		for i := range g.engines {
			// Below the load's concurrency, so that requests park.
			g.engines[i].extra = "\t\t\tmax_inflight 8\n"
		}
		return g
	}
	bin := os.Getenv("LLMGW_SOAK_CADDY")
	external := bin != ""
	load := func(reload int) {
		if !external {
			cfg(reload).load(t)
			return
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+adminAddr+"/load", strings.NewReader(cfg(reload).caddyfile()))
		req.Header.Set("Content-Type", "text/caddyfile")
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("reload: %v", err)
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("reload: %d %s", res.StatusCode, body)
		}
	}
	if external {
		startSoakGateway(t, bin, cfg(0).caddyfile())
	} else {
		load(0)
		t.Cleanup(func() { relReset(t) })
	}
	eventually(t, 20*time.Second, "subscriptions connected", func() bool {
		for _, e := range engines {
			if r := getEngineReport(t, e.Addr()); r.KV == nil || !r.KV.Connected {
				return false
			}
		}
		return true
	})

	convs := make([]string, 8)
	for i := range convs {
		convs[i] = fmt.Sprintf("conversation %d: %s", i, longText(150+50*i))
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		mu      sync.Mutex
		samples []soakSample
		gauges  []soakGauge
		events  []string
		wg      sync.WaitGroup
	)
	gauges = append(gauges, soakGaugeNow(t, external, start))
	const workers = 48
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for ctx.Err() == nil {
				s := soakRequest(ctx, rng, convs)
				s.at = time.Since(start)
				mu.Lock()
				samples = append(samples, s)
				mu.Unlock()
			}
		}()
	}
	restart := time.NewTicker(45 * time.Second)
	reload := time.NewTicker(2 * time.Minute)
	gauge := time.NewTicker(30 * time.Second)
	drop := time.NewTicker(100 * time.Second)
	defer drop.Stop()
	defer restart.Stop()
	defer reload.Stop()
	defer gauge.Stop()
	restarts, reloads := 0, 0
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-restart.C:
			e := engines[restarts%len(engines)]
			if err := e.Restart(); err != nil {
				t.Errorf("restarting %s: %v", e.Addr(), err)
			}
			restarts++
			events = append(events, fmt.Sprintf("%v restart %s", time.Since(start).Round(time.Second), e.Addr()))
		case <-drop.C:
			// Streams cut mid-way on one engine for 10 s.
			e := engines[(restarts+2)%len(engines)]
			e.SetFaults(vllmsim.Faults{DropStreamAfter: 5})
			time.AfterFunc(10*time.Second, func() { e.SetFaults(vllmsim.Faults{}) })
			events = append(events, fmt.Sprintf("%v streams cut on %s for 10s", time.Since(start).Round(time.Second), e.Addr()))
		case <-reload.C:
			reloads++
			load(reloads)
			events = append(events, fmt.Sprintf("%v reload", time.Since(start).Round(time.Second)))
		case <-gauge.C:
			g := soakGaugeNow(t, external, start)
			mu.Lock()
			gauges = append(gauges, g)
			mu.Unlock()
		}
	}
	wg.Wait()
	client.CloseIdleConnections()
	time.Sleep(5 * time.Second) // let the gateway settle: connections close, parked requests leave
	runtime.GC()
	gauges = append(gauges, soakGaugeNow(t, external, start))

	// Figures.
	outcomes := map[string]int{}
	var windows []soakWindow
	byMinute := map[int][]soakSample{}
	for _, s := range samples {
		outcomes[s.outcome]++
		byMinute[int(s.at/time.Minute)] = append(byMinute[int(s.at/time.Minute)], s)
	}
	for m := 0; m <= int(d/time.Minute); m++ {
		ss := byMinute[m]
		if len(ss) == 0 {
			continue
		}
		w := soakWindow{Minute: m, Requests: len(ss), Outcomes: map[string]int{}}
		var ttft, total []time.Duration
		for _, s := range ss {
			w.Outcomes[s.outcome]++
			if s.outcome == "ok" {
				ttft = append(ttft, s.ttft)
				total = append(total, s.total)
			}
		}
		w.P50TTFT, w.P99TTFT, w.P99Total = pct(ttft, .5), pct(ttft, .99), pct(total, .99)
		windows = append(windows, w)
	}
	mode := "in-process Caddy (figures: whole test process)"
	if external {
		mode = "Caddy binary " + bin + " (figures: the gateway process)"
	}
	t.Logf("soak %v, %s, GOMAXPROCS %d, %d workers, %d engine restarts, %d reloads", d, mode, runtime.GOMAXPROCS(0), workers, restarts, reloads)
	t.Logf("requests %d, outcomes %v", len(samples), outcomes)
	for _, w := range windows {
		t.Logf("minute %2d: %5d requests, TTFT p50 %7.1f ms p99 %7.1f ms, total p99 %7.1f ms, %v", w.Minute, w.Requests, w.P50TTFT, w.P99TTFT, w.P99Total, w.Outcomes)
	}
	for _, g := range gauges {
		t.Logf("at %8s: goroutines %5.0f, RSS %6.1f MiB", g.At, g.Goroutines, g.RSSMiB)
	}
	for _, e := range events {
		t.Log(e)
	}
	if out := os.Getenv("LLMGW_SOAK_OUT"); out != "" {
		b, _ := json.MarshalIndent(map[string]any{
			"duration": d.String(), "mode": mode, "gomaxprocs": runtime.GOMAXPROCS(0), "workers": workers,
			"restarts": restarts, "reloads": reloads, "requests": len(samples), "outcomes": outcomes,
			"minutes": windows, "gauges": gauges, "events": events,
		}, "", "  ")
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Error(err)
		}
	}

	// Verdicts: every outcome is one a fault explains, and the gateway
	// stays flat.
	for o, n := range outcomes {
		switch o {
		case "ok", "client_left", "shutdown", "sse_error_event", "http_502", "http_503", "keepalive_race":
		default:
			t.Errorf("%d requests ended %s", n, o)
		}
	}
	if ok := outcomes["ok"]; ok < len(samples)*8/10 {
		t.Errorf("only %d of %d requests served", ok, len(samples))
	}
	// Flat: after the load (idle connections settled) no more goroutines
	// than under load at 30 s, and RSS within reach of its 30 s value.
	if len(gauges) > 2 {
		loaded, last := gauges[1], gauges[len(gauges)-1]
		if last.Goroutines > loaded.Goroutines*1.2+50 {
			t.Errorf("goroutines: %.0f under load at 30 s, %.0f at the end", loaded.Goroutines, last.Goroutines)
		}
		if last.RSSMiB > loaded.RSSMiB*1.5+64 {
			t.Errorf("RSS grew from %.1f MiB (30 s) to %.1f MiB", loaded.RSSMiB, last.RSSMiB)
		}
	}
}
