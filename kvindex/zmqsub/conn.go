package zmqsub

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The subscriber speaks ZMTP 3.0 itself, over the frame guard: as a SUB
// to the engines' publishers (dialled, or accepted in bind mode) and as a
// DEALER to their replay sockets. It did so through go-zeromq/zmq4 once,
// whose sockets read each connection on a goroutine of their own and hand
// every message through two channels before the handler sees it; with
// vLLM publishing a batch per scheduler step, those hand-offs and their
// wake-ups cost more CPU than reading and applying the batch. A dialled
// connection is read on the goroutine that applies its batches.

// zmtpMajor and zmtpMinor are the version this package announces: 3.0.
// libzmq's publishers take a 3.0 subscriber's subscription as a message
// whose body is 1 and the topic, and heartbeat it as any other peer.
const zmtpMajor, zmtpMinor = 3, 0

// zconn is one ZMTP connection. It is not safe for concurrent use, except
// shutdown.
type zconn struct {
	g   *guardConn
	buf []byte  // the message being read; its frames are copied out whole
	hdr [9]byte // a frame header (here, not on the stack: a Reader's argument escapes)
}

// keepAlive detects dead peers (a publisher host that vanished without a
// FIN) in about 30 s without an application idle timeout.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// maxKeptBuffer bounds the read buffer a connection keeps between
// messages.
const maxKeptBuffer = 1 << 20

// zmessage is one message read: the frames of a data message, or a
// command's body (name first).
type zmessage struct {
	command bool
	n       int // frames
	frames  [maxFramesPerMessage][]byte
}

// parts returns the message's frames.
func (m *zmessage) parts() [][]byte { return m.frames[:m.n] }

// dialSub connects to the publisher at addr and completes the handshake
// within timeout: greetings, READY commands (the guard checks the peer's
// socket type against lim), then the subscription to topic.
func dialSub(ctx context.Context, addr, topic string, lim guardLimits, timeout time.Duration) (*zconn, error) {
	c, err := dialZMTP(ctx, addr, "SUB", lim, timeout)
	if err != nil {
		return nil, err
	}
	if err := c.subscribe(timeout, topic); err != nil {
		c.shutdown()
		return nil, err
	}
	return c, nil
}

// subscribe sends a SUB's subscription to topic within timeout, as ZMTP
// 3.0 does: a message whose body is 1 and the topic.
func (c *zconn) subscribe(timeout time.Duration, topic string) error {
	if err := c.send(timeout, append([]byte{1}, topic...)); err != nil {
		return fmt.Errorf("zmtp subscribe: %w", err)
	}
	return nil
}

// dialZMTP connects to addr as a sockType socket and completes the NULL
// handshake within timeout.
func dialZMTP(ctx context.Context, addr, sockType string, lim guardLimits, timeout time.Duration) (*zconn, error) {
	d := net.Dialer{Timeout: timeout, KeepAliveConfig: keepAlive}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err() // net reports a context deadline as "i/o timeout"
		}
		return nil, err
	}
	return startZMTP(ctx, nc, sockType, lim, timeout)
}

// startZMTP completes the NULL handshake on nc, dialled or accepted, as a
// sockType socket within timeout. On failure nc is closed.
func startZMTP(ctx context.Context, nc net.Conn, sockType string, lim guardLimits, timeout time.Duration) (*zconn, error) {
	lim.handshakeTimeout = timeout
	c := &zconn{g: newGuardConn(nc, lim)}
	stop := context.AfterFunc(ctx, c.shutdown)
	defer stop()
	_ = nc.SetWriteDeadline(time.Now().Add(timeout))
	if err := c.handshake(sockType); err != nil {
		c.shutdown()
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
func (c *zconn) handshake(sockType string) error {
	if _, err := c.g.Write(greeting()); err != nil {
		return err
	}
	var peer [greetingLen]byte
	if _, err := io.ReadFull(c.g, peer[:]); err != nil {
		return err // the guard names what was wrong with it
	}
	if _, err := c.g.Write(appendCommand(nil, "READY", "Socket-Type", sockType)); err != nil {
		return err
	}
	var m zmessage
	if err := c.read(&m); err != nil {
		return err
	}
	if !m.command || !bytes.HasPrefix(m.frames[0], []byte("\x05READY")) {
		// The guard lets only a READY through here; this is its backstop.
		return &GuardError{Reason: "expected a READY command after the greeting"}
	}
	return nil
}

// send writes a message of frames within timeout.
func (c *zconn) send(timeout time.Duration, frames ...[]byte) error {
	var out []byte
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		out = appendFrame(out, flags, f)
	}
	return c.writeWithin(timeout, out)
}

// writeWithin writes b, failing if that takes longer than timeout.
func (c *zconn) writeWithin(timeout time.Duration, b []byte) error {
	_ = c.g.Conn.SetWriteDeadline(time.Now().Add(timeout))
	_, err := c.g.Write(b)
	_ = c.g.Conn.SetWriteDeadline(time.Time{})
	return err
}

// greeting is the 64-byte ZMTP greeting of a NULL-mechanism client.
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = zmtpMajor, zmtpMinor
	copy(g[12:], "NULL")
	return g
}

// appendCommand appends a command frame: its name and one metadata
// property.
func appendCommand(dst []byte, name, key, value string) []byte {
	body := append([]byte{byte(len(name))}, name...)
	body = append(body, byte(len(key)))
	body = append(body, key...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(value)))
	body = append(body, value...)
	return appendFrame(dst, flagCommand, body)
}

// appendFrame appends a frame with flags (the size flag is set here).
func appendFrame(dst []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		dst = append(dst, flags|flagLong)
		dst = binary.BigEndian.AppendUint64(dst, uint64(len(body)))
	} else {
		dst = append(dst, flags, byte(len(body)))
	}
	return append(dst, body...)
}

// read reads the next message into m. Its frames share one new
// allocation, which the caller may keep. The guard has checked every frame
// header before a byte of it is read here: sizes, flags, frame and message
// limits.
func (c *zconn) read(m *zmessage) error {
	var ends [maxFramesPerMessage]int
	c.buf = c.buf[:0]
	m.command, m.n = false, 0
	for {
		flags, err := c.readFrame()
		if err != nil {
			return err
		}
		ends[m.n], m.n = len(c.buf), m.n+1
		if flags&flagCommand != 0 {
			m.command = true
			break
		}
		if flags&flagMore == 0 || m.n == len(ends) {
			break
		}
	}
	msg := bytes.Clone(c.buf)
	if cap(c.buf) > maxKeptBuffer {
		c.buf = nil // a rare large batch: not held for the session's life
	}
	for i, start := 0, 0; i < m.n; i++ {
		m.frames[i] = msg[start:ends[i]:ends[i]]
		start = ends[i]
	}
	return nil
}

// readFrame appends the next frame's body to c.buf and returns its flags.
func (c *zconn) readFrame() (byte, error) {
	h := c.hdr[:]
	if _, err := io.ReadFull(c.g, h[:2]); err != nil {
		return 0, err
	}
	size := uint64(h[1])
	if h[0]&flagLong != 0 {
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

// pong answers a PING command (its body) as ZMTP 3.1 asks: a PONG with
// the ping's context. Publishers only ping when heartbeats are configured.
func (c *zconn) pong(ping []byte) error {
	const name = "\x04PING"
	if !bytes.HasPrefix(ping, []byte(name)) || len(ping) < len(name)+2 {
		return nil
	}
	body := append([]byte("\x04PONG"), ping[len(name)+2:]...)
	return c.writeWithin(pongTimeout, appendFrame(nil, flagCommand, body))
}

// pongTimeout bounds writing a PONG: a peer that reads nothing must not
// hold the subscriber.
const pongTimeout = 5 * time.Second

// setIdle makes the next reads fail with os.ErrDeadlineExceeded after d
// without a byte; d <= 0 clears the deadline.
func (c *zconn) setIdle(d time.Duration) {
	var t time.Time
	if d > 0 {
		t = time.Now().Add(d)
	}
	_ = c.g.Conn.SetReadDeadline(t)
}

// shutdown closes the connection; a read in progress returns. Safe to call
// from any goroutine, more than once.
func (c *zconn) shutdown() { c.g.shutdown() }

// probe checks that addr speaks ZMTP before a session is dialled: connect,
// then read the 10-byte greeting signature (0xff, 8 bytes, 0x7f) that every
// ZMTP 3 peer sends first. A server that says nothing or something else
// fails here, with an error that says so, and costs no session.
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
