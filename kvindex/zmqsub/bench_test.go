package zmqsub

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// countingHandler signals when its message count reaches target.
type countingHandler struct {
	n      atomic.Int64
	target atomic.Int64
	reach  chan struct{}
}

func (h *countingHandler) Connected()         {}
func (h *countingHandler) Disconnected(error) {}
func (h *countingHandler) Message([]byte, uint64, []byte) {
	if h.n.Add(1) == h.target.Load() {
		h.reach <- struct{}{}
	}
}

// BenchmarkRun measures batches/s through Run from an in-process zmq4
// publisher over loopback TCP (the guard, reader goroutine, filter and
// handler call included). One op is a burst of 100 batches of ~1.7 KB,
// waited for until all arrived.
func BenchmarkRun(b *testing.B) {
	const burst = 100
	pub := zmq4.NewPub(context.Background(), zmq4.WithLogger(log.New(io.Discard, "", 0)))
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	h := &countingHandler{reach: make(chan struct{}, 1)}
	h.target.Store(1)
	s, err := NewSubscriber(Config{Endpoint: "tcp://" + pub.Addr().String()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, h) }()
	defer func() {
		cancel()
		<-done
	}()

	payload := bytes.Repeat([]byte{0x93, 0xcb, 0x41, 0xd9}, 1700/4)
	msg := zmq4.NewMsgFrom([]byte(testTopic), seqBytes(1), payload)
	// Publish until the subscription has reached the publisher.
	for warm := false; !warm; {
		if err := pub.Send(msg); err != nil {
			b.Fatal(err)
		}
		select {
		case <-h.reach:
			warm = true
		case <-time.After(10 * time.Millisecond):
		}
	}
	time.Sleep(50 * time.Millisecond)
	b.ReportAllocs()
	b.SetBytes(int64(burst * (len(testTopic) + 8 + len(payload))))
	sent := h.n.Load()
	for b.Loop() {
		sent += burst
		h.target.Store(sent)
		for range burst {
			if err := pub.Send(msg); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-h.reach:
		case <-time.After(10 * time.Second):
			b.Fatalf("only %d of %d batches arrived", h.n.Load(), sent)
		}
	}
	b.ReportMetric(float64(b.N*burst)/b.Elapsed().Seconds(), "batches/s")
	if d := s.Stats().Dropped; d != 0 {
		b.Fatalf("%d dropped", d)
	}
}

// BenchmarkGuardRead measures the frame guard's own cost per 1.7 KB batch,
// read frame by frame, as a zconn reads it.
func BenchmarkGuardRead(b *testing.B) {
	payload := make([]byte, 1700)
	one := zmtpMessage([]byte(testTopic), seqBytes(1), payload)
	const perStream = 1000
	stream := append(validPrefix(), bytes.Repeat(one, perStream)...)
	var g *guardConn
	left := 0
	hdr := make([]byte, 9)
	body := make([]byte, len(payload))
	b.ReportAllocs()
	b.SetBytes(int64(len(one)))
	for b.Loop() {
		if left == 0 {
			g = newGuardConn(newStreamConn(stream, 1<<20), guardLimits{maxFrame: DefaultMaxFrameSize})
			io.ReadFull(g, make([]byte, len(validPrefix())))
			left = perStream
		}
		for range 3 {
			io.ReadFull(g, hdr[:2])
			n := int(hdr[1])
			if hdr[0]&flagLong != 0 {
				io.ReadFull(g, hdr[2:9])
				n = len(payload)
			}
			if _, err := io.ReadFull(g, body[:n]); err != nil {
				b.Fatal(err)
			}
		}
		left--
	}
}

// BenchmarkRunRawPublisher is BenchmarkRun with a fake publisher that writes
// each pre-encoded burst in one syscall, so the figure is the subscriber's
// own cost (zmq4's PUB makes several write syscalls per batch and dominates
// BenchmarkRun on two cores).
func BenchmarkRunRawPublisher(b *testing.B) {
	const burst = 100
	payload := bytes.Repeat([]byte{0x93, 0xcb, 0x41, 0xd9}, 1700/4)
	burstBytes := bytes.Repeat(zmtpMessage([]byte(testTopic), seqBytes(1), payload), burst)
	bursts := make(chan struct{})
	addr := fakeServer(b, func(c net.Conn) {
		if serverHandshake(c, zmtpReady("PUB")) != nil {
			return
		}
		go io.Copy(io.Discard, c) // the subscription; ends when c closes
		for range bursts {
			if _, err := c.Write(burstBytes); err != nil {
				return
			}
		}
	})
	defer close(bursts)
	h := &countingHandler{reach: make(chan struct{}, 1)}
	s, err := NewSubscriber(Config{Endpoint: "tcp://" + addr})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, h) }()
	defer func() {
		cancel()
		<-done
	}()
	b.ReportAllocs()
	b.SetBytes(int64(len(burstBytes)))
	var sent int64
	for b.Loop() {
		sent += burst
		h.target.Store(sent)
		bursts <- struct{}{}
		select {
		case <-h.reach:
		case <-time.After(10 * time.Second):
			b.Fatalf("only %d of %d batches arrived", h.n.Load(), sent)
		}
	}
	b.ReportMetric(float64(b.N*burst)/b.Elapsed().Seconds(), "batches/s")
}
