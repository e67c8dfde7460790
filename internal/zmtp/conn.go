// Package zmtp is the ZeroMQ wire protocol, ZMTP 3.x with the NULL
// security mechanism, as the gateway's KV-event subscriber
// (kvindex/zmqsub) and the vLLM simulator (internal/sim/vllmsim) speak it:
// the greeting, the READY command with its Socket-Type (and optionally
// Identity) metadata, multipart frames and PING/PONG. Sockets, queues and
// subscriptions stay with those packages.
//
// Every connection reads through a frame guard (see GuardError) that
// validates the peer's greeting and READY whole, and every frame header
// before a byte of its body is read, so nothing allocates for a frame over
// the limit; the handshake runs under a deadline. The NULL handshake is the
// same for the connecting and the accepting side, so Start serves both.
package zmtp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// Socket types, as announced in a READY command's Socket-Type property.
const (
	Pub    = "PUB"
	Sub    = "SUB"
	XPub   = "XPUB"
	XSub   = "XSUB"
	Dealer = "DEALER"
	Router = "ROUTER"
	Req    = "REQ"
	Rep    = "REP"
)

// PeerTypes returns the socket types ZMTP lets a sockType socket talk to
// (RFC 23's compatibility table), or nil for a type not listed.
func PeerTypes(sockType string) []string {
	switch sockType {
	case Pub, XPub:
		return []string{Sub, XSub}
	case Sub, XSub:
		return []string{Pub, XPub}
	case Dealer:
		return []string{Rep, Dealer, Router}
	case Router:
		return []string{Req, Dealer, Router}
	case Req:
		return []string{Rep, Router}
	case Rep:
		return []string{Req, Dealer}
	}
	return nil
}

// versionMajor and versionMinor are the ZMTP version this package
// announces: 3.0. libzmq's
// publishers take a 3.0 subscriber's subscription as a message whose body
// is 1 and the topic, and heartbeat it as any other peer.
const versionMajor, versionMinor = 3, 0

// Defaults for zero Config fields.
const (
	DefaultMaxFrame         = 64 << 10
	DefaultHandshakeTimeout = 5 * time.Second
)

// Config says how Start sets a connection up.
type Config struct {
	// SocketType is announced to the peer (Pub, Sub, Dealer, ...).
	SocketType string
	// Identity, when not nil, is announced as the Identity property, as
	// libzmq's REQ, DEALER and ROUTER sockets do (empty by default).
	Identity []byte
	// PeerTypes are the peer socket types accepted; empty accepts any.
	PeerTypes []string
	// MaxFrame refuses data frames announcing more bytes; 0 means
	// DefaultMaxFrame. A message may carry MessageOverhead bytes more.
	MaxFrame int64
	// Timeout bounds the whole handshake; 0 means DefaultHandshakeTimeout.
	Timeout time.Duration
}

// Conn is one ZMTP connection past its handshake. It is not safe for
// concurrent use, except Shutdown; a caller may write to the underlying
// net.Conn from another goroutine while one reads (a publisher's writer).
type Conn struct {
	g   *guardConn
	buf []byte  // the message being read; its frames are copied out whole
	hdr [9]byte // a frame header (here, not on the stack: a Reader's argument escapes)
}

// MaxKeptBuffer bounds the read buffer a connection keeps between
// messages; a larger message's buffer is dropped after it.
const MaxKeptBuffer = 1 << 20

// Message is one message read: the frames of a data message, or a
// command's body (name first) as its one frame.
type Message struct {
	Command bool
	n       int
	frames  [MaxFramesPerMessage][]byte
}

// Parts returns the message's frames.
func (m *Message) Parts() [][]byte { return m.frames[:m.n] }

// Start completes the NULL handshake on nc, dialled or accepted, within
// cfg.Timeout: greetings, then READY commands (the guard checks the peer's
// socket type against cfg.PeerTypes). ctx ending aborts it. On failure nc
// is closed.
func Start(ctx context.Context, nc net.Conn, cfg Config) (*Conn, error) {
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultHandshakeTimeout
	}
	maxFrame := cfg.MaxFrame
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	lim := guardLimits{maxFrame: maxFrame, peerTypes: cfg.PeerTypes, handshakeTimeout: timeout}
	c := &Conn{g: newGuardConn(nc, lim)}
	stop := context.AfterFunc(ctx, c.Shutdown)
	defer stop()
	_ = nc.SetWriteDeadline(time.Now().Add(timeout))
	if err := c.handshake(cfg.SocketType, cfg.Identity); err != nil {
		c.Shutdown()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("zmtp handshake: %w", err)
	}
	_ = nc.SetWriteDeadline(time.Time{})
	return c, nil
}

// handshake runs the NULL mechanism's exchange: greetings, then READY
// commands. The guard reads the peer's (the greeting's version and
// mechanism, the READY's metadata and socket type) before it lets a byte
// of them through, and bounds the whole exchange with its deadline.
func (c *Conn) handshake(sockType string, identity []byte) error {
	if _, err := c.g.Write(Greeting()); err != nil {
		return err
	}
	var peer [GreetingLen]byte
	if _, err := io.ReadFull(c.g, peer[:]); err != nil {
		return err // the guard names what was wrong with it
	}
	if _, err := c.g.Write(AppendReady(nil, sockType, identity)); err != nil {
		return err
	}
	var m Message
	if err := c.Read(&m); err != nil {
		return err
	}
	if !m.Command || !bytes.HasPrefix(m.frames[0], []byte("\x05READY")) {
		// The guard lets only a READY through here; this is its backstop.
		return &GuardError{Reason: "expected a READY command after the greeting"}
	}
	return nil
}

// Send writes a message of frames within timeout.
func (c *Conn) Send(timeout time.Duration, frames ...[]byte) error {
	return c.WriteWithin(timeout, AppendMessage(nil, frames...))
}

// WriteWithin writes b, already ZMTP-encoded, failing if that takes longer
// than timeout. A failed write ends the connection.
func (c *Conn) WriteWithin(timeout time.Duration, b []byte) error {
	_ = c.g.Conn.SetWriteDeadline(time.Now().Add(timeout))
	_, err := c.g.Write(b)
	_ = c.g.Conn.SetWriteDeadline(time.Time{})
	return err
}

// Read reads the next message into m. Its frames share one new
// allocation, which the caller may keep. The guard has checked every frame
// header before a byte of it is read here: sizes, flags, frame and message
// limits.
func (c *Conn) Read(m *Message) error {
	var ends [MaxFramesPerMessage]int
	c.buf = c.buf[:0]
	m.Command, m.n = false, 0
	for {
		flags, err := c.readFrame()
		if err != nil {
			return err
		}
		ends[m.n], m.n = len(c.buf), m.n+1
		if flags&FlagCommand != 0 {
			m.Command = true
			break
		}
		if flags&FlagMore == 0 || m.n == len(ends) {
			break
		}
	}
	msg := bytes.Clone(c.buf)
	if cap(c.buf) > MaxKeptBuffer {
		c.buf = nil // a rare large message: not held for the connection's life
	}
	for i, start := 0, 0; i < m.n; i++ {
		m.frames[i] = msg[start:ends[i]:ends[i]]
		start = ends[i]
	}
	return nil
}

// readFrame appends the next frame's body to c.buf and returns its flags.
func (c *Conn) readFrame() (byte, error) {
	h := c.hdr[:]
	if _, err := io.ReadFull(c.g, h[:2]); err != nil {
		return 0, err
	}
	size := uint64(h[1])
	if h[0]&FlagLong != 0 {
		if _, err := io.ReadFull(c.g, h[2:]); err != nil {
			return 0, err
		}
		size = binary.BigEndian.Uint64(h[1:])
	}
	// size is within the guard's limits, else the header would not have
	// been released.
	at := len(c.buf)
	c.buf = append(c.buf, make([]byte, size)...)
	if _, err := io.ReadFull(c.g, c.buf[at:]); err != nil {
		return 0, err
	}
	return h[0], nil
}

// PongTimeout bounds writing a PONG: a peer that reads nothing must not
// hold its reader.
const PongTimeout = 5 * time.Second

// Pong answers a PING command (its body, as Read returns it) with a PONG,
// within PongTimeout; any other command is ignored. Peers only ping when
// heartbeats are configured.
func (c *Conn) Pong(cmd []byte) error {
	pong := AppendPong(nil, cmd)
	if pong == nil {
		return nil
	}
	return c.WriteWithin(PongTimeout, pong)
}

// SetIdle makes the next reads fail with os.ErrDeadlineExceeded after d
// without a byte; d <= 0 clears the deadline.
func (c *Conn) SetIdle(d time.Duration) {
	var t time.Time
	if d > 0 {
		t = time.Now().Add(d)
	}
	_ = c.g.Conn.SetReadDeadline(t)
}

// Shutdown closes the connection; a read or write in progress returns
// ErrShutdown. Safe to call from any goroutine, more than once.
func (c *Conn) Shutdown() { c.g.shutdown() }

// Greeting is the 64-byte ZMTP 3.0 greeting of a NULL-mechanism peer. Its
// as-server flag is 0, as the NULL mechanism requires of both sides.
func Greeting() []byte {
	g := make([]byte, GreetingLen)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = versionMajor, versionMinor
	copy(g[12:], "NULL")
	return g
}

// AppendReady appends a READY command announcing sockType, and identity
// when it is not nil.
func AppendReady(dst []byte, sockType string, identity []byte) []byte {
	body := append([]byte{5}, "READY"...)
	body = appendProperty(body, "Socket-Type", []byte(sockType))
	if identity != nil {
		body = appendProperty(body, "Identity", identity)
	}
	return AppendFrame(dst, FlagCommand, body)
}

// appendProperty appends a metadata property: name length, name, 4-byte
// value length, value.
func appendProperty(dst []byte, name string, value []byte) []byte {
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(value)))
	return append(dst, value...)
}

// AppendPong appends the PONG answering cmd, a command body as Read
// returns it (name-length, "PING", 2-byte TTL, context), carrying the
// ping's context. It returns nil when cmd is not a PING.
func AppendPong(dst, cmd []byte) []byte {
	const name = "\x04PING"
	if !bytes.HasPrefix(cmd, []byte(name)) || len(cmd) < len(name)+2 {
		return nil
	}
	body := append([]byte("\x04PONG"), cmd[len(name)+2:]...)
	return AppendFrame(dst, FlagCommand, body)
}

// AppendFrame appends a frame with flags (FlagLong is set here when the
// body needs it).
func AppendFrame(dst []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		dst = append(dst, flags|FlagLong)
		dst = binary.BigEndian.AppendUint64(dst, uint64(len(body)))
	} else {
		dst = append(dst, flags, byte(len(body)))
	}
	return append(dst, body...)
}

// AppendMessage appends a multipart data message of frames.
func AppendMessage(dst []byte, frames ...[]byte) []byte {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = FlagMore
		}
		dst = AppendFrame(dst, flags, f)
	}
	return dst
}
