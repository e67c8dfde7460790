package caddymodule

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// A fake vLLM KV-event publisher speaking just enough ZMTP 3.0 (NULL
// mechanism, PUB socket) for the gateway's subscriber to connect to it, so
// tests can send what no real engine would: nothing at all, garbage,
// frames announcing gigabytes, sequence numbers going backwards.

const (
	relZFlagMore    = 0x01
	relZFlagLong    = 0x02
	relZFlagCommand = 0x04
)

func relZGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3 // signature, ZMTP 3.0
	copy(g[12:32], "NULL")
	return g
}

func relZFrame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		b := make([]byte, 9, 9+len(body))
		b[0] = flags | relZFlagLong
		binary.BigEndian.PutUint64(b[1:], uint64(len(body)))
		return append(b, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func relZReady() []byte {
	b := append([]byte{5}, "READY"...)
	b = append(b, byte(len("Socket-Type")))
	b = append(b, "Socket-Type"...)
	b = binary.BigEndian.AppendUint32(b, 3)
	b = append(b, "PUB"...)
	return relZFrame(relZFlagCommand, b)
}

// relZMessage encodes one KV-event message [topic, seq, payload].
func relZMessage(topic string, seq uint64, payload []byte) []byte {
	out := relZFrame(relZFlagMore, []byte(topic))
	out = append(out, relZFrame(relZFlagMore, binary.BigEndian.AppendUint64(nil, seq))...)
	return append(out, relZFrame(0, payload)...)
}

// relZReadFrame reads one frame of at most 64 KiB (the client's READY).
func relZReadFrame(r io.Reader) ([]byte, error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:2]); err != nil {
		return nil, err
	}
	size := uint64(h[1])
	if h[0]&relZFlagLong != 0 {
		if _, err := io.ReadFull(r, h[2:9]); err != nil {
			return nil, err
		}
		size = binary.BigEndian.Uint64(h[1:9])
	}
	if size > 64<<10 {
		return nil, errors.New("frame too large for a fake")
	}
	b := make([]byte, size)
	_, err := io.ReadFull(r, b)
	return b, err
}

// relBlockStored encodes a positional vLLM event batch (v0.10.2+ shape)
// holding one BlockStored event for the full blocks of tokens.
func relBlockStored(t *testing.T, tokens []uint64, blockSize int, firstHash uint64) []byte {
	t.Helper()
	n := len(tokens) / blockSize
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = firstHash + uint64(i)
	}
	ev := []any{"BlockStored", hashes, nil, tokens[:n*blockSize], blockSize, nil, "GPU"}
	b, err := msgpack.Marshal([]any{float64(time.Now().UnixNano()) / 1e9, []any{ev}, 0})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// relFakePub is a fake publisher on 127.0.0.1. Every connection that
// completes the handshake is handed to after (in its own goroutine) and
// announced on sessions; the subscriber's own frames are drained meanwhile.
type relFakePub struct {
	ln       net.Listener
	greet    bool             // false: accept and say nothing (not ZMTP)
	after    func(c net.Conn) // what to do once the handshake is done
	sessions chan net.Conn    // handshaken connections, newest last
	mu       sync.Mutex
	conns    []net.Conn
	wg       sync.WaitGroup
	closed   chan struct{}
	accepted int
}

// newRelFakePub starts a fake publisher, closed when the test ends.
func newRelFakePub(t *testing.T, greet bool, after func(c net.Conn)) *relFakePub {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &relFakePub{ln: ln, greet: greet, after: after, sessions: make(chan net.Conn, 1024), closed: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *relFakePub) endpoint() string { return "tcp://" + p.ln.Addr().String() }

func (p *relFakePub) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer c.Close()
			p.handle(c)
		}()
	}
}

func (p *relFakePub) handle(c net.Conn) {
	if !p.greet {
		_, _ = io.Copy(io.Discard, c) // silent: hold until the peer gives up
		return
	}
	if _, err := c.Write(relZGreeting()); err != nil {
		return
	}
	var g [64]byte
	if _, err := io.ReadFull(c, g[:]); err != nil {
		return // the subscriber's probe: it reads our signature and leaves
	}
	if _, err := c.Write(relZReady()); err != nil {
		return
	}
	if _, err := relZReadFrame(c); err != nil {
		return
	}
	go func() { _, _ = io.Copy(io.Discard, c) }() // subscriptions; ends when c closes
	select {
	case p.sessions <- c:
	default:
	}
	if p.after != nil {
		p.after(c)
	}
	<-p.closed
}

// session waits for the next handshaken connection.
func (p *relFakePub) session(t *testing.T, d time.Duration) net.Conn {
	t.Helper()
	select {
	case c := <-p.sessions:
		return c
	case <-time.After(d):
		t.Fatalf("no subscriber session within %v", d)
		return nil
	}
}

func (p *relFakePub) close() {
	close(p.closed)
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
