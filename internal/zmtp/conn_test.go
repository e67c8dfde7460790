package zmtp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// startPair runs Start on both ends of a loopback connection, as types a
// and b, each accepting the other's types that ZMTP allows.
func startPair(t *testing.T, a, b string) (*Conn, *Conn, error, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		c   *Conn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			accepted <- result{err: err}
			return
		}
		c, err := Start(context.Background(), nc, Config{SocketType: b, PeerTypes: PeerTypes(b), Timeout: 5 * time.Second})
		accepted <- result{c, err}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ca, errA := Start(context.Background(), nc, Config{SocketType: a, PeerTypes: PeerTypes(a), Identity: []byte{}, Timeout: 5 * time.Second})
	r := <-accepted
	for _, c := range []*Conn{ca, r.c} {
		if c != nil {
			t.Cleanup(c.Shutdown)
		}
	}
	return ca, r.c, errA, r.err
}

func TestStartBothRoles(t *testing.T) {
	sub, pub, errSub, errPub := startPair(t, Sub, Pub)
	if errSub != nil || errPub != nil {
		t.Fatalf("handshake: %v / %v", errSub, errPub)
	}
	if err := pub.Send(time.Second, []byte("kv@x"), seqBytes(9), bytes.Repeat([]byte{1}, 300)); err != nil {
		t.Fatal(err)
	}
	if err := pub.WriteWithin(time.Second, zmtpCommand("PING", []byte{0, 10, 'c'})); err != nil {
		t.Fatal(err)
	}
	var m Message
	if err := sub.Read(&m); err != nil || m.Command || len(m.Parts()) != 3 || string(m.Parts()[0]) != "kv@x" || len(m.Parts()[2]) != 300 {
		t.Fatalf("read %v: command %v, %d frames", err, m.Command, len(m.Parts()))
	}
	if err := sub.Read(&m); err != nil || !m.Command {
		t.Fatalf("read %v: command %v", err, m.Command)
	}
	if err := sub.Pong(m.Parts()[0]); err != nil {
		t.Fatal(err)
	}
	if err := pub.Read(&m); err != nil || !m.Command || string(m.Parts()[0]) != "\x04PONGc" {
		t.Fatalf("read %v: %q", err, m.Parts())
	}
}

func TestStartRefusesIncompatiblePeer(t *testing.T) {
	_, _, errA, errB := startPair(t, Dealer, Pub)
	var ge *GuardError
	if !errors.As(errA, &ge) || !errors.As(errB, &ge) {
		t.Fatalf("errors %v / %v, want GuardErrors on both sides", errA, errB)
	}
}

// TestStartTimesOut: a peer that sends nothing fails the handshake within
// its timeout.
func TestStartTimesOut(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	go func() { _, _ = b.Read(make([]byte, 1024)) }() // takes the greeting, answers nothing
	start := time.Now()
	_, err := Start(context.Background(), a, Config{SocketType: Sub, Timeout: 100 * time.Millisecond})
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Start = %v after %v, want a timeout", err, time.Since(start))
	}
}
