package vllmsim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/zmtp"
)

// endSeq is vLLM's replay end marker: (-1).to_bytes(8, "big", signed=True).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ringEntry is one published batch kept for replay.
type ringEntry struct {
	seq     uint64
	payload []byte
}

// publisher is vLLM's ZmqEventPublisher: a PUB socket that binds or
// connects, sending [topic, seq(8 bytes BE), payload] per batch, and an
// optional ROUTER replay socket over a ring of the last BufferSteps batches.
// It lives for one simulated process: Restart replaces it, which is what
// restarts the sequence at 0 and empties the ring.
type publisher struct {
	cfg   KVEventsConfig
	pubEP endpoint
	topic []byte

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ln     net.Listener // PUB listener in bind mode
	rln    net.Listener // replay ROUTER listener

	mu      sync.Mutex
	closed  bool
	seq     uint64
	gap     uint64
	subs    map[*subConn]struct{}
	ring    []ringEntry
	ringPos int // index of the oldest entry once the ring is full
	changed chan struct{}
	sent    uint64
	dropped uint64
}

// startPublisher opens the sockets. pubEP and replayEP are already parsed;
// listeners bind now so that the actual ports are known when Start returns.
func startPublisher(cfg KVEventsConfig, pubEP endpoint, replayEP *endpoint) (*publisher, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &publisher{
		cfg:     cfg,
		pubEP:   pubEP,
		topic:   []byte(cfg.Topic),
		ctx:     ctx,
		cancel:  cancel,
		subs:    make(map[*subConn]struct{}),
		changed: make(chan struct{}),
	}
	if pubEP.bind {
		ln, err := net.Listen(pubEP.network, pubEP.addr)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("kv events: bind PUB %s: %w", pubEP.addr, err)
		}
		p.ln = ln
		p.pubEP.addr = ln.Addr().String()
	}
	if replayEP != nil {
		rln, err := net.Listen(replayEP.network, replayEP.addr)
		if err != nil {
			if p.ln != nil {
				_ = p.ln.Close()
			}
			cancel()
			return nil, fmt.Errorf("kv events: bind replay ROUTER %s: %w", replayEP.addr, err)
		}
		p.rln = rln
	}
	if p.ln != nil {
		p.wg.Add(1)
		go p.acceptLoop(p.ln, p.servePub)
	} else {
		p.wg.Add(1)
		go p.dialLoop()
	}
	if p.rln != nil {
		p.wg.Add(1)
		go p.acceptLoop(p.rln, p.serveReplay)
	}
	return p, nil
}

// pubEndpoint is the endpoint subscribers dial in bind mode, else "".
func (p *publisher) pubEndpoint() string {
	if p.ln == nil {
		return ""
	}
	return endpointString(p.ln.Addr())
}

func (p *publisher) replayEndpoint() string {
	if p.rln == nil {
		return ""
	}
	return endpointString(p.rln.Addr())
}

// close stops every goroutine of the publisher and waits for them.
func (p *publisher) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	for s := range p.subs {
		_ = s.c.Close()
	}
	p.mu.Unlock()
	p.cancel()
	if p.ln != nil {
		_ = p.ln.Close()
	}
	if p.rln != nil {
		_ = p.rln.Close()
	}
	p.wg.Wait()
}

// skip makes the next batch skip n sequence numbers (lost-message fault).
func (p *publisher) skip(n int) {
	p.mu.Lock()
	p.gap += uint64(n)
	p.mu.Unlock()
}

// publish sends one batch to every subscriber whose subscription prefixes
// the topic, and keeps it for replay. It never blocks on the network: a
// subscriber whose queue holds HWM messages loses the new one, as with libzmq.
func (p *publisher) publish(payload []byte) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq + p.gap
	p.gap = 0
	p.seq = seq + 1
	if p.closed {
		return seq
	}
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], seq)
	var wire []byte
	for s := range p.subs {
		if !s.subscribed(p.topic) {
			continue
		}
		if wire == nil {
			wire = zmtp.AppendMessage(make([]byte, 0, len(p.topic)+len(payload)+32), p.topic, seqb[:], payload)
		}
		if s.enqueue(wire, p.cfg.HWM) {
			p.sent++
		} else {
			p.dropped++
		}
	}
	if p.rln != nil {
		e := ringEntry{seq: seq, payload: payload}
		if len(p.ring) < p.cfg.BufferSteps {
			p.ring = append(p.ring, e)
		} else {
			p.ring[p.ringPos] = e
			p.ringPos = (p.ringPos + 1) % len(p.ring)
		}
	}
	return seq
}

// replayFrom returns the buffered batches with seq >= start, oldest first.
func (p *publisher) replayFrom(start uint64) []ringEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ringEntry, 0, 16)
	for i := range p.ring {
		e := p.ring[(p.ringPos+i)%len(p.ring)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// subscribers counts connected peers subscribed to the topic, and returns a
// channel closed at the next change.
func (p *publisher) subscribers() (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for s := range p.subs {
		if s.subscribed(p.topic) {
			n++
		}
	}
	return n, p.changed
}

func (p *publisher) notifyChangeLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *publisher) acceptLoop(ln net.Listener, serve func(net.Conn)) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient accept errors (e.g. EMFILE): back off briefly.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			serve(c)
		}()
	}
}

// dialLoop is connect mode: keep one connection to the subscriber's bound
// endpoint, reconnecting with backoff, as libzmq does.
func (p *publisher) dialLoop() {
	defer p.wg.Done()
	backoff := 100 * time.Millisecond
	d := net.Dialer{Timeout: 2 * time.Second}
	for p.ctx.Err() == nil {
		c, err := d.DialContext(p.ctx, p.pubEP.network, p.pubEP.addr)
		if err == nil {
			backoff = 100 * time.Millisecond
			p.servePub(c)
		}
		select {
		case <-p.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// servePub runs one subscriber connection until it fails or the publisher
// closes: this goroutine reads subscriptions, a second one writes.
func (p *publisher) servePub(c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(p.ctx, func() { _ = c.Close() })
	defer stop()
	g, err := handshake(p.ctx, c, zmtp.Pub)
	if err != nil {
		return
	}
	s := &subConn{c: c, notify: make(chan struct{}, 1), done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.subs[s] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.writeLoop()
	}()
	defer func() {
		p.mu.Lock()
		delete(p.subs, s)
		p.notifyChangeLocked()
		p.mu.Unlock()
		close(s.done)
		_ = c.Close()
		wg.Wait()
	}()
	for {
		frames, isCmd, err := readMsg(g)
		if err != nil {
			return
		}
		if isCmd {
			s.command(frames[0])
		} else if len(frames) == 1 && len(frames[0]) > 0 {
			// ZMTP 3.0 subscriptions: 0x01 topic / 0x00 topic.
			s.subscribe(frames[0][0] == 1, frames[0][1:])
		} else {
			continue
		}
		p.mu.Lock()
		p.notifyChangeLocked()
		p.mu.Unlock()
	}
}

// subConn is one connected subscriber with its bounded send queue.
type subConn struct {
	c      net.Conn
	notify chan struct{}
	done   chan struct{}

	mu     sync.Mutex
	topics [][]byte
	q      [][]byte
	qBytes int
}

// maxQueueBytes bounds one subscriber's queue in bytes as well as in
// messages: a stalled subscriber must not grow the simulator without limit.
const maxQueueBytes = 64 << 20

func (s *subConn) subscribed(topic []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.topics {
		if bytes.HasPrefix(topic, t) {
			return true
		}
	}
	return false
}

func (s *subConn) subscribe(on bool, topic []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, t := range s.topics {
		if bytes.Equal(t, topic) {
			if !on {
				s.topics = append(s.topics[:i], s.topics[i+1:]...)
			}
			return
		}
	}
	if on && len(s.topics) < 1024 {
		s.topics = append(s.topics, bytes.Clone(topic))
	}
}

// command handles ZMTP 3.1 SUBSCRIBE/CANCEL and heartbeat PING commands.
func (s *subConn) command(cmd []byte) {
	if len(cmd) < 1 || int(cmd[0]) > len(cmd)-1 {
		return
	}
	name, body := string(cmd[1:1+cmd[0]]), cmd[1+cmd[0]:]
	switch name {
	case "SUBSCRIBE":
		s.subscribe(true, body)
	case "CANCEL":
		s.subscribe(false, body)
	case "PING":
		if pong := zmtp.AppendPong(nil, cmd); pong != nil {
			s.enqueue(pong, 1<<30)
		}
	}
}

// enqueue queues one encoded message unless hwm messages are waiting.
func (s *subConn) enqueue(wire []byte, hwm int) bool {
	s.mu.Lock()
	if len(s.q) >= hwm || s.qBytes+len(wire) > maxQueueBytes {
		s.mu.Unlock()
		return false
	}
	s.q = append(s.q, wire)
	s.qBytes += len(wire)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
	return true
}

func (s *subConn) writeLoop() {
	var spare [][]byte
	for {
		select {
		case <-s.done:
			return
		case <-s.notify:
		}
		s.mu.Lock()
		batch := s.q
		s.q = spare[:0]
		s.qBytes = 0
		s.mu.Unlock()
		if len(batch) == 0 {
			// A spurious wake-up: batch is the empty queue just swapped
			// out, and the queue now owns spare's array, so batch becomes
			// the spare (keeping spare would hand its array out twice).
			spare = batch
			continue
		}
		_ = s.c.SetWriteDeadline(time.Now().Add(writeTimeout))
		bufs := net.Buffers(batch)
		if _, err := bufs.WriteTo(s.c); err != nil {
			_ = s.c.Close()
			return
		}
		clear(batch)
		spare = batch[:0]
	}
}

// serveReplay answers replay requests on one ROUTER connection: exactly
// ["", start_seq(8)] after the identity, as vLLM requires; anything else is
// ignored.
func (p *publisher) serveReplay(c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(p.ctx, func() { _ = c.Close() })
	defer stop()
	g, err := handshake(p.ctx, c, zmtp.Router)
	if err != nil {
		return
	}
	var out []byte
	for {
		frames, isCmd, err := readMsg(g)
		if err != nil {
			return
		}
		if isCmd {
			if err := g.Pong(frames[0]); err != nil {
				return
			}
			continue
		}
		if len(frames) != 2 || len(frames[0]) != 0 || len(frames[1]) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(frames[1])
		entries := p.replayFrom(start)
		_ = c.SetWriteDeadline(time.Now().Add(writeTimeout))
		var seqb [8]byte
		for _, e := range entries {
			binary.BigEndian.PutUint64(seqb[:], e.seq)
			if p.cfg.LegacyReplayLayout {
				out = zmtp.AppendMessage(out[:0], nil, seqb[:], e.payload)
			} else {
				out = zmtp.AppendMessage(out[:0], nil, p.topic, seqb[:], e.payload)
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
		if p.cfg.LegacyReplayLayout {
			out = zmtp.AppendMessage(out[:0], nil, endSeq, nil)
		} else {
			out = zmtp.AppendMessage(out[:0], nil, nil, endSeq, nil)
		}
		if _, err := c.Write(out); err != nil {
			return
		}
		_ = c.SetWriteDeadline(time.Time{})
	}
}
