// Package zmqsub subscribes to vLLM KV-cache events over ZeroMQ and fetches
// missed batches from vLLM's replay socket.
//
// It speaks ZMTP 3.0 itself (internal/zmtp): greeting, READY, the
// subscription, frames, and PONGs to a publisher's heartbeat PINGs, as a
// SUB that dials the engines' publishers (connect mode) or accepts them
// (bind mode), and as a DEALER to the replay sockets. Every connection
// passes through a ZMTP frame guard (see GuardError) that refuses
// oversized or malformed frames before anything allocates for them, and a
// probe checks for a ZMTP greeting before a session is dialled. Failed
// sessions are re-dialled with backoff.
package zmqsub

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/internal/ctxsleep"
	"github.com/llmgw/caddy-llmgw/internal/zmtp"
)

// Defaults for zero Config fields.
const (
	DefaultProbeTimeout = 2 * time.Second
	DefaultDialTimeout  = 5 * time.Second
	DefaultBackoffMin   = 50 * time.Millisecond
	DefaultBackoffMax   = 500 * time.Millisecond
	DefaultMaxFrameSize = 64 << 20
)

// Config configures a Subscriber.
type Config struct {
	// Endpoint is "tcp://host:port". In connect mode the engine's PUB binds
	// (vLLM's default tcp://*:5557) and we dial it. In bind mode we bind this
	// endpoint ("tcp://*:port", port 0 = OS-chosen) and engines connect to us.
	Endpoint string
	// Bind selects bind mode. One publisher per bound endpoint is expected
	// (vLLM's seq numbers are per engine); each publisher connection is
	// reported as its own Connected/Disconnected pair, so overlapping
	// publishers produce interleaved pairs and interleaved batches.
	Bind bool
	// Topic is the SUB prefix filter; "" receives everything.
	Topic string
	// ProbeTimeout bounds waiting for the peer's ZMTP greeting; default 2s.
	ProbeTimeout time.Duration
	// DialTimeout bounds TCP connect and the ZMTP handshake; default 5s.
	DialTimeout time.Duration
	// BackoffMin and BackoffMax bound the re-dial backoff; defaults 50ms and
	// 500ms, so a restarted publisher is resubscribed within about 1 s.
	BackoffMin, BackoffMax time.Duration
	// IdleTimeout, when > 0, reconnects after no message for this long. 0 =
	// off: vLLM publishes nothing while idle, so silence is not a failure
	// (TCP keep-alive detects dead peers).
	IdleTimeout time.Duration
	// MaxFrameSize refuses frames announcing more bytes, before allocation;
	// default 64 MiB. A whole message may carry 64 KiB more (topic, seq).
	MaxFrameSize int64
	// Logger receives diagnostics; nil = no-op.
	Logger *zap.Logger
}

// Handler receives a subscription's events. Its methods are called
// sequentially from the goroutine running Run.
type Handler interface {
	// Connected reports that a new session began: a dialled publisher
	// (connect mode) or a publisher that connected to us (bind mode). Sequence
	// numbers restart or jump across sessions.
	Connected()
	// Message delivers one batch [topic, seq, payload]. The slices are not
	// reused by the subscriber; the handler may keep them.
	Message(topic []byte, seq uint64, payload []byte)
	// Disconnected ends a session begun by Connected; err says why
	// (ctx.Err() when Run is stopping, ErrIdle, a *GuardError, an I/O error).
	// Every Connected is followed by exactly one Disconnected.
	Disconnected(err error)
}

// Stats is a snapshot of a Subscriber's counters.
type Stats struct {
	Connected   bool      // a session is active
	Sessions    uint64    // sessions begun (Connected calls)
	Reconnects  uint64    // sessions begun after an earlier one ended
	Messages    uint64    // batches delivered to Handler.Message
	Dropped     uint64    // messages filtered out (not [topic, 8-byte seq, payload], commands)
	DialErrors  uint64    // failed probes, dials and binds
	LastError   string    // most recent session or dial error
	LastMessage time.Time // when the last batch was delivered; zero if none
}

// ErrIdle ends a session after Config.IdleTimeout without a message.
var ErrIdle = errors.New("zmqsub: no message within idle timeout")

// Subscriber is a supervised SUB socket. Create it with NewSubscriber, run it
// with Run, and read its Stats from any goroutine.
type Subscriber struct {
	cfg  Config
	log  *zap.Logger
	addr string // dial address, or bind address (port fixed after first bind)
	// maxPeers bounds the publishers served at once in bind mode
	// (maxBoundPeers; tests lower it).
	maxPeers int

	running atomic.Bool

	connected   atomic.Bool
	sessions    atomic.Uint64
	reconnects  atomic.Uint64
	messages    atomic.Uint64
	dropped     atomic.Uint64
	dialErrors  atomic.Uint64
	lastMessage atomic.Int64 // unix nanoseconds

	mu        sync.Mutex
	lastError string
	boundAddr string
}

// NewSubscriber validates cfg and fills in defaults.
func NewSubscriber(cfg Config) (*Subscriber, error) {
	host, port, err := splitEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("zmqsub: %w", err)
	}
	if !cfg.Bind {
		if host == "" || host == "*" || port == 0 {
			return nil, fmt.Errorf("zmqsub: endpoint %q: connect mode needs a host and a port (use Bind to listen)", cfg.Endpoint)
		}
	} else if host == "*" {
		host = ""
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ProbeTimeout", cfg.ProbeTimeout}, {"DialTimeout", cfg.DialTimeout}, {"BackoffMin", cfg.BackoffMin}, {"BackoffMax", cfg.BackoffMax}, {"IdleTimeout", cfg.IdleTimeout}} {
		if d.v < 0 {
			return nil, fmt.Errorf("zmqsub: %s must not be negative (got %v)", d.name, d.v)
		}
	}
	if cfg.MaxFrameSize < 0 {
		return nil, fmt.Errorf("zmqsub: MaxFrameSize must not be negative (got %d)", cfg.MaxFrameSize)
	}
	cfg.ProbeTimeout = orDefault(cfg.ProbeTimeout, DefaultProbeTimeout)
	cfg.DialTimeout = orDefault(cfg.DialTimeout, DefaultDialTimeout)
	cfg.BackoffMin = orDefault(cfg.BackoffMin, DefaultBackoffMin)
	cfg.BackoffMax = orDefault(cfg.BackoffMax, DefaultBackoffMax)
	if cfg.BackoffMax < cfg.BackoffMin {
		return nil, fmt.Errorf("zmqsub: BackoffMax %v is below BackoffMin %v", cfg.BackoffMax, cfg.BackoffMin)
	}
	if cfg.MaxFrameSize == 0 {
		cfg.MaxFrameSize = DefaultMaxFrameSize
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Subscriber{
		cfg:      cfg,
		log:      log.With(zap.String("endpoint", cfg.Endpoint)),
		addr:     net.JoinHostPort(host, strconv.Itoa(port)),
		maxPeers: maxBoundPeers,
	}, nil
}

func orDefault(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}

// Run subscribes with cfg until ctx ends; see Subscriber.Run.
func Run(ctx context.Context, cfg Config, h Handler) error {
	s, err := NewSubscriber(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx, h)
}

// Stats returns a snapshot of the counters; safe from any goroutine.
func (s *Subscriber) Stats() Stats {
	st := Stats{
		Connected:  s.connected.Load(),
		Sessions:   s.sessions.Load(),
		Reconnects: s.reconnects.Load(),
		Messages:   s.messages.Load(),
		Dropped:    s.dropped.Load(),
		DialErrors: s.dialErrors.Load(),
	}
	if ns := s.lastMessage.Load(); ns != 0 {
		st.LastMessage = time.Unix(0, ns)
	}
	s.mu.Lock()
	st.LastError = s.lastError
	s.mu.Unlock()
	return st
}

// BoundAddr returns the listening address in bind mode once bound
// (useful with port 0), or "".
func (s *Subscriber) BoundAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.boundAddr
}

func (s *Subscriber) setError(err error) {
	s.mu.Lock()
	s.lastError = err.Error()
	s.mu.Unlock()
}

// Run blocks until ctx ends, then returns nil. Network failures never end
// it: every session that fails is retried with backoff. It returns an error
// at once only when h is nil or the Subscriber is already running.
func (s *Subscriber) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return errors.New("zmqsub: nil Handler")
	}
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("zmqsub: Subscriber is already running")
	}
	defer s.running.Store(false)

	backoff := s.cfg.BackoffMin
	failures := 0
	for ctx.Err() == nil {
		var hadSession bool
		var err error
		if s.cfg.Bind {
			hadSession, err = s.bindSession(ctx, h)
		} else {
			hadSession, err = s.connectSession(ctx, h)
		}
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			s.setError(err)
		}
		if hadSession {
			// Re-dial at once: a restarted publisher may already be back.
			backoff, failures = s.cfg.BackoffMin, 0
			continue
		}
		s.dialErrors.Add(1)
		failures++
		if failures == 1 {
			s.log.Warn("zmq subscription failed; retrying with backoff", zap.Error(err))
		} else {
			s.log.Debug("zmq subscription retry failed", zap.Error(err), zap.Int("failures", failures))
		}
		if !ctxsleep.Sleep(ctx, backoff) {
			break
		}
		backoff = min(2*backoff, s.cfg.BackoffMax)
	}
	return nil
}

// subConfig is how a SUB connection of s is set up: against publishers
// only, with s's frame limit and handshake timeout.
func (s *Subscriber) subConfig() zmtp.Config {
	return zmtp.Config{SocketType: zmtp.Sub, PeerTypes: zmtp.PeerTypes(zmtp.Sub), MaxFrame: s.cfg.MaxFrameSize, Timeout: s.cfg.DialTimeout}
}

// beginSession and endSession keep Stats and the Handler in step.
func (s *Subscriber) beginSession(h Handler) {
	if s.sessions.Add(1) > 1 {
		s.reconnects.Add(1)
	}
	s.connected.Store(true)
	h.Connected()
}

func (s *Subscriber) endSession(h Handler, err error) {
	s.connected.Store(false)
	h.Disconnected(err)
}

// connectSession probes, dials and serves one connection, reading it on
// this goroutine. It reports whether a session began
// (Connected was called).
func (s *Subscriber) connectSession(ctx context.Context, h Handler) (bool, error) {
	if err := probe(ctx, s.addr, s.cfg.DialTimeout, s.cfg.ProbeTimeout); err != nil {
		return false, err
	}
	c, err := dialSub(ctx, s.addr, s.cfg.Topic, s.subConfig())
	if err != nil {
		return false, fmt.Errorf("zmq dial %s: %w", s.addr, err)
	}
	stop := context.AfterFunc(ctx, c.Shutdown)
	defer stop()
	s.beginSession(h)
	s.log.Info("zmq subscription connected")

	endErr := s.serveConn(ctx, h, c)
	c.Shutdown()
	if ctx.Err() == nil {
		s.setError(endErr)
		s.log.Warn("zmq subscription lost; reconnecting", zap.Error(endErr))
	}
	s.endSession(h, endErr)
	return true, endErr
}

// serveConn delivers c's messages to h until the connection fails, goes
// idle for IdleTimeout, or ctx ends, and returns why.
func (s *Subscriber) serveConn(ctx context.Context, h Handler, c *zmtp.Conn) error {
	var m zmtp.Message
	for {
		if s.cfg.IdleTimeout > 0 {
			c.SetIdle(s.cfg.IdleTimeout)
		}
		err := c.Read(&m)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			return ErrIdle
		case err != nil:
			return fmt.Errorf("zmq recv: %w", err)
		}
		if m.Command {
			if err := c.Pong(m.Parts()[0]); err != nil {
				return fmt.Errorf("zmq pong: %w", err)
			}
		}
		s.deliverFrames(h, m.Command, m.Parts())
	}
}

// deliverFrames hands a well-formed batch to h. Commands (ZMTP PINGs) and
// anything not [topic, 8-byte seq, payload] are dropped; so is a topic the
// publisher should have filtered.
func (s *Subscriber) deliverFrames(h Handler, command bool, frames [][]byte) {
	if command || len(frames) != 3 || len(frames[1]) != 8 ||
		!bytes.HasPrefix(frames[0], []byte(s.cfg.Topic)) {
		s.dropped.Add(1)
		return
	}
	s.messages.Add(1)
	s.lastMessage.Store(time.Now().UnixNano())
	h.Message(frames[0], binary.BigEndian.Uint64(frames[1]), frames[2])
}

// idleTimer is an optional inactivity timer; with d == 0 it never fires.
type idleTimer struct {
	d time.Duration
	t *time.Timer
}

func newIdleTimer(d time.Duration) *idleTimer {
	it := &idleTimer{d: d}
	if d > 0 {
		it.t = time.NewTimer(d)
	}
	return it
}

func (it *idleTimer) c() <-chan time.Time {
	if it.t == nil {
		return nil
	}
	return it.t.C
}

func (it *idleTimer) reset() {
	if it.t != nil {
		it.t.Reset(it.d)
	}
}

func (it *idleTimer) stop() {
	if it.t != nil {
		it.t.Stop()
	}
}

// splitEndpoint parses "tcp://host:port".
func splitEndpoint(ep string) (host string, port int, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("endpoint %q: only tcp://host:port is supported", ep)
	}
	h, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, fmt.Errorf("endpoint %q: %w", ep, err)
	}
	if p == "*" {
		p = "0"
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("endpoint %q: bad port %q", ep, p)
	}
	return h, n, nil
}
