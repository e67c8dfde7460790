package caddymodule

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestReliabilityReloadUnderLoad: a config reload every second for about
// 10 s while streaming requests run. Expected: every request gets a
// complete stream (none fails, none ends with an error), and the
// goroutine count returns to where it was (old configs' handlers,
// transports and pollers all go away).
//
// Three effects of Caddy itself are accounted for. A reload closes the old
// server's idle keep-alive connections; a request the client sends on one
// at that moment fails before it is read (a "keep-alive race"). A request
// on a fresh connection the kernel queued on the old config's listening
// socket is reset as that socket closes (reply.listenerReset). Both are
// retried here, as clients retry connection errors — counted and
// reported, at most three times. And connections of the old config's reverse_proxy transport
// that were busy at the reload go idle afterwards and are closed only by
// its keep-alive timeout (default 2m; 2s here).
func TestReliabilityReloadUnderLoad(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{TimeScale: 5})
	cfg := func(i int) gateway {
		// Each reload changes the app, the handler and the policy.
		return gateway{
			engines:    kvEngines(engines...),
			appExtra:   fmt.Sprintf("\t\tstale_after %d\n", 3+i%2),
			admission:  fmt.Sprintf("\t\theartbeat %ds\n", 15+i%2),
			policy:     fmt.Sprintf("\t\t\ttie_tokens %d\n", 8+i%2),
			proxyExtra: "\t\ttransport http {\n\t\t\tkeepalive 2s\n\t\t}\n",
		}
	}
	cfg(0).load(t)
	t.Cleanup(func() { resetGateway(t) })
	testwait.For(t, 10*time.Second, "subscriptions connected", func() bool {
		for _, e := range engines {
			if r := getEngineReport(t, e.Addr()); r.KV == nil || !r.KV.Connected {
				return false
			}
		}
		return true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 4 {
		if s := send(ctx, "", chat{user: fmt.Sprintf("warm-up %d", i), maxTokens: 16, stream: true}.body(), nil); !s.complete() {
			t.Fatalf("warm-up: %+v", s)
		}
	}
	client.CloseIdleConnections()
	baseGroups, base := goroutineGroups(), settledGoroutines()

	const workers = 8
	var (
		mu                       sync.Mutex
		complete, cleanErr, lost int
		retried                  int
		examples                 []string
		wg                       sync.WaitGroup
		stop                     = make(chan struct{})
		shared                   = longText(200) // a shared prefix, so the precise tier works
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
				body := chat{user: fmt.Sprintf("%s worker %d request %d", shared, w, i), maxTokens: 40, stream: true}.body()
				s := send(rctx, "", body, nil)
				races := 0
				for ; (s.keepAliveRace() || s.listenerReset()) && races < 3; races++ {
					s = send(rctx, "", body, nil)
				}
				rcancel()
				mu.Lock()
				retried += races
				switch {
				case s.complete():
					complete++
				case s.cleanError():
					cleanErr++
					examples = append(examples, fmt.Sprintf("clean error: %d %q", s.status, s.errEvent+s.body))
				default:
					lost++
					examples = append(examples, fmt.Sprintf("lost: status %d err %v readErr %v tokens %d done %v", s.status, s.err, s.readErr, s.data, s.done))
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	reloads := 0
	for i := 1; time.Since(start) < 10*time.Second; i++ {
		// A reload every second is the load under test: the pause paces
		// it, it waits for nothing.
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second)))
		cfg(i).load(t)
		reloads++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d reloads in %v; %d complete streams, %d clean errors, %d lost; %d keep-alive races and listener resets retried",
		reloads, time.Since(start).Round(time.Millisecond), complete, cleanErr, lost, retried)
	for i, e := range examples {
		if i == 10 {
			break
		}
		t.Log(e)
	}
	if lost > 0 || cleanErr > 0 {
		t.Errorf("%d streams lost and %d ended with an error during reloads, want none", lost, cleanErr)
	}
	if complete < workers*5 {
		t.Errorf("only %d streams completed: the load did not run", complete)
	}
	if reloads < 8 {
		t.Errorf("only %d reloads", reloads)
	}
	n := waitGoroutines(t, base+40, baseGroups, 30*time.Second)
	t.Logf("goroutines: %d before, %d after", base, n)
}

// relFullEngine is an engine stand-in whose /metrics says its KV cache is
// full, so llm_admission parks every request for it. It counts the
// requests that reach it anyway (none should).
func relFullEngine(t *testing.T) (dial string, proxied *atomic.Int64) {
	t.Helper()
	proxied = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			// Admission tokenizes to place requests (cache-aware
			// admission): no request reaches the scheduler that way.
			http.Error(w, "no tokenizer", http.StatusNotFound)
			return
		}
		if r.URL.Path == "/v1/models" {
			// Model discovery, not a request: its models stay unknown,
			// which routes and admits as before discovery.
			http.NotFound(w, r)
			return
		}
		if r.URL.Path != "/metrics" {
			proxied.Add(1)
			http.Error(w, "not expected", http.StatusTeapot)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"sim-model\"} 16\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"sim-model\"} 4\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"sim-model\"} 0.99\n")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), proxied
}

const relParkClientEnv = "LLMGW_REL_PARK_CLIENT"

// TestReliabilityParkedClientsDisconnect: 10,000 requests park (every
// engine full), then all their clients disconnect at once. Expected: the
// queue holds all of them, then drains to zero; every one is counted as
// client_gone; goroutines and heap return to their baseline.
//
// The clients run in a child process (this test binary, re-executed):
// 10,000 loopback connections cost 20,000 descriptors in one process,
// beyond the hard limit here; split, each side needs 10,000.
func TestReliabilityParkedClientsDisconnect(t *testing.T) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("LLMGW_REL_PARK_N")); err == nil && v > 0 {
		n = v // for experiments
	}
	// Each process needs a descriptor per connection, and some 1,000 more
	// for the engines, Caddy and the test.
	raiseFileLimit(t, uint64(n)+1000)
	full, proxied := relFullEngine(t)
	gateway{
		// A scrape deadline that survives 10,000 connections on 2 cores
		// under the race detector: stale gauges would fail open.
		pollInterval: "200ms",
		appExtra:     "\t\tpoll_timeout 5s\n",
		engines:      []gatewayEngine{{dial: full}},
		admission:    "\t\tqueue_size 20000\n\t\tmax_park 10m\n\t\theartbeat 1m\n",
	}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	testwait.For(t, 10*time.Second, "engine seen full", func() bool {
		r := getEngineReport(t, full)
		return r.Known && r.KVUsage >= 0.9
	})
	gone0 := metricValue(t, "llmgw_admission_rejected_total", `reason="client_gone"`)
	client.CloseIdleConnections()
	baseGroups, base := goroutineGroups(), settledGoroutines()
	heap0 := heapInuse()

	exe, err := os.Executable() // not os.Args[0]: the in-process Caddy rewrote it
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestReliabilityParkClientProcess$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", relParkClientEnv, gatewayAddr, n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	waitLine := func(want string, d time.Duration) {
		t.Helper()
		timeout := time.After(d)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("client process ended before %q", want)
				}
				if l == want {
					return
				}
				t.Logf("client process: %s", l)
			case <-timeout:
				t.Fatalf("client process: no %q within %v", want, d)
			}
		}
	}
	started := time.Now()
	waitLine("ready", 120*time.Second)
	lastLog := time.Now()
	testwait.For(t, 120*time.Second, fmt.Sprintf("%d requests parked", n), func() bool {
		d := queueDepth(t, "")
		if p := proxied.Load(); p > 0 {
			t.Fatalf("%d requests reached the full engine (%d parked)", p, d)
		}
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			t.Logf("%d parked after %v", d, time.Since(started).Round(time.Second))
		}
		return d == n
	})
	parkedIn := time.Since(started)
	peakG := settledGoroutines()
	heapPeak := heapInuse()

	closedAt := time.Now()
	if _, err := fmt.Fprintln(stdin, "close"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 60*time.Second, "queue drained", func() bool { return queueDepth(t, "") == 0 })
	drainedIn := time.Since(closedAt)
	waitLine("closed", 30*time.Second)
	if p := proxied.Load(); p > 0 {
		t.Errorf("%d requests reached the full engine", p)
	}
	// Counted by each handler right after its waiter left the queue.
	var gone float64
	testwait.For(t, 30*time.Second, fmt.Sprintf("%d counted as client_gone", n), func() bool {
		gone = metricValue(t, "llmgw_admission_rejected_total", `reason="client_gone"`) - gone0
		return gone >= float64(n)
	})
	if gone != float64(n) {
		t.Errorf("client_gone counted %v times, want %d", gone, n)
	}
	if v := metricValue(t, "llmgw_admission_queue_depth"); v != 0 {
		t.Errorf("llmgw_admission_queue_depth = %v after the drain", v)
	}
	after := waitGoroutines(t, base+50, baseGroups, 60*time.Second)
	heap1 := heapInuse()
	t.Logf("%d parked in %v, drained %v after the clients left; goroutines %d → %d → %d; heap in use %d → %d → %d MiB",
		n, parkedIn.Round(time.Millisecond), drainedIn.Round(time.Millisecond), base, peakG, after, heap0>>20, heapPeak>>20, heap1>>20)
	if heap1 > heap0+64<<20 {
		t.Errorf("heap in use %d MiB after the drain, %d MiB before: memory did not return", heap1>>20, heap0>>20)
	}
}

// raiseFileLimit raises RLIMIT_NOFILE to want, past the hard limit if need
// be (root may), and fails the test if it cannot: a test that quietly
// parked fewer requests than it says would pass on a machine where the
// figure it claims was never tried. The child process inherits the limit.
func raiseFileLimit(t *testing.T, want uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= want {
		// Set it all the same: Go raised the soft limit at start-up and
		// would hand children the original one, unless the program sets
		// the limit itself.
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
		return
	}
	was := rl
	rl.Cur, rl.Max = want, max(rl.Max, want)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatalf("RLIMIT_NOFILE is %d (hard %d) and cannot be raised to the %d this test needs: %v (run as root, or raise the hard limit)",
			was.Cur, was.Max, want, err)
	}
}

// TestReliabilityParkClientProcess is the client side of
// TestReliabilityParkedClientsDisconnect, run in a child process: it opens
// n connections, sends one inference request on each, prints "ready",
// and closes them all when a line arrives on stdin.
func TestReliabilityParkClientProcess(t *testing.T) {
	spec := os.Getenv(relParkClientEnv)
	if spec == "" {
		t.Skip("the client process of TestReliabilityParkedClientsDisconnect")
	}
	addr, num, _ := strings.Cut(spec, " ")
	n, err := strconv.Atoi(num)
	if err != nil {
		t.Fatal(err)
	}
	body := chatBody(false, "parked until the client leaves")
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	fmt.Println("closed")
}
