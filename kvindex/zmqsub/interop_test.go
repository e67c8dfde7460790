package zmqsub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

const testTopic = "kv@pod-1@model"

// checkBatches reads n message events and checks they are seq first..first+n-1
// with zmqpeer.py's payloads.
func checkBatches(t *testing.T, rec *recorder, topic string, first uint64, n, size int) {
	t.Helper()
	for i := range n {
		e := rec.expect(t, "message", 10*time.Second)
		want := first + uint64(i)
		if e.seq != want {
			t.Fatalf("batch %d: seq %d, want %d", i, e.seq, want)
		}
		if e.topic != topic {
			t.Fatalf("seq %d: topic %q, want %q", e.seq, e.topic, topic)
		}
		if !bytes.Equal(e.payload, payloadFor(want, size)) {
			t.Fatalf("seq %d: payload differs (%d bytes, want %d)", e.seq, len(e.payload), size)
		}
	}
}

func TestInteropLibzmqPublisher(t *testing.T) {
	peer := startPeer(t, "pub", "--xpub", "--bind", "tcp://127.0.0.1:0")
	port := peer.port()
	r := startRun(t, Config{Endpoint: tcpEP(port), Topic: "kv@"})
	r.rec.expect(t, "connected", 10*time.Second)
	if got := peer.do("waitsub 10"); got != "SUB "+fmt.Sprintf("%x", append([]byte{1}, "kv@"...)) {
		t.Fatalf("publisher saw subscription %q", got)
	}
	if got := peer.do("pub 300 " + testTopic + " 1700"); got != "OK 299" {
		t.Fatalf("pub: %q", got)
	}
	checkBatches(t, r.rec, testTopic, 0, 300, 1700)

	// The publisher filters on the prefix: a foreign topic never arrives,
	// the next matching batch does (seq 300 went to the foreign topic).
	peer.do("pub 1 other@pod 10")
	peer.do("pub 2 " + testTopic + " 0")
	checkBatches(t, r.rec, testTopic, 301, 2, 0)

	st := r.s.Stats()
	if !st.Connected || st.Sessions != 1 || st.Messages != 302 || st.Dropped != 0 || st.Reconnects != 0 {
		t.Fatalf("stats %+v", st)
	}
	if time.Since(st.LastMessage) > time.Minute {
		t.Fatalf("LastMessage %v not set", st.LastMessage)
	}
	r.stop()
	e := r.rec.expect(t, "disconnected", time.Second)
	if !errors.Is(e.err, context.Canceled) {
		t.Fatalf("Disconnected(%v), want context.Canceled", e.err)
	}
}

// TestInteropPlainPUB uses a PUB socket exactly like vLLM's: there is no way
// to see our subscription arrive, so batches are published until the first
// one gets through; from then on nothing may be lost or reordered.
func TestInteropPlainPUB(t *testing.T) {
	peer := startPeer(t, "pub", "--bind", "tcp://127.0.0.1:0")
	r := startRun(t, Config{Endpoint: tcpEP(peer.port())})
	r.rec.expect(t, "connected", 10*time.Second)
	var first event
	for deadline := time.Now().Add(10 * time.Second); ; {
		peer.do("pub 1 - 64")
		select {
		case first = <-r.rec.ch:
		case <-time.After(50 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("no batch within 10s")
			}
			continue
		}
		break
	}
	if first.kind != "message" || !bytes.Equal(first.payload, payloadFor(first.seq, 64)) {
		t.Fatalf("first event %+v", first)
	}
	// Batches published while the first was in flight arrive next.
	last := peer.do("pub 500 - 64")
	var lastSeq uint64
	fmt.Sscanf(last, "OK %d", &lastSeq)
	checkBatches(t, r.rec, "", first.seq+1, int(lastSeq-first.seq), 64)
}

func TestReplayLayouts(t *testing.T) {
	for _, layout := range []string{"old", "new"} {
		t.Run(layout, func(t *testing.T) {
			peer := startPeer(t, "router", "--layout", layout, "--count", "50", "--size", "300", "--bind", "tcp://127.0.0.1:0")
			ep := tcpEP(peer.port())
			for _, tc := range []struct {
				start uint64
				want  int
			}{{20, 30}, {0, 50}, {49, 1}, {50, 0}, {1 << 40, 0}} {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var got []uint64
				err := Replay(ctx, ep, tc.start, 0, func(seq uint64, payload []byte) error {
					if !bytes.Equal(payload, payloadFor(seq, 300)) {
						return fmt.Errorf("seq %d: wrong payload", seq)
					}
					got = append(got, seq)
					return nil
				})
				cancel()
				if err != nil {
					t.Fatalf("start %d: %v", tc.start, err)
				}
				if len(got) != tc.want {
					t.Fatalf("start %d: %d batches, want %d", tc.start, len(got), tc.want)
				}
				for i, s := range got {
					if s != tc.start+uint64(i) {
						t.Fatalf("start %d: batch %d has seq %d", tc.start, i, s)
					}
				}
			}
		})
	}
}

func TestReplayCallbackError(t *testing.T) {
	peer := startPeer(t, "router", "--layout", "new", "--count", "10", "--bind", "tcp://127.0.0.1:0")
	stop := errors.New("stop here")
	calls := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := Replay(ctx, tcpEP(peer.port()), 0, 0, func(uint64, []byte) error {
		calls++
		if calls == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		t.Fatalf("err %v after %d calls, want %v after 3", err, calls, stop)
	}
}

func TestReplayFailures(t *testing.T) {
	for _, tc := range []struct {
		layout   string
		want     error
		deadline time.Duration
	}{
		{"silent", context.DeadlineExceeded, time.Second},
		{"garbage", ErrReplayFrame, 10 * time.Second},
		{"shortseq", ErrReplayFrame, 10 * time.Second},
	} {
		t.Run(tc.layout, func(t *testing.T) {
			peer := startPeer(t, "router", "--layout", tc.layout, "--bind", "tcp://127.0.0.1:0")
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			start := time.Now()
			err := Replay(ctx, tcpEP(peer.port()), 0, 0, func(uint64, []byte) error {
				return errors.New("callback must not run")
			})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if el := time.Since(start); el > tc.deadline+4*time.Second {
				t.Fatalf("Replay took %v", el)
			}
			t.Logf("error: %v", err)
		})
	}
}

// TestInteropLibzmqHeartbeats: a libzmq publisher with ZMTP heartbeats on
// pings the subscriber and drops it after 3 intervals without a PONG. The
// subscriber answers, whether it dialled the publisher or the publisher
// connected to it. (zmq4, which the subscriber used before, never
// answered, and libzmq dropped it.)
func TestInteropLibzmqHeartbeats(t *testing.T) {
	t.Run("connect", func(t *testing.T) {
		peer := startPeer(t, "pub", "--xpub", "--heartbeat", "50", "--bind", "tcp://127.0.0.1:0")
		r := startRun(t, Config{Endpoint: tcpEP(peer.port()), Topic: "kv@"})
		checkHeartbeatsAnswered(t, r, peer)
	})
	t.Run("bind", func(t *testing.T) {
		r := startRun(t, Config{Endpoint: "tcp://127.0.0.1:0", Bind: true, Topic: "kv@"})
		testwait.For(t, 10*time.Second, "bind", func() bool { return r.s.BoundAddr() != "" })
		peer := startPeer(t, "pub", "--xpub", "--heartbeat", "50", "--connect", "tcp://"+r.s.BoundAddr())
		if l := peer.line(10 * time.Second); l != "READY" {
			t.Fatalf("peer said %q", l)
		}
		checkHeartbeatsAnswered(t, r, peer)
	})
}

// checkHeartbeatsAnswered: after ten pings (over three of the publisher's
// timeouts) the subscriber's first session still stands and batches
// arrive.
func checkHeartbeatsAnswered(t *testing.T, r *running, peer *pyPeer) {
	t.Helper()
	r.rec.expect(t, "connected", 10*time.Second)
	if got := peer.do("waitsub 10"); !strings.HasPrefix(got, "SUB ") {
		t.Fatalf("publisher saw no subscription: %q", got)
	}
	testwait.For(t, 10*time.Second, "ten pings", func() bool { return r.s.Stats().Dropped >= 10 })
	if got := peer.do("pub 3 " + testTopic + " 100"); got != "OK 2" {
		t.Fatalf("pub: %q", got)
	}
	checkBatches(t, r.rec, testTopic, 0, 3, 100)
	if st := r.s.Stats(); st.Sessions != 1 || st.Reconnects != 0 || !st.Connected {
		t.Fatalf("the publisher dropped the subscriber: %+v", st)
	}
}
