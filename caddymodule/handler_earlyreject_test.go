package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testdep"
)

// The early-refusal tests post bodies over max_body (1 MiB here) the
// way clients that send everything before reading do, and check they read
// the documented JSON 413 rather than a connection reset.

// bigChat is a 2 MiB chat completion body, shared by every upload so that
// the uploads themselves allocate nothing (the memory test counts bytes).
var bigChat = func() []byte {
	b := []byte(chat{user: strings.Repeat("a ", 1<<20)}.body())
	return b[:len(b):len(b)]
}()

// loadEarlyReject loads a gateway with default limits but max_body 1 MiB
// (below the 2 MiB uploads).
func loadEarlyReject(t *testing.T, g gateway) {
	t.Helper()
	e := startEngines(t, 1, vllmsim.Config{})[0]
	g.engines = noKVEngines(e)
	g.admission = "\t\tmax_body 1MiB\n"
	g.load(t)
	t.Cleanup(func() { resetGateway(t) })
}

// rawUpload writes a whole POST of body to the gateway on a fresh TCP
// connection — headers, then every byte, chunked or with Content-Length —
// and only then reads the response, as Python's urllib does. With pace,
// it pauses that long after every 64 KiB, a slow uplink: loopback buffers
// hold a fast client's 2 MiB, and only a client still sending when the
// server closes shows the reset.
func rawUpload(addr string, body []byte, chunked bool, pace time.Duration) (status int, respBody string, err error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	hdr := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n", addr)
	// A small buffer: large writes bypass it, and the memory test counts
	// the clients' allocations too.
	w := bufio.NewWriterSize(pacedWriter{conn, pace}, 4<<10)
	if chunked {
		fmt.Fprintf(w, "%sTransfer-Encoding: chunked\r\n\r\n", hdr)
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 64<<10)
			fmt.Fprintf(w, "%x\r\n", n)
			w.Write(rest[:n])
			w.WriteString("\r\n")
			rest = rest[n:]
		}
		w.WriteString("0\r\n\r\n")
	} else {
		fmt.Fprintf(w, "%sContent-Length: %d\r\n\r\n", hdr, len(body))
		w.Write(body)
	}
	if err := w.Flush(); err != nil {
		return 0, "", fmt.Errorf("writing the request: %w", err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", fmt.Errorf("reading the response: %w", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// pacedWriter writes at most 64 KiB at a time and pauses pace after each.
type pacedWriter struct {
	io.Writer
	pace time.Duration
}

func (p pacedWriter) Write(b []byte) (int, error) {
	if p.pace == 0 {
		return p.Writer.Write(b)
	}
	var n int
	for len(b) > 0 {
		m, err := p.Writer.Write(b[:min(len(b), 64<<10)])
		n, b = n+m, b[m:]
		if err != nil {
			return n, err
		}
		time.Sleep(p.pace)
	}
	return n, nil
}

// check413 fails unless the answer is the JSON 413 of max_body.
func check413(t *testing.T, what string, status int, body string, err error) {
	t.Helper()
	if err != nil || status != http.StatusRequestEntityTooLarge {
		t.Fatalf("%s: status %d, err %v, body %q", what, status, err, body)
	}
	if msg, _, code := openAIError(t, body); code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "max_body") {
		t.Fatalf("%s: error body %q", what, body)
	}
}

// TestEarlyRejectRawClients: a client that writes a whole 2 MiB body before
// reading — with Content-Length (refused unread) and chunked (refused after
// max_body), at full speed and trickling it over about a second — reads
// the JSON 413.
func TestEarlyRejectRawClients(t *testing.T) {
	loadEarlyReject(t, gateway{})
	for _, pace := range []time.Duration{0, 30 * time.Millisecond} {
		for _, chunked := range []bool{false, true} {
			st, body, err := rawUpload(gatewayAddr, bigChat, chunked, pace)
			check413(t, fmt.Sprintf("chunked=%v pace=%v", chunked, pace), st, body, err)
		}
	}
}

// TestEarlyRejectPythonUrllib: Python's urllib, the client of the issue,
// gets HTTPError 413 with the JSON body, not ConnectionResetError.
func TestEarlyRejectPythonUrllib(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		var lerr error
		py, lerr = exec.LookPath("python3")
		testdep.Dep{What: "python3", Hint: "apt-get install python3"}.Require(t, lerr)
	}
	loadEarlyReject(t, gateway{})
	const script = `import sys, urllib.request, urllib.error
body = b'{"model":"sim-model","messages":[{"role":"user","content":"' + b'a' * (2 << 20) + b'"}]}'
req = urllib.request.Request(sys.argv[1], data=body, headers={"Content-Type": "application/json"})
try:
    urllib.request.urlopen(req, timeout=30)
    print("unexpected success")
except urllib.error.HTTPError as e:
    print(e.code)
    print(e.read().decode())
`
	for i := range 5 { // a reset is a race: give it several chances to show
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		out, err := exec.CommandContext(ctx, py, "-c", script, "http://"+gatewayAddr+"/v1/chat/completions").CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("upload %d: %v\n%s", i, err, out)
		}
		code, body, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		st, _ := strconv.Atoi(code)
		check413(t, fmt.Sprintf("urllib upload %d: %s", i, out), st, body, nil)
	}
}

// TestEarlyRejectHTTP2: over HTTP/2 (TLS, `tls internal`) nothing is
// drained — the server resets the stream after the complete response
// (RST_STREAM NO_ERROR) — and Go's client, sending the whole body, reads
// the JSON 413.
func TestEarlyRejectHTTP2(t *testing.T) {
	loadEarlyReject(t, gateway{
		global:    "\tlocal_certs\n",
		site:      fmt.Sprintf("https://localhost:%d", httpsPort),
		siteExtra: "\ttls internal\n",
	})
	c := tlsEdgeClient(t)
	url := fmt.Sprintf("https://localhost:%d/v1/chat/completions", httpsPort)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	post := func(chunked bool) reply {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bigChat))
		if err != nil {
			t.Fatal(err)
		}
		if chunked {
			req.ContentLength = -1 // no declared length: refused after max_body
		}
		return do(c, req, nil)
	}
	var r reply
	testwait.For(t, 20*time.Second, "a TLS response (certificate issued)", func() bool {
		r = post(false)
		return r.err == nil
	})
	for _, chunked := range []bool{false, true} {
		if chunked {
			r = post(true)
		}
		if r.proto != 2 {
			t.Fatalf("chunked=%v: answered over HTTP/%d, want 2", chunked, r.proto)
		}
		check413(t, fmt.Sprintf("HTTP/2 chunked=%v", chunked), r.status, r.body, r.err)
	}
}

// TestEarlyRejectMemory: 100 concurrent 2 MiB uploads are refused without
// buffering their bodies: the gateway (in this process) allocates far less
// than the 200 MiB they carry. Only a generous bound is asserted; the
// figures are logged.
func TestEarlyRejectMemory(t *testing.T) {
	loadEarlyReject(t, gateway{})
	const uploads = 100
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	peak := heapSampler()
	var wg sync.WaitGroup
	errs := make(chan error, uploads)
	for range uploads {
		wg.Go(func() {
			st, body, err := rawUpload(gatewayAddr, bigChat, false, 0)
			if err != nil || st != http.StatusRequestEntityTooLarge {
				errs <- fmt.Errorf("status %d, err %v, body %q", st, err, body)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	growth := int64(peak()) - int64(before.HeapInuse)
	t.Logf("%d uploads of %d bytes: %.1f MiB allocated in all, peak heap in use %+.1f MiB",
		uploads, len(bigChat), float64(alloc)/(1<<20), float64(growth)/(1<<20))
	// Buffering the bodies would allocate at least 100 × 1 MiB (max_body).
	if alloc > 64<<20 {
		t.Errorf("allocated %d bytes for %d refused uploads: bodies are being buffered", alloc, uploads)
	}
}

// heapSampler samples HeapInuse every 5ms until the returned function is
// called, which returns the highest sample.
func heapSampler() func() uint64 {
	var mu sync.Mutex
	var peak uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapInuse)
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}
