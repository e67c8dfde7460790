package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// relHugeMetrics serves /metrics pages of 50 MB of well-formed comment
// lines from one preallocated buffer, recording how many bytes the largest
// scrape took before the client hung up.
func relHugeMetrics(t *testing.T) (url string, maxSent *atomic.Int64) {
	t.Helper()
	maxSent = new(atomic.Int64)
	chunk := []byte(strings.Repeat("# padding padding padding padding padding padding padding padding\n", 1024))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		var sent int64
		for sent < 50<<20 {
			n, err := w.Write(chunk)
			sent += int64(n)
			if err != nil {
				break
			}
		}
		for {
			m := maxSent.Load()
			if sent <= m || maxSent.CompareAndSwap(m, sent) {
				break
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics", maxSent
}

// TestReliabilityMetricsHTMLAndHuge complements TestAdmissionMetricsOutage's
// metrics outages (500, hang, garbage): an engine whose /metrics answers an
// HTML page (a proxy's error page), or 50 MB of well-formed comment lines,
// fails its scrapes with a clear error — the 50 MB page is cut at the 4 MiB
// limit, never read whole — turns stale, and its requests are served
// (fail-open).
func TestReliabilityMetricsHTMLAndHuge(t *testing.T) {
	for _, tc := range []struct{ fault, wantErr string }{
		{"html", "html"},      // no vLLM series on the page
		{"huge", "too large"}, // the size limit
	} {
		t.Run(tc.fault, func(t *testing.T) {
			e := startEngines(t, 1, vllmsim.Config{})[0]
			eng := gatewayEngine{dial: e.Addr()}
			var maxSent *atomic.Int64
			if tc.fault == "huge" {
				var u string
				u, maxSent = relHugeMetrics(t)
				eng.extra = "\t\t\tmetrics " + u + "\n"
			} else {
				e.SetFaults(vllmsim.Faults{Metrics: tc.fault})
			}
			gateway{engines: []gatewayEngine{eng}, pollInterval: "100ms", appExtra: "\t\tpoll_timeout 5s\n"}.load(t)
			t.Cleanup(func() { resetGateway(t) })
			var r fleet.EngineReport
			testwait.For(t, 20*time.Second, "five failed scrapes", func() bool {
				r = getEngineReport(t, e.Addr())
				return r.Failures >= 5
			})
			if r.Known || !r.Stale || !strings.Contains(strings.ToLower(r.LastError), tc.wantErr) {
				t.Errorf("engine report: known=%v stale=%v last_error=%q (want it to mention %q)", r.Known, r.Stale, r.LastError, tc.wantErr)
			}
			if maxSent != nil {
				// The limit plus what socket buffers absorb; never the page.
				if m := maxSent.Load(); m > 24<<20 {
					t.Errorf("a scrape took %d MiB of a 50 MiB page", m>>20)
				} else {
					t.Logf("the largest scrape took %.1f MiB of the 50 MiB page", float64(m)/(1<<20))
				}
			}
			t.Logf("%d failed scrapes, last error %q", r.Failures, r.LastError)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if s := send(ctx, "", chat{user: "served anyway", maxTokens: 8, stream: true}.body(), nil); !s.complete() {
				t.Fatalf("request with the engine's metrics broken: %+v", s)
			}
		})
	}
}

// TestReliabilityUnknownModel: a request for a model no engine serves is
// not a gateway failure: once the engines' models are learned, the gateway
// answers it 404 model_not_found itself, in OpenAI's shape (as vLLM would:
// "The model `x` does not exist."), and no engine sees it. With `models`
// set, such a request is not gated, and lb_policy llm gives the same
// answer.
func TestReliabilityUnknownModel(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{})[0]
	for _, admissionCfg := range []string{"", "\t\tmodels sim-model\n"} {
		gateway{engines: kvEngines(e), admission: admissionCfg}.load(t)
		t.Cleanup(func() { resetGateway(t) })
		waitModelsLearned(t, e)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		body := strings.Replace(chat{user: "hello", maxTokens: 8, stream: true}.body(), `"sim-model"`, `"no-such-model"`, 1)
		s := send(ctx, "", body, nil)
		cancel()
		if s.status != http.StatusNotFound {
			t.Fatalf("models=%q: %d %q, want 404", admissionCfg, s.status, s.body)
		}
		if ct := s.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("models=%q: Content-Type %q", admissionCfg, ct)
		}
		checkModelNotFound(t, s.body, "no-such-model")
	}
	if n := e.RequestsByModel()["no-such-model"]; n != 0 {
		t.Errorf("the engine saw %d requests for the unknown model", n)
	}
}

// TestReliabilitySlowlorisBody: a client that sends its headers and then
// trickles the body (a byte every 200ms, plain or chunked) gets 408 with a
// JSON error once body_timeout passes, and its connection is closed; the
// gateway serves others meanwhile and afterwards. (Slow headers are
// Caddy's: its read_header timeout, 1 minute by default.)
func TestReliabilitySlowlorisBody(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{})[0]
	gateway{engines: kvEngines(e), admission: "\t\tbody_timeout 1s\n"}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	servedBefore := e.Stats().RequestsServed
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			c, err := net.DialTimeout("tcp", gatewayAddr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			hdr := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + gatewayAddr + "\r\nContent-Type: application/json\r\n"
			if chunked {
				hdr += "Transfer-Encoding: chunked\r\n\r\n"
			} else {
				hdr += "Content-Length: 100000\r\n\r\n"
			}
			if _, err := io.WriteString(c, hdr); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			dripped := make(chan int, 1)
			go func() { // the trickle, until the gateway answers or gives up
				n := 0
				defer func() { dripped <- n }()
				for {
					select {
					case <-stop:
						return
					case <-time.After(200 * time.Millisecond):
					}
					b := "{"
					if chunked {
						b = "1\r\n{\r\n"
					}
					if _, err := io.WriteString(c, b); err != nil {
						return
					}
					n++
				}
			}()
			// Meanwhile the gateway serves another client.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if s := send(ctx, "", chat{user: "while a client trickles", maxTokens: 8, stream: true}.body(), nil); !s.complete() {
				t.Fatalf("other client during the trickle: %+v", s)
			}
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			start := time.Now()
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			close(stop)
			if err != nil {
				t.Fatalf("no answer to the trickling client: %v", err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusRequestTimeout || !json.Valid(body) {
				t.Fatalf("trickling client got %d %q, want 408 with a JSON error", res.StatusCode, body)
			}
			if strings.Contains(string(body), gatewayAddr) {
				t.Errorf("the error names the gateway's address: %s", body)
			}
			// The connection is done for: the trickle fails soon.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Errorf("the connection stayed open after the 408")
			}
			t.Logf("408 after %d bytes trickled (%v after the other request): %s", <-dripped, time.Since(start).Round(time.Millisecond), body)
		})
	}
	if got := e.Stats().RequestsServed; got != servedBefore+2 {
		t.Errorf("engine served %d requests, want %d: a trickled body reached it", got-servedBefore, 2)
	}
}

// TestReliabilityDeclaredBodyNotPreallocated: a request whose headers
// declare a body of max_body bytes, and which then sends (almost) nothing,
// costs the gateway memory for the bytes that arrived, not for the bytes
// announced. Regression: the handler allocated Content-Length bytes before
// reading, so 100 such connections — a few kilobytes of headers — held
// 100 MiB for body_timeout (10,000 connections: 10 GiB).
func TestReliabilityDeclaredBodyNotPreallocated(t *testing.T) {
	const conns = 100
	e := startEngines(t, 1, vllmsim.Config{})[0]
	gateway{engines: kvEngines(e), admission: "\t\tmax_body 1MiB\n\t\tbody_timeout 30s\n"}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	heap0 := heapInuse()
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for range conns {
		c, err := net.DialTimeout("tcp", gatewayAddr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
		req := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + gatewayAddr + "\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{"
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 20*time.Second, fmt.Sprintf("%d handlers reading their body", conns), func() bool {
		return countGoroutines("(*Admission).readBody") >= conns
	})
	heap1 := heapInuse()
	t.Logf("%d connections declaring 1 MiB each: heap in use %d → %d MiB", conns, heap0>>20, heap1>>20)
	if heap1 > heap0+32<<20 {
		t.Fatalf("heap grew by %d MiB for %d declared bodies that never came", (heap1-heap0)>>20, conns)
	}
}
