package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Caddy runs as a real process, built from this checkout's cmd/caddy (the
// standard modules plus caddy-llmgw), with a generated Caddyfile. Every
// process is started with Pdeathsig so it dies with the harness, and is
// stopped by its owner with Stop.

// buildCaddy builds cmd/caddy into dir and returns the binary's path.
func buildCaddy(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "caddy")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/caddy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, out)
	}
	return bin, nil
}

// repoRoot is the directory of the gateway module, the repository root:
// the harness is a module of its own (bench/go.mod) whose replace
// directive points at it, so go list names it from either module.
func repoRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", gatewayModule).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s (run the harness from bench/, e.g. %s): %w", gatewayModule, runCommand, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", errors.New("not inside the caddy-llmgw repository")
	}
	return dir, nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// EngineRef is what a Caddyfile needs to know about one engine.
type EngineRef struct {
	Dial        string
	KVEvents    string // "" = no subscription
	KVReplay    string
	MaxInflight int // per rank with DataParallelSize
	// DataParallelSize declares Dial a data-parallel server of this many
	// ranks (data_parallel_size), each a routing target of the gateway,
	// rank r's KV events on KVEvents' and KVReplay's ports + r. 0 or 1:
	// one engine.
	DataParallelSize int
}

// routingTargets is how many routing targets the engines are: one each, or
// each data-parallel server's ranks.
func routingTargets(engines []EngineRef) int {
	n := 0
	for _, e := range engines {
		n += max(1, e.DataParallelSize)
	}
	return n
}

// GatewayConfig describes one generated Caddyfile.
type GatewayConfig struct {
	Engines []EngineRef
	// Policy is the lb_policy line's argument and block: "llm",
	// "round_robin", "least_conn".
	Policy string
	// PolicyBody holds lines inside lb_policy llm { }.
	PolicyBody string
	// Admission adds llm_admission before reverse_proxy, with these lines
	// inside its block.
	Admission     bool
	AdmissionBody string
	PollInterval  time.Duration
	// AppBody holds extra lines inside the llm app's block.
	AppBody string
	// PlainOnly leaves out the llm app: plain Caddy.
	PlainOnly bool
	// Dynamic takes reverse_proxy's upstreams from the llm app's engines
	// (`dynamic llm`) instead of listing them.
	Dynamic bool
}

// caddyfile renders the config for a gateway listening on port with its
// admin API on adminPort.
func (g GatewayConfig) caddyfile(port, adminPort int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin 127.0.0.1:%d\n\tpersist_config off\n\tauto_https off\n\tgrace_period 1s\n", adminPort)
	b.WriteString("\tlog {\n\t\tlevel WARN\n\t}\n")
	if !g.PlainOnly {
		g.writeApp(&b)
	}
	b.WriteString("}\n\n")
	fmt.Fprintf(&b, "http://127.0.0.1:%d {\n\tbind 127.0.0.1\n", port)
	if g.Admission {
		fmt.Fprintf(&b, "\tllm_admission {\n%s\t}\n", indent(g.AdmissionBody, "\t\t"))
	}
	b.WriteString("\treverse_proxy")
	if !g.Dynamic {
		for _, e := range g.Engines {
			b.WriteString(" " + e.Dial)
		}
	}
	b.WriteString(" {\n")
	if g.Dynamic {
		b.WriteString("\t\tdynamic llm\n")
	}
	if g.PolicyBody != "" {
		fmt.Fprintf(&b, "\t\tlb_policy %s {\n%s\t\t}\n", g.Policy, indent(g.PolicyBody, "\t\t\t"))
	} else {
		fmt.Fprintf(&b, "\t\tlb_policy %s\n", g.Policy)
	}
	b.WriteString("\t\tflush_interval -1\n\t\ttransport http {\n\t\t\tkeepalive_idle_conns_per_host 1024\n\t\t}\n\t}\n}\n")
	return b.String()
}

// writeApp writes the llm global option: the fleet.
func (g GatewayConfig) writeApp(b *strings.Builder) {
	poll := g.PollInterval
	if poll <= 0 {
		poll = 250 * time.Millisecond
	}
	fmt.Fprintf(b, "\tllm {\n\t\tpoll_interval %s\n", poll)
	if g.AppBody != "" {
		b.WriteString(indent(g.AppBody, "\t\t"))
	}
	for _, e := range g.Engines {
		fmt.Fprintf(b, "\t\tengine %s {\n", e.Dial)
		if e.MaxInflight > 0 {
			fmt.Fprintf(b, "\t\t\tmax_inflight %d\n", e.MaxInflight)
		}
		if e.DataParallelSize > 1 {
			fmt.Fprintf(b, "\t\t\tdata_parallel_size %d\n", e.DataParallelSize)
		}
		if e.KVEvents != "" {
			fmt.Fprintf(b, "\t\t\tkv_events %s\n", e.KVEvents)
		}
		if e.KVReplay != "" {
			fmt.Fprintf(b, "\t\t\tkv_replay %s\n", e.KVReplay)
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}\n")
}

func indent(body, prefix string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			b.WriteString(prefix + l + "\n")
		}
	}
	return b.String()
}

// Gateway is a running Caddy process.
type Gateway struct {
	cmd       *exec.Cmd
	done      chan struct{}
	waitErr   error
	URL       string // the chat completions endpoint
	Base      string // http://127.0.0.1:port
	AdminBase string
	LogPath   string
}

// startGateway writes the Caddyfile into dir, starts Caddy and waits until
// it serves, every engine's (every rank's) gauges and models are known
// and, when wantKV, every engine's KV subscription is connected.
func startGateway(ctx context.Context, bin, dir string, g GatewayConfig, wantKV bool) (*Gateway, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a free port may be taken between probe and bind
		gw, err := tryStartGateway(ctx, bin, dir, g, wantKV)
		if err == nil {
			return gw, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func tryStartGateway(ctx context.Context, bin, dir string, g GatewayConfig, wantKV bool) (*Gateway, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	adminPort, err := freePort()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	cfgPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(g.caddyfile(port, adminPort)), 0o644); err != nil {
		return nil, fmt.Errorf("writing Caddyfile: %w", err)
	}
	logPath := filepath.Join(dir, "caddy.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating caddy log: %w", err)
	}
	cmd := exec.Command(bin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir, "HOME="+dir)
	// The kernel kills Caddy if the harness dies, even by SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting caddy: %w", err)
	}
	gw := &Gateway{
		cmd: cmd, done: make(chan struct{}),
		Base:      fmt.Sprintf("http://127.0.0.1:%d", port),
		AdminBase: fmt.Sprintf("http://127.0.0.1:%d", adminPort),
		LogPath:   logPath,
	}
	gw.URL = gw.Base + "/v1/chat/completions"
	go func() {
		gw.waitErr = cmd.Wait()
		logf.Close()
		close(gw.done)
	}()
	engines := routingTargets(g.Engines)
	if g.PlainOnly {
		engines = 0
	}
	if err := gw.waitReady(ctx, engines, wantKV); err != nil {
		gw.Stop()
		return nil, fmt.Errorf("caddy not ready: %w (log %s: %s)", err, logPath, tail(logPath, 2000))
	}
	return gw, nil
}

// Pid is the Caddy process id.
func (gw *Gateway) Pid() int { return gw.cmd.Process.Pid }

// Stop ends Caddy: SIGTERM, then SIGKILL after 5 s.
func (gw *Gateway) Stop() {
	select {
	case <-gw.done:
		return
	default:
	}
	_ = gw.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-gw.done:
	case <-time.After(5 * time.Second):
		_ = gw.cmd.Process.Kill()
		<-gw.done
	}
}

// engineState is the part of GET /llm/engines the harness checks.
type engineState struct {
	Dial  string `json:"dial"`
	Known bool   `json:"gauges_known"`
	KV    *struct {
		Connected bool `json:"connected"`
	} `json:"kv"`
	// Models is null until the gateway has learned what the engine
	// serves.
	Models []json.RawMessage `json:"models"`
}

func (gw *Gateway) waitReady(ctx context.Context, engines int, wantKV bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c := &http.Client{Timeout: 2 * time.Second}
	last := errors.New("no answer yet")
	for {
		select {
		case <-gw.done:
			return fmt.Errorf("caddy exited: %v", gw.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("%w: %v", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
		if engines > 0 {
			var states []engineState
			if err := getJSON(ctx, c, gw.AdminBase+"/llm/engines", &states); err != nil {
				last = err
				continue
			}
			ready := 0
			for _, s := range states {
				if s.Known && s.Models != nil && (!wantKV || (s.KV != nil && s.KV.Connected)) {
					ready++
				}
			}
			if ready < engines {
				last = fmt.Errorf("%d of %d engines ready", ready, engines)
				continue
			}
		}
		// The site itself answers (any status: the route exists).
		resp, err := c.Get(gw.Base + "/v1/models")
		if err != nil {
			last = err
			continue
		}
		resp.Body.Close()
		return nil
	}
}

// getOK sends a GET and returns the response when its status is 200 OK;
// the caller closes the body. Any other status is an error, so an error
// page is never taken for the data asked for.
func getOK(ctx context.Context, c *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return resp, nil
}

// saveGet writes the body of a successful GET of url to path, at most
// 64 MiB of it.
func saveGet(ctx context.Context, c *http.Client, url, path string) error {
	resp, err := getOK(ctx, c, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	resp, err := getOK(ctx, c, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(v)
}

// Metrics scrapes the admin /metrics page and returns the samples whose
// names start with prefix, keyed by the sample's full text before the
// value ("name{labels}").
func (gw *Gateway) Metrics(ctx context.Context, prefix string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := getOK(ctx, http.DefaultClient, gw.AdminBase+"/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping caddy metrics: %w", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 64<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// procCPU returns the user+system CPU time the process pid has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading /proc/%d/stat: %w", pid, err)
	}
	// The command name (field 2) may contain spaces; fields after it are
	// counted from the closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	// Fields 14 and 15 (utime, stime) are f[11] and f[12] here.
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad cpu fields", pid)
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / ticks, nil
}

// procRSS returns the process's resident set and its peak, in bytes.
func procRSS(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("reading /proc/%d/status: %w", pid, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, peak, nil
}

// tail returns the last n bytes of a file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

// procRunqueueWait returns how long the threads of process pid have been
// runnable but waiting for a CPU (the second field of each thread's
// /proc/<pid>/task/<tid>/schedstat): on a shared host, the time this
// process wanted to run and could not.
func procRunqueueWait(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, fmt.Errorf("listing threads of %d: %w", pid, err)
	}
	var total time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			total += time.Duration(ns)
		}
	}
	return total, nil
}
