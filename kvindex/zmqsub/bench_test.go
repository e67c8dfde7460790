package zmqsub

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
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

// BenchmarkRun measures batches/s through Run from a publisher over
// loopback TCP that writes each batch on its own, as a PUB socket sends
// batches published one scheduler step apart (the guard, reader, filter
// and handler call included). One op is a burst of 100 batches of ~1.7 KB,
// waited for until all arrived.
func BenchmarkRun(b *testing.B) {
	const burst = 100
	payload := bytes.Repeat([]byte{0x93, 0xcb, 0x41, 0xd9}, 1700/4)
	batch := zmtpMessage([]byte(testTopic), seqBytes(1), payload)
	bursts := make(chan int)
	addr := fakeServer(b, func(c net.Conn) {
		if serverHandshake(c, zmtpReady("PUB")) != nil {
			return
		}
		go io.Copy(io.Discard, c) // the subscription; ends when c closes
		for n := range bursts {
			for range n {
				if _, err := c.Write(batch); err != nil {
					return
				}
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
	b.SetBytes(int64(burst * len(batch)))
	var sent int64
	for b.Loop() {
		sent += burst
		h.target.Store(sent)
		bursts <- burst
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

// BenchmarkRunRawPublisher is BenchmarkRun with a publisher that writes
// each pre-encoded burst in one syscall, so the figure is the subscriber's
// own cost, without the publisher's write per batch.
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
