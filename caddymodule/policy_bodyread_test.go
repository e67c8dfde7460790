package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/openai"
)

// selectWithin runs p.Select and fails the test if it has not returned
// within d: a hang guard, not a speed check (d is far above bodyWait).
func selectWithin(t *testing.T, p *Policy, r *http.Request, d time.Duration) string {
	t.Helper()
	picked := make(chan string, 1)
	go func() {
		u := p.Select(testPool(deadDials...), r, nil)
		if u == nil {
			picked <- ""
			return
		}
		picked <- u.Dial
	}()
	select {
	case dial := <-picked:
		if dial == "" {
			t.Fatal("no upstream picked")
		}
		return dial
	case <-time.After(d):
		t.Fatalf("Select still waiting for the body after %v", d)
		return ""
	}
}

// TestPolicyBodyRead: without llm_admission the policy waits for the body
// at most bodyWait. A body complete in time is parsed; one that stalls is
// not, the request is routed on load alone, and the proxy still gets every
// byte (those read ahead, then the rest as it arrives) or, when the client
// goes, the bytes it sent and then the error. No goroutine is left behind.
func TestPolicyBodyRead(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Close()
	body := chatBody(false, strings.Repeat("a slow client ", 200))
	half := len(body) / 2
	errGone := errors.New("client gone")

	cases := []struct {
		name     string
		length   int64 // declared Content-Length; -1 chunked
		maxBody  int64
		parts    []string      // written before Select returns...
		gap      time.Duration // ...with this pause between them
		after    []string      // written once Select returned
		leave    bool          // the client goes once Select returned
		early    bool          // the client goes right after the parts
		parsed   bool
		wantBody string
		wantErr  error
	}{
		{name: "whole body in time", length: int64(len(body)), parts: []string{body}, parsed: true, wantBody: body},
		{name: "in pieces, in time, chunked", length: -1, parts: []string{body[:10], body[10:half], body[half:]}, gap: 5 * time.Millisecond, parsed: true, wantBody: body},
		{name: "stalls, then sends the rest", length: int64(len(body)), parts: []string{body[:half]}, after: []string{body[half:]}, wantBody: body},
		{name: "stalls chunked, then sends the rest", length: -1, parts: []string{body[:half]}, after: []string{body[half : half+7], body[half+7:]}, wantBody: body},
		{name: "stalls, then leaves", length: int64(len(body)), parts: []string{body[:half]}, leave: true, wantBody: body[:half], wantErr: errGone},
		{name: "leaves before the wait is over", length: -1, parts: []string{body[:half]}, early: true, wantBody: body[:half], wantErr: errGone},
		{name: "over max_body in time", length: -1, maxBody: 100, parts: []string{body}, wantBody: body},
		{name: "stalls, then sends past max_body", length: -1, maxBody: int64(half + 100), parts: []string{body[:half]}, after: []string{body[half:]}, wantBody: body},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Bodies that stall get a short wait; the others a long one,
			// which they never reach (a loaded machine must not make them
			// look stalled).
			wait := 30 * time.Second
			if c.after != nil || c.leave {
				wait = 200 * time.Millisecond
			}
			p := testPolicy(f, &Policy{MaxBody: c.maxBody, bodyWait: wait})
			pr, pw := io.Pipe()
			r, _, cancel := testRequest(t, "")
			defer cancel()
			r.Body, r.ContentLength = pr, c.length
			if c.length < 0 {
				r.TransferEncoding = []string{"chunked"}
			}
			selected := make(chan struct{})
			go func() {
				for i, part := range c.parts {
					if i > 0 {
						// A client pausing between the pieces of its
						// body: the pause is the input under test.
						time.Sleep(c.gap)
					}
					if _, err := pw.Write([]byte(part)); err != nil {
						return
					}
				}
				switch {
				case c.early:
					_ = pw.CloseWithError(errGone)
				case c.after == nil && !c.leave:
					_ = pw.Close() // the whole body, in time
				}
				<-selected
				for _, part := range c.after {
					if _, err := pw.Write([]byte(part)); err != nil {
						return
					}
				}
				if c.leave {
					_ = pw.CloseWithError(errGone)
				} else {
					_ = pw.Close()
				}
			}()
			selectWithin(t, p, r, 30*time.Second)
			close(selected)
			req, _ := caddyhttp.GetVar(r.Context(), varRequest).(*openai.Request)
			if (req != nil) != c.parsed {
				t.Fatalf("parsed %v, want %v", req != nil, c.parsed)
			}
			tier, _ := caddyhttp.GetVar(r.Context(), "llm.tier").(string)
			if !c.parsed && tier != "load_only" {
				t.Errorf("tier %q for an unparsed body, want load_only", tier)
			}
			got, err := io.ReadAll(r.Body)
			if string(got) != c.wantBody || !errors.Is(err, c.wantErr) {
				t.Fatalf("the upstream would get %d bytes (err %v), want %d (err %v)", len(got), err, len(c.wantBody), c.wantErr)
			}
			if err := r.Body.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPolicyBodyReadClose: closing the body the policy handed over (the
// proxy gives up on the upstream) wakes a Read waiting for a stalled
// client; the read-ahead goroutine ends when the client's connection does.
func TestPolicyBodyReadClose(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Close()
	p := testPolicy(f, &Policy{bodyWait: 50 * time.Millisecond})
	pr, pw := io.Pipe()
	r, _, cancel := testRequest(t, "")
	defer cancel()
	r.Body, r.ContentLength = pr, 1000
	go func() { _, _ = pw.Write([]byte(`{"model":`)) }()
	selectWithin(t, p, r, 30*time.Second)
	buf := make([]byte, 100)
	if n, err := r.Body.Read(buf); err != nil || string(buf[:n]) != `{"model":` {
		t.Fatalf("first read: %q %v", buf[:n], err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := r.Body.Read(buf) // the client sends nothing more
		read <- err
	}()
	_ = r.Body.Close()
	select {
	case err := <-read:
		if !errors.Is(err, http.ErrBodyReadAfterClose) {
			t.Fatalf("read after close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not wake the waiting Read")
	}
	_ = pw.CloseWithError(errors.New("connection closed")) // the server ends the connection
}

// bodyRecorder is an upstream in front of a simulated engine that signals
// each inference request as soon as its headers arrive (before its body),
// then records the body it received and forwards it to the engine.
type bodyRecorder struct {
	srv     *httptest.Server
	arrived chan string // X-Test-Id of each inference request, on arrival
	mu      sync.Mutex
	bodies  map[string][]byte
	errs    map[string]error
}

func newBodyRecorder(t *testing.T, e *vllmsim.Engine) *bodyRecorder {
	t.Helper()
	u, _ := url.Parse(e.URL())
	proxy := httputil.NewSingleHostReverseProxy(u)
	rec := &bodyRecorder{arrived: make(chan string, 64), bodies: map[string][]byte{}, errs: map[string]error{}}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			id := r.Header.Get("X-Test-Id")
			rec.arrived <- id
			b, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
			rec.mu.Lock()
			rec.bodies[id], rec.errs[id] = b, err
			rec.mu.Unlock()
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (r *bodyRecorder) addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *bodyRecorder) body(id string) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies[id], r.errs[id]
}

// aheadGoroutines counts the policy's body-reading goroutines.
func aheadGoroutines() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "readahead.(*Body).run")
}

// TestPolicyBodyReadStalledClients: through Caddy, lb_policy llm without
// llm_admission, two clients send their headers and half their body, then
// stall. Other requests are served meanwhile; both stalled requests reach
// an engine once the policy stops waiting (routed on load alone); the one
// that then sends the rest gets its answer and the engine its whole body;
// the one that leaves leaves no goroutine behind.
func TestPolicyBodyReadStalledClients(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{TimeScale: 100})
	recs := []*bodyRecorder{newBodyRecorder(t, engines[0]), newBodyRecorder(t, engines[1])}
	g := gateway{
		engines:   []gatewayEngine{{dial: recs[0].addr()}, {dial: recs[1].addr()}},
		appExtra:  "\t\ttokenize_timeout 10s\n\t\tpoll_timeout 2s\n",
		admission: "-",
		policy:    "\t\t\tdebug_headers\n",
	}
	g.load(t)
	t.Cleanup(func() { resetGateway(t) })
	client.CloseIdleConnections()

	body := chatBody(false, "stalled "+longText(200))
	half := len(body) / 2
	stall := func(id string) net.Conn {
		t.Helper()
		conn, err := net.Dial("tcp", gatewayAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Test-Id: %s\r\n\r\n%s",
			gatewayAddr, len(body), id, body[:half])
		return conn
	}
	resumer, leaver := stall("resumer"), stall("leaver")

	// Other requests are not held up by the stalled ones.
	rs := parallel(8, 4, func(i int) reply {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return send(ctx, "", chatBody(false, fmt.Sprintf("meanwhile %d", i)), map[string]string{"X-Test-Id": "other"})
	})
	for i, r := range rs {
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d while two clients stall: status %d, err %v, %.200s", i, r.status, r.err, r.body)
		}
	}

	// Both stalled requests reach an engine while their clients still
	// stall: the policy stopped waiting for their bodies.
	seen := map[string]bool{}
	deadline := time.After(policyBodyWait + 30*time.Second)
	for !seen["resumer"] || !seen["leaver"] {
		select {
		case id := <-recs[0].arrived:
			seen[id] = true
		case id := <-recs[1].arrived:
			seen[id] = true
		case <-deadline:
			t.Fatalf("stalled requests still not forwarded (seen %v)", seen)
		}
	}

	// One leaves: its read-ahead goroutine ends with its connection.
	_ = leaver.Close()
	testwait.For(t, 20*time.Second, "no body read-ahead left", func() bool { return aheadGoroutines() <= 1 })

	// The other sends the rest: it is answered, and the engine got every byte.
	if _, err := io.WriteString(resumer, body[half:]); err != nil {
		t.Fatal(err)
	}
	_ = resumer.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(resumer), nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK || !strings.Contains(string(answer), `"choices"`) {
		t.Fatalf("the resumed request: %d %v %.300s", res.StatusCode, err, answer)
	}
	if tier := res.Header.Get("X-LLM-Tier"); tier != "load_only" {
		t.Errorf("the resumed request was routed on %q, want load_only", tier)
	}
	var got []byte
	for _, rec := range recs {
		if b, err := rec.body("resumer"); b != nil || err != nil {
			got = b
			if err != nil {
				t.Fatalf("the engine's read of the resumed body: %v", err)
			}
		}
	}
	if string(got) != body {
		t.Fatalf("the engine got %d bytes, the client sent %d", len(got), len(body))
	}
	testwait.For(t, 20*time.Second, "no body read-ahead left", func() bool { return aheadGoroutines() == 0 })
}

// BenchmarkPolicyBodyRead: the policy's own read and parse of a request
// body (lb_policy llm without llm_admission), for a body that is all there.
func BenchmarkPolicyBodyRead(b *testing.B) {
	f := testFleet()
	defer f.Close()
	p := new(Policy)
	p.setup(zap.NewNop(), f)
	for _, size := range []int{1 << 10, 64 << 10} {
		body := chatBody(false, strings.Repeat("x", size))
		b.Run(fmt.Sprintf("body=%dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
				r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), nil, &caddyhttp.Server{})
				if p.request(r, &selectState{}) == nil {
					b.Fatal("not parsed")
				}
			}
		})
	}
}
