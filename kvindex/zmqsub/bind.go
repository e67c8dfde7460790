package zmqsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/internal/ctxsleep"
	"github.com/llmgw/caddy-llmgw/internal/zmtp"
)

// In bind mode the engines connect to the subscriber. Each connection is
// read on a goroutine of its own; what they read reaches the handler
// through one channel, so that the handler is called from Run's goroutine
// only, and a peer's Connected comes before its messages and its
// Disconnected after them.

// maxBoundPeers bounds the publishers a bound subscriber serves at once:
// vLLM connects once per engine and data-parallel rank. Connections past
// it are closed as they arrive, so that a flood of connections costs no
// more than this many goroutines and guarded buffers.
const maxBoundPeers = 256

// acceptRetry is the pause after a failed Accept (out of file descriptors,
// say) before the next.
const acceptRetry = 50 * time.Millisecond

// peerEventKind says what a peerEvent reports.
type peerEventKind uint8

const (
	peerConnected peerEventKind = iota
	peerMessage
	peerEnded
)

// peerEvent is one report of a bound subscriber's peer to the session.
type peerEvent struct {
	kind    peerEventKind
	command bool     // peerMessage: a ZMTP command
	frames  [][]byte // peerMessage
	err     error    // peerEnded: why
}

// boundSession is one listening socket and the publishers connected to it.
type boundSession struct {
	s      *Subscriber
	ln     net.Listener
	cfg    zmtp.Config // each accepted SUB connection's
	events chan peerEvent
	peers  int // announced (Connected) and not yet ended; Run's goroutine only
}

// bindSession binds the endpoint and serves publishers that connect, each
// reported as its own Connected/Disconnected pair. It reports whether the
// bind succeeded; it ends on ctx, or on the idle timeout while peers are
// connected (then the socket is rebuilt).
func (s *Subscriber) bindSession(ctx context.Context, h Handler) (bool, error) {
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	ln, err := lc.Listen(ctx, "tcp", s.addr)
	if err != nil {
		return false, fmt.Errorf("zmq bind %s: %w", s.addr, err)
	}
	s.noteBound(ln.Addr())
	s.log.Info("zmq subscriber bound", zap.String("addr", s.BoundAddr()))
	b := &boundSession{s: s, ln: ln, cfg: s.subConfig(), events: make(chan peerEvent, 64)}
	peersCtx, stopPeers := context.WithCancel(ctx)
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		b.accept(peersCtx)
	}()
	endErr := b.serve(ctx, h)
	stopPeers()
	_ = ln.Close()
	// The peers' goroutines end on peersCtx; what they still report is
	// dropped, and an unannounced peer stays unannounced.
	for drained := false; !drained; {
		select {
		case <-b.events:
		case <-accepted:
			drained = true
		}
	}
	if ctx.Err() == nil {
		s.setError(endErr)
	}
	for ; b.peers > 0; b.peers-- {
		s.endSession(h, endErr)
	}
	return true, endErr
}

// noteBound records the bound address; rebinding after a failure keeps the
// port engines know.
func (s *Subscriber) noteBound(a net.Addr) {
	s.mu.Lock()
	s.boundAddr = a.String()
	s.mu.Unlock()
	if _, port, err := net.SplitHostPort(a.String()); err == nil {
		host, _, _ := net.SplitHostPort(s.addr)
		s.addr = net.JoinHostPort(host, port)
	}
}

// serve delivers the peers' reports to h until ctx ends or, with peers
// connected, nothing arrives for IdleTimeout.
func (b *boundSession) serve(ctx context.Context, h Handler) error {
	idle := newIdleTimer(b.s.cfg.IdleTimeout)
	defer idle.stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-idle.c():
			if b.peers > 0 {
				return ErrIdle
			}
			idle.reset()
		case ev := <-b.events:
			idle.reset()
			switch ev.kind {
			case peerConnected:
				b.peers++
				b.s.beginSession(h)
			case peerEnded:
				b.peers--
				err := fmt.Errorf("zmq recv: %w", ev.err)
				b.s.setError(err)
				b.s.log.Info("zmq publisher disconnected", zap.Error(err))
				b.s.connected.Store(b.peers > 0)
				h.Disconnected(err)
			default:
				b.s.deliverFrames(h, ev.command, ev.frames)
			}
		}
	}
}

// accept serves each connection on a goroutine of its own, at most
// maxPeers at once, until the listener closes; it returns once every
// peer's goroutine has.
func (b *boundSession) accept(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, b.s.maxPeers)
	for {
		nc, err := b.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			b.s.log.Warn("zmq accept failed", zap.Error(err))
			if !ctxsleep.Sleep(ctx, acceptRetry) {
				return
			}
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			_ = nc.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			b.servePeer(ctx, nc)
		}()
	}
}

// servePeer runs one publisher's connection: the handshake and the
// subscription (a refused handshake is never reported), then its messages,
// until it fails or ctx ends.
func (b *boundSession) servePeer(ctx context.Context, nc net.Conn) {
	c, err := zmtp.Start(ctx, nc, b.cfg)
	if err != nil {
		b.s.log.Debug("zmq publisher refused", zap.Error(err))
		return
	}
	defer c.Shutdown()
	stop := context.AfterFunc(ctx, c.Shutdown)
	defer stop()
	if err := subscribe(c, b.cfg.Timeout, b.s.cfg.Topic); err != nil {
		return
	}
	if !b.report(ctx, peerEvent{kind: peerConnected}) {
		return
	}
	var m zmtp.Message
	for {
		if err := c.Read(&m); err != nil {
			b.report(ctx, peerEvent{kind: peerEnded, err: err})
			return
		}
		if m.Command {
			if err := c.Pong(m.Parts()[0]); err != nil {
				b.report(ctx, peerEvent{kind: peerEnded, err: err})
				return
			}
		}
		ev := peerEvent{kind: peerMessage, command: m.Command, frames: append([][]byte(nil), m.Parts()...)}
		if !b.report(ctx, ev) {
			return
		}
	}
}

// report hands ev to the session, unless it has ended.
func (b *boundSession) report(ctx context.Context, ev peerEvent) bool {
	select {
	case b.events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}
