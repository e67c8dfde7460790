package zmqsub

import (
	"bytes"
	"net"
	"testing"
	"time"
)

// TestSubConnSubscribesAndAnswersPings: after the handshake the subscriber
// sends its subscription as ZMTP 3.0 does (a message: 1, then the topic),
// answers a PING with a PONG carrying the ping's context, counts the ping
// as dropped, and delivers the data message that follows.
func TestSubConnSubscribesAndAnswersPings(t *testing.T) {
	got := make(chan string, 4)
	addr := fakeServer(t, func(c net.Conn) {
		if serverHandshake(c, zmtpReady("PUB")) != nil {
			return // the probe's connection
		}
		_, sub, err := readFrame(c)
		if err != nil {
			got <- "subscription: " + err.Error()
			return
		}
		got <- "subscription " + string(sub)
		c.Write(zmtpCommand("PING", []byte{0, 10, 'c', 't', 'x'}))
		flags, pong, err := readFrame(c)
		if err != nil {
			got <- "pong: " + err.Error()
			return
		}
		if flags&flagCommand == 0 {
			got <- "pong not a command"
			return
		}
		got <- "reply " + string(pong)
		c.Write(zmtpMessage([]byte("kv@x"), seqBytes(7), []byte("batch")))
		holdOpen(c)
	})
	cfg := fastCfg(addr)
	cfg.Topic = "kv@"
	r := startRun(t, cfg)
	r.rec.expect(t, "connected", 5*time.Second)
	for _, want := range []string{"subscription \x01kv@", "reply \x04PONGctx"} {
		select {
		case g := <-got:
			if g != want {
				t.Fatalf("publisher saw %q, want %q", g, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("publisher did not see %q", want)
		}
	}
	e := r.rec.expect(t, "message", 5*time.Second)
	if e.topic != "kv@x" || e.seq != 7 || string(e.payload) != "batch" {
		t.Fatalf("delivered %q seq %d %q", e.topic, e.seq, e.payload)
	}
	if st := r.s.Stats(); st.Messages != 1 || st.Dropped != 1 {
		t.Fatalf("messages %d dropped %d, want 1 and 1 (the ping)", st.Messages, st.Dropped)
	}
}

// TestSubConnMessagesMayBeKept: the handler may keep what it is given; a
// later message, smaller (read where the earlier one was), larger, or past
// the buffer the connection keeps between messages, leaves earlier ones
// intact.
func TestSubConnMessagesMayBeKept(t *testing.T) {
	sizes := []int{3000, 100, maxKeptBuffer + 1, 50, 60}
	addr := fakeServer(t, func(c net.Conn) {
		if serverHandshake(c, zmtpReady("PUB")) != nil {
			return
		}
		for i, n := range sizes {
			c.Write(zmtpMessage([]byte("t"), seqBytes(uint64(i)), payloadFor(uint64(i), n)))
		}
		holdOpen(c)
	})
	cfg := fastCfg(addr)
	cfg.MaxFrameSize = 4 << 20
	r := startRun(t, cfg)
	r.rec.expect(t, "connected", 5*time.Second)
	var kept []event
	for range sizes {
		kept = append(kept, r.rec.expect(t, "message", 5*time.Second))
	}
	for i, e := range kept {
		if e.seq != uint64(i) || e.topic != "t" || !bytes.Equal(e.payload, payloadFor(uint64(i), sizes[i])) {
			t.Fatalf("message %d changed after later ones arrived (seq %d, %d bytes)", i, e.seq, len(e.payload))
		}
	}
}
