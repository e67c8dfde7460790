package h1client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// newClient is a Client with o, closed at the test's end.
func newClient(tb testing.TB, o Options) *Client {
	tb.Helper()
	c, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// readAll is a callback keeping the status and the whole body.
func readAll(status *int, body *[]byte) func(*Response) error {
	return func(r *Response) error {
		*status = r.StatusCode
		b, err := io.ReadAll(r.Body)
		*body = b
		return err
	}
}

// connServer is an httptest server that counts the connections it
// accepted and those that closed.
type connServer struct {
	*httptest.Server
	opened, closed atomic.Int64
}

func newConnServer(tb testing.TB, h http.HandlerFunc) *connServer {
	s := &connServer{Server: httptest.NewUnstartedServer(h)}
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	s.Start()
	tb.Cleanup(s.Close)
	return s
}

func TestPostSendsTheRequest(t *testing.T) {
	var got struct {
		method, uri, host, ctype, key, body string
		length                              int64
		agents                              int
	}
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.method, got.uri, got.host, got.body = r.Method, r.RequestURI, r.Host, string(b)
		got.ctype, got.key, got.length = r.Header.Get("Content-Type"), r.Header.Get("X-Api-Key"), r.ContentLength
		got.agents = len(r.Header.Values("User-Agent"))
		_, _ = w.Write([]byte(`{"tokens":[1,2,3]}`))
	})
	c := newClient(t, Options{Header: http.Header{"Content-Type": {"application/json"}}})
	// Framing fields in the call's header are not the caller's to set.
	h := http.Header{"X-Api-Key": {"secret"}, "Content-Length": {"5"}, "Host": {"evil"}, "User-Agent": {"other"}}
	var status int
	var body []byte
	err := c.Post(context.Background(), srv.URL+"/tokenize?x=1", h, []byte(`{"prompt":"hi"}`), readAll(&status, &body))
	if err != nil {
		t.Fatal(err)
	}
	if status != 200 || string(body) != `{"tokens":[1,2,3]}` {
		t.Fatalf("response %d %q", status, body)
	}
	want := "POST /tokenize?x=1 " + strings.TrimPrefix(srv.URL, "http://") + " application/json secret {\"prompt\":\"hi\"} 15 1"
	if g := strings.Join([]string{got.method, got.uri, got.host, got.ctype, got.key, got.body,
		strconv.FormatInt(got.length, 10), strconv.Itoa(got.agents)}, " "); g != want {
		t.Fatalf("server saw %q, want %q", g, want)
	}
}

// TestPostReusesConnections: sequential calls share one connection;
// concurrent ones open no more than can be in use at once.
func TestPostReusesConnections(t *testing.T) {
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte("ok"))
	})
	c := newClient(t, Options{})
	call := func() error {
		var st int
		var b []byte
		if err := c.Post(context.Background(), srv.URL, nil, []byte("x"), readAll(&st, &b)); err != nil {
			return err
		}
		if st != 200 || string(b) != "ok" {
			return errors.New("bad answer " + string(b))
		}
		return nil
	}
	for range 200 {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	if c.Dials() != 1 || srv.opened.Load() != 1 {
		t.Fatalf("200 sequential calls: %d dials, %d connections, want 1", c.Dials(), srv.opened.Load())
	}
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range 50 {
				if err := call(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if d := c.Dials(); d > workers {
		t.Fatalf("%d concurrent callers dialed %d connections", workers, d)
	}
	if c.Idle() != int(c.Dials()) {
		t.Fatalf("idle %d of %d connections", c.Idle(), c.Dials())
	}
}

// rawServer answers every request on a connection with answer(n), n the
// request's number on the server (from 1); an answer ending the
// connection closes it after writing.
type rawServer struct {
	addr     string
	requests atomic.Int64
	accepted atomic.Int64
}

type rawAnswer struct {
	bytes string
	close bool
}

func newRawServer(tb testing.TB, answer func(n int64) rawAnswer) *rawServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &rawServer{addr: "http://" + ln.Addr().String() + "/tokenize"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			wg.Go(func() { s.serve(nc, answer) })
		}
	})
	return s
}

func (s *rawServer) serve(nc net.Conn, answer func(int64) rawAnswer) {
	defer nc.Close()
	br := bufio.NewReader(nc)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		a := answer(s.requests.Add(1))
		if _, err := nc.Write([]byte(a.bytes)); err != nil || a.close {
			return
		}
	}
}

// TestPostResponseFraming: each way an HTTP/1.1 response may be framed is
// read whole, and the connection is reused exactly when the framing
// allows it (two calls: one dial when reused, two otherwise).
func TestPostResponseFraming(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer rawAnswer
		body   string
		reused bool
	}{
		{"content-length", rawAnswer{bytes: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"}, "hello", true},
		{"lower-case and spaced", rawAnswer{bytes: "HTTP/1.1 200 OK\r\ncontent-length:  5 \r\n\r\nhello"}, "hello", true},
		{"chunked", rawAnswer{bytes: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;ext=1\r\nlo\r\n0\r\n\r\n"}, "hello", true},
		{"chunked with trailer", rawAnswer{bytes: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n"}, "hello", true},
		{"chunked wins over length", rawAnswer{bytes: "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"}, "hello", true},
		{"no content", rawAnswer{bytes: "HTTP/1.1 204 No Content\r\n\r\n"}, "", true},
		{"informational first", rawAnswer{bytes: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}, "ok", true},
		{"bare line feeds", rawAnswer{bytes: "HTTP/1.1 200 OK\nContent-Length: 2\n\nok"}, "ok", true},
		{"connection close", rawAnswer{bytes: "HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok", close: true}, "ok", false},
		{"until the end", rawAnswer{bytes: "HTTP/1.1 200 OK\r\n\r\nto the end", close: true}, "to the end", false},
		{"HTTP/1.0", rawAnswer{bytes: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", close: true}, "ok", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRawServer(t, func(int64) rawAnswer { return tc.answer })
			c := newClient(t, Options{})
			for i := range 2 {
				var st int
				var b []byte
				if err := c.Post(context.Background(), s.addr, nil, []byte("{}"), readAll(&st, &b)); err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if string(b) != tc.body {
					t.Fatalf("call %d: body %q, want %q", i, b, tc.body)
				}
				if idle := c.Idle() == 1; idle != tc.reused {
					t.Fatalf("call %d: connection kept %v, want %v", i, idle, tc.reused)
				}
			}
			want := uint64(2)
			if tc.reused {
				want = 1
			}
			if c.Dials() != want {
				t.Fatalf("%d dials for two calls, want %d", c.Dials(), want)
			}
		})
	}
}

// TestPostMalformedResponses: a response this client cannot trust is an
// error (never a panic or a hang), and its connection is not reused.
func TestPostMalformedResponses(t *testing.T) {
	long := "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("a", 1000)+"\r\n", 70) + "\r\n"
	for _, tc := range []struct {
		name   string
		answer string
		want   string // in the error
	}{
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", "malformed status line"},
		{"HTTP/2 status line", "HTTP/2 200 OK\r\n\r\n", "malformed status line"},
		{"HTTP/1.2", "HTTP/1.2 200 OK\r\n\r\n", "unsupported protocol"},
		{"letters for status", "HTTP/1.1 2x0 OK\r\n\r\n", "malformed status code"},
		{"status below 100", "HTTP/1.1 099 Odd\r\n\r\n", "malformed status code"},
		{"switching protocols", "HTTP/1.1 101 Switching Protocols\r\n\r\n", "101"},
		{"no colon", "HTTP/1.1 200 OK\r\nContent-Length 2\r\n\r\nok", "malformed header line"},
		{"space before colon", "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok", "malformed header line"},
		{"folded line", "HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\nContent-Length: 2\r\n\r\nok", "malformed header line"},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", "invalid Content-Length"},
		{"signed length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", "invalid Content-Length"},
		{"huge length", "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nok", "invalid Content-Length"},
		{"gzip coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "unsupported Transfer-Encoding"},
		{"header section too long", long, "too long"},
		{"header line too long", "HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("a", 5000) + "\r\n\r\n", "longer than"},
		{"cut in the head", "HTTP/1.1 200 OK\r\nContent-Le", "unexpected EOF"},
		{"cut in the body", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b", "unexpected EOF"},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", "invalid"},
		{"cut in a chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nhello", "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRawServer(t, func(int64) rawAnswer { return rawAnswer{bytes: tc.answer, close: true} })
			c := newClient(t, Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var st int
			var b []byte
			err := c.Post(ctx, s.addr, nil, []byte("{}"), readAll(&st, &b))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if c.Idle() != 0 {
				t.Fatal("the connection went back to the pool")
			}
		})
	}
}

// TestPostRepeatsOnStaleConnection: a pooled connection the server closed
// while it was idle fails before any response; the call is made again on
// a new connection. A call whose response had begun is not repeated, nor
// one on a connection just dialed.
func TestPostRepeatsOnStaleConnection(t *testing.T) {
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	c := newClient(t, Options{})
	post := func(url string) error {
		var st int
		var b []byte
		return c.Post(context.Background(), url, nil, []byte("{}"), readAll(&st, &b))
	}
	if err := post(srv.URL); err != nil {
		t.Fatal(err)
	}
	srv.CloseClientConnections()
	testwait.For(t, 5*time.Second, "the server to close the connection", func() bool { return srv.closed.Load() == 1 })
	if err := post(srv.URL); err != nil {
		t.Fatalf("call after the server closed the idle connection: %v", err)
	}
	if c.Dials() != 2 {
		t.Fatalf("%d dials, want 2", c.Dials())
	}

	t.Run("response begun", func(t *testing.T) {
		s := newRawServer(t, func(n int64) rawAnswer {
			if n == 1 {
				return rawAnswer{bytes: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}
			}
			return rawAnswer{bytes: "HTTP/1.1 200 OK\r\nContent-", close: true}
		})
		if err := post(s.addr); err != nil {
			t.Fatal(err)
		}
		if err := post(s.addr); err == nil {
			t.Fatal("a response cut in its head was taken")
		}
		if n := s.requests.Load(); n != 2 {
			t.Fatalf("server got %d requests, want 2 (no repeat)", n)
		}
	})
	t.Run("fresh connection", func(t *testing.T) {
		s := newRawServer(t, func(int64) rawAnswer { return rawAnswer{close: true} })
		if err := post(s.addr); err == nil {
			t.Fatal("no error for a connection closed without a response")
		}
		if n := s.requests.Load(); n != 1 {
			t.Fatalf("server got %d requests, want 1", n)
		}
	})
}

// TestPostDeadlineAndCancel: the context bounds the whole call; its
// error says which, and the connection is dropped.
func TestPostDeadlineAndCancel(t *testing.T) {
	release := make(chan struct{})
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c := newClient(t, Options{})
	discard := func(*Response) error { return nil }

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := c.Post(ctx, srv.URL, nil, nil, discard)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the deadline's", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		testwait.For(t, 5*time.Second, "the second connection", func() bool { return srv.opened.Load() == 2 })
		cancel()
	}()
	err = c.Post(ctx, srv.URL, nil, nil, discard)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want the cancellation's", err)
	}
	if c.Idle() != 0 {
		t.Fatal("an interrupted connection went back to the pool")
	}
	dials := c.Dials()
	if err := c.Post(ctx, srv.URL, nil, nil, discard); !errors.Is(err, context.Canceled) || c.Dials() != dials {
		t.Fatalf("a call with its context already done: %v, %d dials", err, c.Dials()-dials)
	}
}

// TestPostBodyNotReadToTheEnd: a callback that leaves part of the body
// unread leaves the connection closed, not reused with bytes pending.
func TestPostBodyNotReadToTheEnd(t *testing.T) {
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("x"), 1000))
	})
	c := newClient(t, Options{})
	for range 2 {
		err := c.Post(context.Background(), srv.URL, nil, nil, func(r *Response) error {
			if r.ContentLength != 1000 {
				t.Errorf("content length %d", r.ContentLength)
			}
			_, err := io.ReadFull(r.Body, make([]byte, 10))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if c.Dials() != 2 || c.Idle() != 0 {
		t.Fatalf("%d dials, %d idle, want 2 and 0", c.Dials(), c.Idle())
	}
}

// TestPostRefusesInvalidHeaders: a header that would split the request
// is an error before anything is sent.
func TestPostRefusesInvalidHeaders(t *testing.T) {
	s := newRawServer(t, func(int64) rawAnswer { return rawAnswer{bytes: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"} })
	c := newClient(t, Options{})
	for _, h := range []http.Header{
		{"X-A": {"b\r\nX-Injected: 1"}},
		{"X A": {"b"}},
		{"X-A": {"nul\x00"}},
	} {
		if err := c.Post(context.Background(), s.addr, h, nil, func(*Response) error { return nil }); err == nil {
			t.Fatalf("header %q accepted", h)
		}
	}
	if n := s.accepted.Load(); n != 0 || c.Dials() != 0 {
		t.Fatalf("%d connections dialed, %d accepted, for calls refused before", c.Dials(), n)
	}
	if _, err := New(Options{Header: http.Header{"X-A": {"a\nb"}}}); err == nil {
		t.Fatal("New accepted an invalid header")
	}
}

func TestSupportedURLs(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"http://127.0.0.1:8000/tokenize", true},
		{"http://[::1]:8000/tokenize", true},
		{"http://engine/tokenize", true},
		{"https://engine/tokenize", false},
		{"http://", false},
		{"http://user:pw@engine/tokenize", false},
		{"unix:///run/engine.sock", false},
	} {
		// Supports is the cheap check of the scheme; the URL's parse
		// refuses the rest when a call is made.
		_, err := parseTarget(tc.url)
		if ok := Supports(tc.url) && err == nil; ok != tc.ok {
			t.Errorf("%s: supported %v (parse error %v), want %v", tc.url, ok, err, tc.ok)
		}
	}
	if tg, _ := parseTarget("http://engine/v1/tokenize?a=b"); tg.addr != "engine:80" || tg.host != "engine" || tg.path != "/v1/tokenize?a=b" {
		t.Fatalf("target %+v", tg)
	}
	if tg, _ := parseTarget("http://engine:8000"); tg.path != "/" {
		t.Fatalf("target %+v", tg)
	}
}

// TestIdleConnectionsClose: connections idle for IdleTimeout are closed
// by the client's timer; Close closes the idle ones at once, and every
// later call's connection after its call.
func TestIdleConnectionsClose(t *testing.T) {
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	c := newClient(t, Options{IdleTimeout: 50 * time.Millisecond})
	discard := func(r *Response) error { _, err := io.Copy(io.Discard, r.Body); return err }
	if err := c.Post(context.Background(), srv.URL, nil, nil, discard); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the idle connection to close", func() bool { return srv.closed.Load() == 1 && c.Idle() == 0 })

	c = newClient(t, Options{})
	if err := c.Post(context.Background(), srv.URL, nil, nil, discard); err != nil {
		t.Fatal(err)
	}
	if c.Idle() != 1 {
		t.Fatalf("idle %d, want 1", c.Idle())
	}
	c.Close()
	testwait.For(t, 5*time.Second, "Close to close the idle connection", func() bool { return srv.closed.Load() == 2 })
	if err := c.Post(context.Background(), srv.URL, nil, nil, discard); err != nil {
		t.Fatalf("call after Close: %v", err)
	}
	testwait.For(t, 5*time.Second, "the call's connection to close", func() bool { return srv.closed.Load() == 3 })
	if c.Idle() != 0 {
		t.Fatal("a closed client kept a connection")
	}
}

// TestPoolBounds: no more idle connections are kept than MaxIdlePerHost.
func TestPoolBounds(t *testing.T) {
	var arrived sync.WaitGroup
	arrived.Add(5)
	gate := make(chan struct{})
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		<-gate
		_, _ = w.Write([]byte("ok"))
	})
	c := newClient(t, Options{MaxIdlePerHost: 2})
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			err := c.Post(context.Background(), srv.URL, nil, nil, func(r *Response) error {
				_, err := io.Copy(io.Discard, r.Body)
				return err
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	arrived.Wait()
	close(gate)
	wg.Wait()
	if c.Dials() != 5 || c.Idle() != 2 {
		t.Fatalf("%d dials, %d idle, want 5 and 2", c.Dials(), c.Idle())
	}
	testwait.For(t, 5*time.Second, "the other three to close", func() bool { return srv.closed.Load() == 3 })
}

// TestPostLongBody: a body too long for the pooled buffer is written
// after the headers, whole.
func TestPostLongBody(t *testing.T) {
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || int64(len(b)) != r.ContentLength {
			http.Error(w, "short body", http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte(strconv.Itoa(len(b)) + " " + string(b[len(b)-5:])))
	})
	c := newClient(t, Options{})
	for _, n := range []int{maxPooledWrite - 300, maxPooledWrite, 3 * maxPooledWrite} {
		body := append(bytes.Repeat([]byte("a"), n-5), "12345"...)
		var st int
		var b []byte
		if err := c.Post(context.Background(), srv.URL, nil, body, readAll(&st, &b)); err != nil {
			t.Fatal(err)
		}
		if want := strconv.Itoa(n) + " 12345"; st != 200 || string(b) != want {
			t.Fatalf("%d-byte body: %d %q, want %q", n, st, b, want)
		}
	}
	if c.Dials() != 1 {
		t.Fatalf("%d dials", c.Dials())
	}
}

// TestPostSkipsIdleConnectionsTheServerClosed: an engine closes idle
// keep-alive connections itself (vLLM's uvicorn after 5 s). The next call
// does not fail on them: they are found closed when taken, and a call
// that failed on one anyway is made again on a new connection.
func TestPostSkipsIdleConnectionsTheServerClosed(t *testing.T) {
	var calls sync.WaitGroup
	calls.Add(3)
	gate := make(chan struct{})
	srv := newConnServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-gate:
		default:
			calls.Done()
			<-gate
		}
		_, _ = w.Write([]byte("ok"))
	})
	c := newClient(t, Options{})
	post := func() error {
		return c.Post(context.Background(), srv.URL, nil, nil, func(r *Response) error {
			_, err := io.Copy(io.Discard, r.Body)
			return err
		})
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := post(); err != nil {
				t.Error(err)
			}
		})
	}
	calls.Wait()
	close(gate)
	wg.Wait()
	if c.Idle() != 3 {
		t.Fatalf("%d idle connections, want 3", c.Idle())
	}
	srv.CloseClientConnections()
	testwait.For(t, 5*time.Second, "the server to close them", func() bool { return srv.closed.Load() == 3 })
	if err := post(); err != nil {
		t.Fatalf("call after the server closed every idle connection: %v", err)
	}
	if c.Dials() != 4 || c.Idle() != 1 {
		t.Fatalf("%d dials, %d idle, want 4 and 1", c.Dials(), c.Idle())
	}
}

// TestConnAlive: an open quiet connection is alive; one the peer closed,
// or on which it sent bytes nobody asked for, is not.
func TestConnAlive(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (client, server net.Conn) {
		accepted := make(chan net.Conn, 1)
		go func() {
			s, _ := ln.Accept()
			accepted <- s
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s := <-accepted
		if s == nil {
			t.Fatal("accept failed")
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	c, _ := pair()
	if !connAlive(c) {
		t.Fatal("an open connection reads as dead")
	}
	c, s := pair()
	s.Close()
	testwait.For(t, 5*time.Second, "the close to be seen", func() bool { return !connAlive(c) })
	c, s = pair()
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the unasked byte to be seen", func() bool { return !connAlive(c) })
	// The peek took nothing: the byte is still there to read.
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
		t.Fatalf("read %q, %v", b, err)
	}
}
