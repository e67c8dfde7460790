package zmqsub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"
)

// closeDrainTimeout bounds how long closing a socket waits for zmq4's reader
// goroutines to exit. They exit promptly once their connections are shut
// down; the bound only keeps a library surprise from hanging the caller.
const closeDrainTimeout = 2 * time.Second

// recvResult is one zmq4 Recv outcome.
type recvResult struct {
	msg zmq4.Msg
	err error
}

// zsession owns one zmq4 socket, its guarded connections, and the goroutines
// around it (at most one dial, one reader). close must be called exactly once
// and releases everything.
type zsession struct {
	t    *tracker
	sock zmq4.Socket
	log  *zap.Logger

	msgs       chan recvResult
	readerDone chan struct{} // nil until startReader
	dialDone   chan struct{} // nil unless a dial was started
	closing    atomic.Bool
}

type socketCtor func(ctx context.Context, opts ...zmq4.Option) zmq4.Socket

func newZSession(ctor socketCtor, lim guardLimits, dialTimeout time.Duration, log *zap.Logger) *zsession {
	t := newTracker(lim, dialTimeout)
	sock := ctor(t.context(),
		zmq4.WithDialerMaxRetries(0), // we retry ourselves, with backoff
		zmq4.WithDialerTimeout(dialTimeout),
		zmq4.WithTimeout(dialTimeout), // bounds Send
		zmq4.WithLogger(zap.NewStdLog(log.Named("zmq4"))),
	)
	return &zsession{t: t, sock: sock, log: log, msgs: make(chan recvResult, 16)}
}

// dial connects the socket under timeout and ctx. zmq4's Dial runs in its own
// goroutine because it can block in the handshake and panics on some
// malformed peers; the frame guard's handshake deadline makes it return.
func (s *zsession) dial(ctx context.Context, endpoint string, timeout time.Duration) error {
	errc := make(chan error, 1)
	s.dialDone = make(chan struct{})
	go func() {
		defer close(s.dialDone)
		errc <- safeCall("dial", func() error { return s.sock.Dial(endpoint) })
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		s.t.shutdown()
		return ctx.Err()
	case <-timer.C:
		s.t.shutdown()
		return fmt.Errorf("zmq handshake with %s: timed out after %v", endpoint, timeout)
	}
}

// listen binds the socket.
func (s *zsession) listen(endpoint string) error {
	return safeCall("listen", func() error { return s.sock.Listen(endpoint) })
}

// safeCall runs f, turning a panic inside zmq4 into an error.
func safeCall(what string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("zmq4 %s panicked: %v", what, r)
		}
	}()
	return f()
}

// startReader starts the one goroutine that calls Recv (which has no
// timeout) and forwards results, so the owner can select on them.
func (s *zsession) startReader() {
	s.readerDone = make(chan struct{})
	go func() {
		defer close(s.readerDone)
		for {
			r := s.recv()
			if r.err != nil && s.closing.Load() {
				return
			}
			// The owner keeps reading msgs until readerDone, so this never
			// blocks forever.
			s.msgs <- r
		}
	}()
}

// recv calls Recv once, turning a panic inside zmq4 into an error.
func (s *zsession) recv() (r recvResult) {
	defer func() {
		if p := recover(); p != nil {
			r.err = fmt.Errorf("zmq4 recv panicked: %v", p)
		}
	}()
	r.msg, r.err = s.sock.Recv()
	return r
}

// close shuts the session down without leaking: zmq4 leaks a reader
// goroutine if its queue is full when the socket closes, so connections are
// shut down first and queued messages drained until every zmq4 reader has
// exited; only then is the socket closed, then our reader drained.
func (s *zsession) close() {
	s.t.shutdown()
	if s.dialDone != nil {
		select {
		case <-s.dialDone:
		case <-time.After(closeDrainTimeout):
			// Closing while Dial runs races inside zmq4; leaving the socket
			// open is the lesser evil (the guard already closed its conns).
			s.log.Error("zmq4 dial did not return after shutdown; abandoning socket")
			return
		}
	}
	timeout := time.NewTimer(closeDrainTimeout)
	defer timeout.Stop()
drain:
	for {
		select {
		case <-s.t.done():
			break drain
		case <-s.msgs:
		case <-timeout.C:
			s.log.Warn("zmq4 readers did not exit after shutdown; closing anyway")
			break drain
		}
	}
	s.closing.Store(true)
	_ = s.sock.Close()
	if s.readerDone == nil {
		return
	}
	for {
		select {
		case <-s.msgs:
		case <-s.readerDone:
			return
		}
	}
}

// probe checks that addr speaks ZMTP before zmq4 is let near it: connect,
// then read the 10-byte greeting signature (0xff, 8 bytes, 0x7f) that every
// ZMTP 3 peer sends first. Servers that say nothing or something else fail
// here instead of inside zmq4.
func probe(ctx context.Context, addr string, dialTimeout, probeTimeout time.Duration) error {
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err() // net reports a context deadline as "i/o timeout"
		}
		return fmt.Errorf("connect %s: %w", addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	if err := c.SetReadDeadline(time.Now().Add(probeTimeout)); err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	var sig [10]byte
	n, err := io.ReadFull(c, sig[:])
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("probe %s: %w", addr, ctx.Err())
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("probe %s: no ZMTP greeting within %v (not a ZMQ publisher?)", addr, probeTimeout)
		}
		return fmt.Errorf("probe %s: read greeting (%d bytes): %w", addr, n, err)
	}
	if sig[0] != 0xff || sig[9] != 0x7f {
		return fmt.Errorf("probe %s: %w", addr, &GuardError{Reason: fmt.Sprintf("not a ZMTP peer (first bytes %q)", sig[:])})
	}
	return nil
}
