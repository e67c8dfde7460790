package zmqsub

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// fastCfg keeps hostile-peer tests short: small timeouts, quick backoff.
func fastCfg(addr string) Config {
	return Config{
		Endpoint:     "tcp://" + addr,
		ProbeTimeout: 200 * time.Millisecond,
		DialTimeout:  300 * time.Millisecond,
		BackoffMin:   10 * time.Millisecond,
		BackoffMax:   50 * time.Millisecond,
	}
}

// stopPromptly cancels Run and checks it returns quickly.
func stopPromptly(t *testing.T, r *running) {
	t.Helper()
	start := time.Now()
	r.stop()
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("Run took %v to return after cancel", el)
	}
}

// TestHostileBeforeSession: peers that are not ZMQ publishers never produce
// a session, never hang Run, and are retried with backoff.
func TestHostileBeforeSession(t *testing.T) {
	httpSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("hello"))
	}))
	defer httpSrv.Close()

	for _, tc := range []struct {
		name  string
		addr  func(t *testing.T) string
		probe bool // fails at the probe (else: in the guarded handshake)
	}{
		{"silent", func(t *testing.T) string { return fakeServer(t, holdOpen) }, true},
		{"http", func(*testing.T) string { return httpSrv.Listener.Addr().String() }, true},
		{"ssh-banner", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) { c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n")); holdOpen(c) })
		}, true},
		{"garbage", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) {
				b := make([]byte, 4096)
				for i := range b {
					b[i] = byte(rand.IntN(256))
				}
				b[0] = 'G' // not 0xff: never a ZMTP signature
				c.Write(b)
				holdOpen(c)
			})
		}, true},
		{"signature-then-silence", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) { c.Write(zmtpGreeting("NULL", 3)[:10]); holdOpen(c) })
		}, false},
		{"zmtp2", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) { c.Write(zmtpGreeting("NULL", 2)); holdOpen(c) })
		}, false},
		{"plain-mechanism", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) { c.Write(zmtpGreeting("PLAIN", 3)); holdOpen(c) })
		}, false},
		{"truncated-metadata", func(t *testing.T) string {
			// A property cut inside its length (zmq4, used once, panicked on it).
			bad := zmtpCommand("READY", append(zmtpProp("Socket-Type", "PUB"), 5, 'H', 'e', 'l', 'l', 'o', 0, 0))
			return fakeServer(t, func(c net.Conn) { serverHandshake(c, bad); holdOpen(c) })
		}, false},
		{"wrong-socket-type", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) { serverHandshake(c, zmtpReady("REP")); holdOpen(c) })
		}, false},
		{"error-command", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) {
				serverHandshake(c, zmtpCommand("ERROR", append([]byte{6}, "denied"...)))
				holdOpen(c)
			})
		}, false},
		{"huge-ready", func(t *testing.T) string {
			hdr := []byte{flagCommand | flagLong, 0, 0, 0, 0, 0x10, 0, 0, 0}
			return fakeServer(t, func(c net.Conn) { serverHandshake(c, hdr); holdOpen(c) })
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.addr(t)
			fd0 := countFDs(t)
			r := startRun(t, fastCfg(addr))
			testwait.For(t, 10*time.Second, "3 dial errors", func() bool { return r.s.Stats().DialErrors >= 3 })
			stopPromptly(t, r)
			// Failed handshakes leave no connection open on either side.
			testwait.For(t, 5*time.Second, "fds back to baseline", func() bool { return countFDs(t) <= fd0 })
			st := r.s.Stats()
			if st.Sessions != 0 || st.Connected {
				t.Fatalf("a session began: %+v", st)
			}
			isProbe := strings.Contains(st.LastError, "probe")
			if isProbe != tc.probe {
				t.Fatalf("failed at probe=%v, want %v: %s", isProbe, tc.probe, st.LastError)
			}
			t.Logf("%d dial errors, last: %s", st.DialErrors, st.LastError)
			select {
			case e := <-r.rec.ch:
				t.Fatalf("unexpected handler event %s", e.kind)
			default:
			}
		})
	}
}

// TestHostileAfterHandshake: a peer that completes a valid handshake and
// then misbehaves ends the session (Disconnected), is re-dialled, and never
// takes the process down.
func TestHostileAfterHandshake(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxFrame   int64
		after      func() []byte
		wantGuard  bool
		checkAlloc bool
		sessions   int // default 3
	}{
		{name: "frame-2^60", after: func() []byte { return []byte{flagLong, 0x10, 0, 0, 0, 0, 0, 0, 0} }, wantGuard: true},
		{name: "frame-2^63", after: func() []byte { return []byte{flagLong | flagMore, 0x80, 0, 0, 0, 0, 0, 0, 0} }, wantGuard: true},
		{name: "command-2^48", after: func() []byte { return []byte{flagLong | flagCommand, 0, 1, 0, 0, 0, 0, 0, 0} }, wantGuard: true},
		// 512 MiB is allocatable: without the guard the reader would make([]byte) it.
		{name: "frame-512MiB", maxFrame: 1 << 20, after: func() []byte { return []byte{flagLong, 0, 0, 0, 0, 0x20, 0, 0, 0} }, wantGuard: true, checkAlloc: true},
		{name: "many-frames", maxFrame: 1 << 20, after: func() []byte {
			var b []byte
			for range 100 {
				b = append(b, zmtpFrame(flagMore, make([]byte, 100))...)
			}
			return b
		}, wantGuard: true},
		{name: "message-over-budget", maxFrame: 1 << 16, after: func() []byte {
			var b []byte
			for range 3 {
				b = append(b, zmtpFrame(flagMore, make([]byte, 1<<16))...)
			}
			return b
		}, wantGuard: true},
		{name: "reserved-flags", after: func() []byte { return []byte{0x80, 1, 0} }, wantGuard: true},
		{name: "random-bytes", after: func() []byte {
			b := make([]byte, 64<<10)
			for i := range b {
				b[i] = byte(rand.IntN(256))
			}
			return b
		}, sessions: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeServer(t, func(c net.Conn) {
				if serverHandshake(c, zmtpReady("PUB")) != nil {
					return
				}
				c.Write(tc.after())
				if tc.wantGuard {
					holdOpen(c) // only the guard may end the session
				}
				// Closing ends a session the guard let through (random bytes).
			})
			cfg := fastCfg(addr)
			cfg.MaxFrameSize = tc.maxFrame
			fd0 := countFDs(t)
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			r := startRun(t, cfg)
			for i := range max(tc.sessions, 3) {
				r.rec.expect(t, "connected", 10*time.Second)
				var e event
				for e = r.rec.next(t, 10*time.Second); e.kind == "message"; e = r.rec.next(t, 10*time.Second) {
				}
				if e.kind != "disconnected" {
					t.Fatalf("session %d: got %s, want disconnected", i, e.kind)
				}
				var ge *GuardError
				if tc.wantGuard && !errors.As(e.err, &ge) {
					t.Fatalf("session %d ended with %v, want a GuardError", i, e.err)
				}
				if i == 0 {
					t.Logf("session ended: %v", e.err)
				}
			}
			stopPromptly(t, r)
			testwait.For(t, 5*time.Second, "fds back to baseline", func() bool { return countFDs(t) <= fd0 })
			if tc.checkAlloc {
				var after runtime.MemStats
				runtime.ReadMemStats(&after)
				if d := after.TotalAlloc - before.TotalAlloc; d > 64<<20 {
					t.Fatalf("allocated %d MiB: the announced frame reached an allocation", d>>20)
				}
			}
		})
	}
}

// TestFrameFilter: only [topic, 8-byte seq, payload] reaches the handler;
// everything else is counted as dropped, and the session survives it.
func TestFrameFilter(t *testing.T) {
	seq := seqBytes(7)
	stream := []byte{}
	for _, m := range [][]byte{
		zmtpMessage([]byte("kv@a"), seq),                                    // 2 frames
		zmtpMessage([]byte("kv@a"), seq, []byte("p"), []byte("x")),          // 4 frames
		zmtpMessage([]byte("kv@a"), seq[:7], []byte("p")),                   // 7-byte seq
		zmtpMessage([]byte("kv@a")),                                         // 1 frame
		zmtpMessage([]byte("other"), seq, []byte("p")),                      // topic not subscribed
		zmtpCommand("PING", []byte{0, 10}),                                  // heartbeat
		zmtpMessage([]byte("kv@a"), append(seq, 0), []byte("p")),            // 9-byte seq
		zmtpMessage([]byte("kv@good"), seqBytes(42), []byte("the payload")), // delivered
	} {
		stream = append(stream, m...)
	}
	addr := fakeServer(t, func(c net.Conn) {
		if serverHandshake(c, zmtpReady("PUB")) != nil {
			return
		}
		c.Write(stream)
		holdOpen(c)
	})
	cfg := fastCfg(addr)
	cfg.Topic = "kv@"
	r := startRun(t, cfg)
	r.rec.expect(t, "connected", 10*time.Second)
	e := r.rec.expect(t, "message", 10*time.Second)
	if e.topic != "kv@good" || e.seq != 42 || string(e.payload) != "the payload" {
		t.Fatalf("delivered %q %d %q", e.topic, e.seq, e.payload)
	}
	st := r.s.Stats()
	if st.Dropped != 7 || st.Messages != 1 || !st.Connected {
		t.Fatalf("stats %+v, want 7 dropped, 1 message, connected", st)
	}
}

// TestFrameFilterLibzmq: malformed messages from a real libzmq publisher.
func TestFrameFilterLibzmq(t *testing.T) {
	peer := startPeer(t, "pub", "--xpub", "--bind", "tcp://127.0.0.1:0")
	r := startRun(t, Config{Endpoint: tcpEP(peer.port())})
	r.rec.expect(t, "connected", 10*time.Second)
	peer.do("waitsub 10")
	for _, raw := range []string{
		"raw 6b76 0000000000000001",                  // 2 frames
		"raw 6b76 0000000000000001 aa bb",            // 4 frames
		"raw 6b76 00000000000001 aa",                 // 7-byte seq
		"raw 6b76",                                   // 1 frame
		"raw - 000000000000000001 aa",                // 9-byte seq
		"raw 6b76 0000000000000009 " + hexOf("good"), // delivered
	} {
		if got := peer.do(raw); got != "OK" {
			t.Fatalf("%s: %s", raw, got)
		}
	}
	e := r.rec.expect(t, "message", 10*time.Second)
	if e.topic != "kv" || e.seq != 9 || string(e.payload) != "good" {
		t.Fatalf("delivered %q %d %q", e.topic, e.seq, e.payload)
	}
	if st := r.s.Stats(); st.Dropped != 5 || st.Messages != 1 {
		t.Fatalf("stats %+v, want 5 dropped, 1 message", st)
	}
}

func hexOf(s string) string {
	const digits = "0123456789abcdef"
	var b strings.Builder
	for i := range len(s) {
		b.WriteByte(digits[s[i]>>4])
		b.WriteByte(digits[s[i]&15])
	}
	return b.String()
}

// TestIdleTimeout: with IdleTimeout set, a silent publisher is re-dialled.
func TestIdleTimeout(t *testing.T) {
	addr := fakeServer(t, func(c net.Conn) {
		if serverHandshake(c, zmtpReady("PUB")) == nil {
			holdOpen(c)
		}
	})
	cfg := fastCfg(addr)
	cfg.IdleTimeout = 200 * time.Millisecond
	r := startRun(t, cfg)
	r.rec.expect(t, "connected", 10*time.Second)
	e := r.rec.expect(t, "disconnected", 10*time.Second)
	if !errors.Is(e.err, ErrIdle) {
		t.Fatalf("Disconnected(%v), want ErrIdle", e.err)
	}
	r.rec.expect(t, "connected", 10*time.Second)
	if st := r.s.Stats(); st.Reconnects < 1 || st.Sessions < 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"empty", Config{}},
		{"ipc", Config{Endpoint: "ipc:///tmp/x"}},
		{"no-port", Config{Endpoint: "tcp://127.0.0.1"}},
		{"bad-port", Config{Endpoint: "tcp://127.0.0.1:99999"}},
		{"connect-wildcard", Config{Endpoint: "tcp://*:5557"}},
		{"connect-port-0", Config{Endpoint: "tcp://127.0.0.1:0"}},
		{"negative-timeout", Config{Endpoint: "tcp://127.0.0.1:5557", DialTimeout: -1}},
		{"negative-frame", Config{Endpoint: "tcp://127.0.0.1:5557", MaxFrameSize: -1}},
		{"backoff-inverted", Config{Endpoint: "tcp://127.0.0.1:5557", BackoffMin: time.Second, BackoffMax: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Run(t.Context(), tc.cfg, newRecorder()); err == nil {
				t.Fatal("Run accepted an invalid config")
			}
		})
	}
	if err := Run(t.Context(), Config{Endpoint: "tcp://127.0.0.1:5557"}, nil); err == nil {
		t.Fatal("Run accepted a nil handler")
	}
	s, err := NewSubscriber(Config{Endpoint: "tcp://*:0", Bind: true})
	if err != nil {
		t.Fatalf("bind wildcard rejected: %v", err)
	}
	_ = s
}

func TestReplayInvalid(t *testing.T) {
	fn := func(uint64, []byte) error { return nil }
	for _, ep := range []string{"", "tcp://*:5558", "ipc:///x", "tcp://127.0.0.1:0"} {
		if err := Replay(t.Context(), ep, 0, 0, fn); err == nil {
			t.Fatalf("Replay(%q) accepted", ep)
		}
	}
	if err := Replay(t.Context(), "tcp://127.0.0.1:1", 0, -1, fn); err == nil {
		t.Fatal("negative maxFrame accepted")
	}
	if err := Replay(t.Context(), "tcp://127.0.0.1:1", 0, 0, nil); err == nil {
		t.Fatal("nil callback accepted")
	}
}

// TestReplayHostile: Replay against non-ZMQ servers and a silent handshake
// fails within its context, without hanging.
func TestReplayHostile(t *testing.T) {
	for name, serve := range map[string]func(net.Conn){
		"silent":    holdOpen,
		"truncated": func(c net.Conn) { serverHandshake(c, zmtpCommand("READY", []byte{11, 'S'})); holdOpen(c) },
		"huge-reply": func(c net.Conn) {
			serverHandshake(c, zmtpReady("ROUTER"))
			io.CopyN(io.Discard, c, 1)
			c.Write([]byte{flagLong, 0x10, 0, 0, 0, 0, 0, 0, 0})
			holdOpen(c)
		},
	} {
		t.Run(name, func(t *testing.T) {
			addr := fakeServer(t, serve)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			err := Replay(ctx, "tcp://"+addr, 0, 0, func(uint64, []byte) error { return nil })
			if err == nil {
				t.Fatal("Replay succeeded against a hostile server")
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("Replay took %v", el)
			}
			t.Logf("%v", err)
		})
	}
}
