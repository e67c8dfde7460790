package caddymodule

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// tlsEdgeClient trusts Caddy's local CA (tls internal) and speaks HTTP/2.
func tlsEdgeClient(t *testing.T) *http.Client {
	t.Helper()
	rootFile := filepath.Join(caddy.AppDataDir(), "pki", "authorities", "local", "root.crt")
	var pem []byte
	testwait.For(t, 20*time.Second, "Caddy's local CA root", func() bool {
		var err error
		pem, err = os.ReadFile(rootFile)
		return err == nil && len(pem) > 0
	})
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", rootFile)
	}
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

// TestTLSEdgeHTTP2Streaming: the gateway behind a real TLS listener (`tls
// internal`, Caddy's local CA) serves streaming completions over HTTP/2
// end to end: the certificate verifies against the local CA, the response
// is HTTP/2, and tokens arrive while the engine is still generating them
// (not buffered to the end). A request parked by llm_admission streams its
// keep-alive comments over HTTP/2 too, and ends with an SSE error event
// when max_park runs out.
func TestTLSEdgeHTTP2Streaming(t *testing.T) {
	url := fmt.Sprintf("https://localhost:%d/v1/chat/completions", httpsPort)
	e := startEngines(t, 1, vllmsim.Config{TimeScale: 1, DecodeStepTime: 10 * time.Millisecond})[0]
	gateway{
		engines:   kvEngines(e),
		global:    "\tlocal_certs\n",
		site:      fmt.Sprintf("https://localhost:%d", httpsPort),
		siteExtra: "\ttls internal\n",
	}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	c := tlsEdgeClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// stream sends a streaming request of maxTokens over TLS.
	stream := func(content string, maxTokens int, onData func(n int)) reply {
		t.Helper()
		req, err := newPost(ctx, url, chat{user: content, maxTokens: maxTokens, stream: true}.body(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return do(c, req, onData)
	}
	var s reply
	testwait.For(t, 20*time.Second, "a TLS response (certificate issued)", func() bool {
		s = stream("warm up", 4, nil)
		return s.err == nil
	})
	if !s.complete() {
		t.Fatalf("first stream: %+v", s)
	}

	// 1000 tokens take the engine 10 s: a first event read while the
	// request is still at the engine shows the stream is not buffered,
	// even when the client reads seconds late on a loaded machine. The
	// first event is the chat's role chunk, which the engine writes as
	// the request arrives, before its scheduler takes it up: the request
	// may still be waiting then, not yet running (CI failed twice on
	// counting only running requests, at 15b75bf and aeb76f3, each time
	// after a whole stream).
	served := e.Stats().RequestsServed
	atFirst := vllmsim.Stats{Running: -1}
	s = stream("stream over h2", 1000, func(n int) {
		if n == 1 {
			atFirst = e.Stats()
		}
	})
	if !s.complete() || s.data < 100 {
		t.Fatalf("stream: %+v", s)
	}
	if s.proto != 2 {
		t.Fatalf("protocol HTTP/%d, want HTTP/2", s.proto)
	}
	if ct := s.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("Content-Type %q", ct)
	}
	if inFlight := atFirst.Running + atFirst.Waiting; inFlight != 1 || atFirst.RequestsServed != served {
		t.Fatalf("the first event arrived when the engine had %d requests running or waiting and had served %d (%d before the stream), want 1 and none more: the stream was buffered",
			inFlight, atFirst.RequestsServed, served)
	}
	if got := e.Stats().RequestsServed; got < served+1 {
		t.Errorf("engine served %d requests, want %d", got, served+1)
	}
	t.Logf("HTTP/%d, %d tokens, the first while the engine was still generating", s.proto, s.data)

	// A parked stream over HTTP/2: keep-alives flow, then the max_park error.
	full, _ := relFullEngine(t)
	gateway{
		engines:   []gatewayEngine{{dial: full}},
		global:    "\tlocal_certs\n",
		site:      fmt.Sprintf("https://localhost:%d", httpsPort),
		siteExtra: "\ttls internal\n",
		admission: "\t\tmax_park 2s\n\t\theartbeat 200ms\n",
	}.load(t)
	testwait.For(t, 10*time.Second, "engine seen full", func() bool {
		r := getEngineReport(t, full)
		return r.Known && r.KVUsage >= 0.9
	})
	req, err := newPost(ctx, url, chat{user: "parked over h2", maxTokens: 8, stream: true}.body(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.ProtoMajor != 2 || res.StatusCode != http.StatusOK {
		t.Fatalf("parked: HTTP/%d %d", res.ProtoMajor, res.StatusCode)
	}
	keepAlives, errEvent := 0, false
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		switch l := sc.Text(); {
		case l == ": keep-alive":
			keepAlives++
		case l == "event: error":
			if keepAlives < 2 {
				t.Errorf("the error event came after %d keep-alives, want several", keepAlives)
			}
			errEvent = true
		}
	}
	if err := sc.Err(); err != nil || !errEvent {
		t.Fatalf("parked stream over HTTP/2: %d keep-alives, error event %v, read error %v", keepAlives, errEvent, err)
	}
	t.Logf("parked over HTTP/2: %d keep-alives, then event: error", keepAlives)
}
