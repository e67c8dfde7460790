package earlyreject

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestLimit(t *testing.T) {
	for _, c := range []struct{ maxBody, want int64 }{
		{-1, MinDrain}, {0, MinDrain}, {100, MinDrain},
		{1 << 20, 4 << 20}, {10 << 20, 40 << 20},
		{16 << 20, MaxDrain}, {1 << 40, MaxDrain}, {math.MaxInt64, MaxDrain},
	} {
		if got := Limit(c.maxBody); got != c.want {
			t.Errorf("Limit(%d) = %d, want %d", c.maxBody, got, c.want)
		}
	}
}

// refusing is a server whose handler refuses every request with a 413 at
// once, without reading (as a declared length over maxBody is), through
// refuse with the given bounds; results receives what refuse did.
func refusing(t *testing.T, maxBody, limit int64, d time.Duration) (*httptest.Server, chan Result) {
	t.Helper()
	results := make(chan Result, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		results <- refuse(w, r, maxBody, limit, d, func() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_, _ = io.WriteString(w, `{"error":"too large"}`)
		})
	}))
	t.Cleanup(srv.Close)
	return srv, results
}

// upload sends a POST with headers extra and a body of n bytes on a raw
// connection, writing all of it before reading the response.
func upload(t *testing.T, addr string, n int, extra string) (*http.Response, string, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	w := bufio.NewWriter(conn)
	fmt.Fprintf(w, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n", n, extra)
	_, _ = w.Write(bytes.Repeat([]byte("x"), n))
	if err := w.Flush(); err != nil {
		return nil, "", err
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(res.Body)
	return res, string(b), err
}

// TestRefuseDrainsWholeBody: a client writing 4 MiB before reading reads
// the 413 and its body; the drain read the whole body and the answer said
// the connection closes.
func TestRefuseDrainsWholeBody(t *testing.T) {
	srv, results := refusing(t, 1<<20, Limit(1<<20), Deadline)
	const n = 4 << 20
	res, body, err := upload(t, srv.Listener.Addr().String(), n, "")
	if err != nil || res.StatusCode != http.StatusRequestEntityTooLarge || body != `{"error":"too large"}` {
		t.Fatalf("answer: %v %v %q", res, err, body)
	}
	if !res.Close {
		t.Error("the answer does not say Connection: close")
	}
	if r := <-results; r.Skipped != "" || r.Drained != n || !r.Complete {
		t.Errorf("result %+v, want the whole %d bytes drained", r, n)
	}
}

// TestRefuseStopsAtLimit: a body longer than the limit is drained only up
// to the limit.
func TestRefuseStopsAtLimit(t *testing.T) {
	srv, results := refusing(t, 0, 256<<10, Deadline)
	go func() { _, _, _ = upload(t, srv.Listener.Addr().String(), 8<<20, "") }()
	if r := <-results; r.Drained != 256<<10 || r.Complete {
		t.Errorf("result %+v, want 256 KiB drained, incomplete", r)
	}
}

// TestRefuseDeadline: a client that declares a body and stalls holds the
// drain until the deadline only, and still gets the answer.
func TestRefuseDeadline(t *testing.T) {
	srv, results := refusing(t, 0, MinDrain, 200*time.Millisecond)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nonly this")
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("answer before the drain ended: %v %v", res, err)
	}
	if r := <-results; r.Drained != int64(len("only this")) || r.Complete {
		t.Errorf("result %+v, want the 9 bytes sent, incomplete", r)
	}
}

// TestRefuseExpectContinue: a client waiting for 100 Continue is refused
// without a drain (it sends nothing; a drain would wait for nothing).
func TestRefuseExpectContinue(t *testing.T) {
	srv, results := refusing(t, 1<<20, MinDrain, Deadline)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", 2<<20)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("answer: %v %v", res, err)
	}
	if r := <-results; r.Skipped != "expect-continue" {
		t.Errorf("result %+v, want skipped for expect-continue", r)
	}
}

// TestRefuseHTTP2: over HTTP/2 nothing is drained, and a client sending a
// 4 MiB body reads the answer (the server resets the stream after it).
func TestRefuseHTTP2(t *testing.T) {
	results := make(chan Result, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		results <- Refuse(w, r, 1<<20, func() {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			_, _ = io.WriteString(w, "too large")
		})
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	res, err := srv.Client().Post(srv.URL, "text/plain", bytes.NewReader(bytes.Repeat([]byte("x"), 4<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.ProtoMajor != 2 || res.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too large" {
		t.Fatalf("answer: HTTP/%d %d %q %v", res.ProtoMajor, res.StatusCode, b, err)
	}
	if res.Header.Get("Connection") != "" {
		t.Errorf("Connection header over HTTP/2: %q", res.Header.Get("Connection"))
	}
	if r := <-results; r.Skipped != "multiplexed" {
		t.Errorf("result %+v, want skipped as multiplexed", r)
	}
}

// TestRefuseNoBody: a request without a body is answered, nothing drained.
func TestRefuseNoBody(t *testing.T) {
	srv, results := refusing(t, 1<<20, MinDrain, Deadline)
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if r := <-results; r.Skipped != "no body" || res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("result %+v, status %d", r, res.StatusCode)
	}
}
