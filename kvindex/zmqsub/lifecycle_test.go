package zmqsub

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/testutil/pyzmq"
)

// TestPublisherRestart kills the libzmq publisher (like kill -9 of an
// engine) and starts a new one on the same port: the subscriber must report
// Disconnected, then Connected and batches again soon after it returns
// (target: within 1 s; asserted with a generous 3 s).
func TestPublisherRestart(t *testing.T) {
	peer := startPeer(t, "pub", "--xpub", "--bind", "tcp://127.0.0.1:0")
	port := peer.port()
	r := startRun(t, Config{Endpoint: tcpEP(port)})
	r.rec.expect(t, "connected", 10*time.Second)
	peer.do("waitsub 10")
	peer.do("pub 20 " + testTopic + " 100")
	checkBatches(t, r.rec, testTopic, 0, 20, 100)

	for round := range 3 {
		peer.kill()
		if e := r.rec.expect(t, "disconnected", 10*time.Second); e.err == nil {
			t.Fatal("Disconnected(nil) after publisher death")
		}
		time.Sleep(300 * time.Millisecond) // the engine is down for a while
		peer = startPeer(t, "pub", "--xpub", "--bind", tcpEP(port))
		if p := peer.port(); p != port {
			t.Fatalf("restarted on port %d, want %d", p, port)
		}
		back := time.Now()
		c := r.rec.expect(t, "connected", 10*time.Second)
		peer.do("waitsub 10")
		peer.do("pub 5 " + testTopic + " 100")
		checkBatches(t, r.rec, testTopic, 0, 5, 100) // a new process counts from 0
		reconnect := c.at.Sub(back)
		t.Logf("round %d: resubscribed %v after the publisher returned", round, reconnect)
		if reconnect > 3*time.Second {
			t.Fatalf("round %d: reconnect took %v", round, reconnect)
		}
	}
	st := r.s.Stats()
	if st.Sessions != 4 || st.Reconnects != 3 || st.Messages != 35 {
		t.Fatalf("stats %+v", st)
	}
}

// freePort returns a port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// TestPublisherStartsLater: Run before the engine is up keeps retrying.
func TestPublisherStartsLater(t *testing.T) {
	pyzmq.Require(t)
	port := freePort(t)
	r := startRun(t, Config{Endpoint: tcpEP(port)})
	testwait.For(t, 10*time.Second, "dial errors", func() bool { return r.s.Stats().DialErrors >= 3 })
	peer := startPeer(t, "pub", "--xpub", "--bind", tcpEP(port))
	peer.port()
	back := time.Now()
	c := r.rec.expect(t, "connected", 10*time.Second)
	t.Logf("connected %v after the publisher started (%d dial errors before)", c.at.Sub(back), r.s.Stats().DialErrors)
	peer.do("waitsub 10")
	peer.do("pub 3 " + testTopic + " 10")
	checkBatches(t, r.rec, testTopic, 0, 3, 10)
}

// TestBindMode: libzmq publishers connect to our bound SUB; a publisher
// that goes away and comes back is served again.
func TestBindMode(t *testing.T) {
	pyzmq.Require(t)
	r := startRun(t, Config{Endpoint: "tcp://127.0.0.1:0", Bind: true})
	testwait.For(t, 10*time.Second, "bind", func() bool { return r.s.BoundAddr() != "" })
	ep := "tcp://" + r.s.BoundAddr()
	for round := range 3 {
		peer := startPeer(t, "pub", "--xpub", "--connect", ep)
		if l := peer.line(10 * time.Second); l != "READY" {
			t.Fatalf("peer said %q", l)
		}
		r.rec.expect(t, "connected", 10*time.Second)
		if got := peer.do("waitsub 10"); !hasPrefix(got, "SUB") {
			t.Fatalf("no subscription reached the connecting publisher: %q", got)
		}
		peer.do("pub 50 " + testTopic + " 1000")
		checkBatches(t, r.rec, testTopic, 0, 50, 1000)
		if !r.s.Stats().Connected {
			t.Fatal("Stats.Connected false with a publisher attached")
		}
		peer.kill()
		r.rec.expect(t, "disconnected", 10*time.Second)
		t.Logf("round %d ok", round)
	}
	if st := r.s.Stats(); st.Sessions != 3 || st.Messages != 150 || st.Connected {
		t.Fatalf("stats %+v", st)
	}
}

// TestBindModeGuard: the guard also protects the listening side.
func TestBindModeGuard(t *testing.T) {
	r := startRun(t, Config{Endpoint: "tcp://127.0.0.1:0", Bind: true, MaxFrameSize: 1 << 20, DialTimeout: 300 * time.Millisecond})
	testwait.For(t, 10*time.Second, "bind", func() bool { return r.s.BoundAddr() != "" })
	addr := r.s.BoundAddr()
	dialPub := func(after []byte) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := serverHandshake(c, zmtpReady("PUB")); err != nil {
			t.Fatal(err)
		}
		c.Write(after)
		return c
	}
	// A silent client must not block other publishers; the guard's
	// handshake deadline frees its goroutine.
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	c := dialPub(zmtpMessage([]byte("t"), seqBytes(1), []byte("ok")))
	r.rec.expect(t, "connected", 10*time.Second)
	if e := r.rec.expect(t, "message", 10*time.Second); e.seq != 1 {
		t.Fatalf("seq %d", e.seq)
	}
	c.Close()
	r.rec.expect(t, "disconnected", 10*time.Second)

	dialPub([]byte{flagLong, 0x10, 0, 0, 0, 0, 0, 0, 0})
	r.rec.expect(t, "connected", 10*time.Second)
	e := r.rec.expect(t, "disconnected", 10*time.Second)
	var ge *GuardError
	if !errors.As(e.err, &ge) {
		t.Fatalf("Disconnected(%v), want a GuardError", e.err)
	}
	// Malformed metadata is refused by the guard, and no session is
	// reported (it panicked zmq4's accept goroutine, used once).
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	serverHandshake(c, zmtpCommand("READY", []byte{11, 'S', 'o'}))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	holdOpen(c)
	c.Close()
	select {
	case e := <-r.rec.ch:
		t.Fatalf("unexpected %s after a refused handshake", e.kind)
	case <-time.After(100 * time.Millisecond):
	}
}

// blockingHandler stalls in Message until released, so batches pile up
// unread when the session is cancelled (zmq4, used once, leaked then).
type blockingHandler struct {
	connected chan struct{}
	got       atomic.Int64
	release   chan struct{}
}

func (h *blockingHandler) Connected() {
	select {
	case h.connected <- struct{}{}:
	default:
	}
}
func (h *blockingHandler) Message([]byte, uint64, []byte) {
	h.got.Add(1)
	<-h.release
}
func (h *blockingHandler) Disconnected(error) {}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// TestSubscribeCloseCycles: 100 Run/cancel cycles against a live publisher
// streaming batches, each cancelled with batches piling up unread, leak neither
// goroutines nor file descriptors.
func TestSubscribeCloseCycles(t *testing.T) {
	peer := startPeer(t, "pub", "--bind", "tcp://127.0.0.1:0")
	ep := tcpEP(peer.port())
	peer.do("stream - 1700 1")

	cycle := func() {
		h := &blockingHandler{connected: make(chan struct{}, 1), release: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, Config{Endpoint: ep}, h) }()
		select {
		case <-h.connected:
		case <-time.After(10 * time.Second):
			t.Fatal("no connection")
		}
		testwait.For(t, 10*time.Second, "a batch", func() bool { return h.got.Load() > 0 })
		time.Sleep(100 * time.Millisecond) // let batches pile up unread
		cancel()
		close(h.release)
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return")
		}
	}
	cycle() // warm up (lazy runtime goroutines, transport registration)
	runtime.GC()
	g0, fd0 := runtime.NumGoroutine(), countFDs(t)
	start := time.Now()
	for range 100 {
		cycle()
	}
	el := time.Since(start)
	var g1, fd1 int
	testwait.For(t, 5*time.Second, "goroutines and fds to settle", func() bool {
		g1, fd1 = runtime.NumGoroutine(), countFDs(t)
		return g1 <= g0 && fd1 <= fd0
	})
	t.Logf("100 cycles in %v; goroutines %d -> %d, fds %d -> %d", el, g0, g1, fd0, fd1)
}

// TestBindModePeerLimit: past maxPeers publishers, further connections are
// closed as they arrive; once one leaves, the next is served.
func TestBindModePeerLimit(t *testing.T) {
	s, err := NewSubscriber(Config{Endpoint: "tcp://127.0.0.1:0", Bind: true, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.maxPeers = 2
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, rec) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testwait.For(t, 10*time.Second, "bind", func() bool { return s.BoundAddr() != "" })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.BoundAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	first, second := dial(), dial()
	for _, c := range []net.Conn{first, second} {
		if err := serverHandshake(c, zmtpReady("PUB")); err != nil {
			t.Fatal(err)
		}
		rec.expect(t, "connected", 10*time.Second)
	}
	third := dial()
	third.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := third.Read(make([]byte, 1)); err == nil {
		t.Fatalf("a third publisher was served (read %d bytes)", n)
	}
	first.Close()
	rec.expect(t, "disconnected", 10*time.Second)
	// Its slot is free once its goroutine has returned, just after it
	// reported the end.
	testwait.For(t, 10*time.Second, "a publisher served after one left", func() bool {
		return serverHandshake(dial(), zmtpReady("PUB")) == nil
	})
	rec.expect(t, "connected", 10*time.Second)
}
