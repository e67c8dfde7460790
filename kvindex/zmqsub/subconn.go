package zmqsub

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// In connect mode the subscriber speaks ZMTP itself rather than through
// zmq4. A zmq4 socket reads each connection on a goroutine of its own and
// hands every message through two channels before it reaches the handler;
// with vLLM publishing a batch per scheduler step, those hand-offs and
// their wake-ups cost more CPU than reading and applying the batch. A
// subConn is read on the goroutine that applies the batches, through the
// same frame guard, so what reaches the handler is validated exactly as
// before. Bind mode and the replay DEALER, which are not on the hot path,
// still use zmq4.

// zmtpMajor and zmtpMinor are the version this package announces: 3.0,
// as zmq4 does. libzmq's publishers take a 3.0 subscriber's subscription
// as a message whose body is 1 and the topic.
const zmtpMajor, zmtpMinor = 3, 0

// subConn is one SUB connection to a publisher. It is not safe for
// concurrent use, except shutdown.
type subConn struct {
	g   *guardConn
	buf []byte  // the message being read; its frames are copied out whole
	hdr [9]byte // a frame header (here, not on the stack: a Reader's argument escapes)
}

// maxKeptBuffer bounds the read buffer a connection keeps between
// messages.
const maxKeptBuffer = 1 << 20

// subMessage is one message read: the frames of a data message, or a
// command's body (name first).
type subMessage struct {
	command bool
	n       int // frames
	frames  [maxFramesPerMessage][]byte
}

// parts returns the message's frames.
func (m *subMessage) parts() [][]byte { return m.frames[:m.n] }

// dialSub connects to the publisher at addr and completes the handshake
// within timeout: greetings, READY commands (the guard checks the peer's
// socket type against lim), then the subscription to topic.
func dialSub(ctx context.Context, addr, topic string, lim guardLimits, timeout time.Duration) (*subConn, error) {
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err() // net reports a context deadline as "i/o timeout"
		}
		return nil, err
	}
	c := &subConn{g: newGuardConn(nc, lim, connHooks{})}
	stop := context.AfterFunc(ctx, c.shutdown)
	defer stop()
	_ = nc.SetWriteDeadline(time.Now().Add(timeout))
	if err := c.handshake(topic); err != nil {
		c.shutdown()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("zmtp handshake: %w", err)
	}
	_ = nc.SetWriteDeadline(time.Time{})
	return c, nil
}

// handshake runs the NULL mechanism's exchange from the subscriber's side.
func (c *subConn) handshake(topic string) error {
	if _, err := c.g.Write(greeting()); err != nil {
		return err
	}
	var peer [greetingLen]byte
	if _, err := io.ReadFull(c.g, peer[:]); err != nil {
		return err // the guard names what was wrong with it
	}
	if _, err := c.g.Write(appendCommand(nil, "READY", "Socket-Type", "SUB")); err != nil {
		return err
	}
	var m subMessage
	if err := c.read(&m); err != nil {
		return err
	}
	if !m.command || !bytes.HasPrefix(m.frames[0], []byte("\x05READY")) {
		// The guard lets only a READY through here; this is its backstop.
		return &GuardError{Reason: "expected a READY command after the greeting"}
	}
	_, err := c.g.Write(appendFrame(nil, 0, append([]byte{1}, topic...)))
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
func (c *subConn) read(m *subMessage) error {
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
func (c *subConn) readFrame() (byte, error) {
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
func (c *subConn) pong(ping []byte) error {
	const name = "\x04PING"
	if !bytes.HasPrefix(ping, []byte(name)) || len(ping) < len(name)+2 {
		return nil
	}
	body := append([]byte("\x04PONG"), ping[len(name)+2:]...)
	_, err := c.g.Write(appendFrame(nil, flagCommand, body))
	return err
}

// setIdle makes the next reads fail with os.ErrDeadlineExceeded after d
// without a byte; d <= 0 clears the deadline.
func (c *subConn) setIdle(d time.Duration) {
	var t time.Time
	if d > 0 {
		t = time.Now().Add(d)
	}
	_ = c.g.Conn.SetReadDeadline(t)
}

// shutdown closes the connection; a read in progress returns. Safe to call
// from any goroutine, more than once.
func (c *subConn) shutdown() { c.g.shutdown() }
