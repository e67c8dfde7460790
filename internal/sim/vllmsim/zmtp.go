package vllmsim

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// The simulator's PUB and ROUTER sockets are built on zmq4's ZMTP connection
// layer (zmq4.Open performs the greeting and NULL handshake) with their own
// accept/dial loops, queues and frame reader. zmq4's socket types would leak
// their writer goroutine on Close (v0.17.0 never closes a PUB's writer),
// block every subscriber behind a slow one, and allocate whatever frame size
// a peer announces; a simulator that many tests start and stop must not.

const (
	maxInFrame       = 64 << 10 // frames a subscriber or replay client may send us
	maxInFrames      = 16       // frames per inbound message
	handshakeTimeout = 5 * time.Second
	writeTimeout     = 30 * time.Second
	greetingLen      = 64
	flagMore         = 0x01
	flagLong         = 0x02
	flagCommand      = 0x04
)

var errFrameTooLarge = errors.New("zmtp: inbound frame too large")

// endpoint is a parsed ZMQ endpoint.
type endpoint struct {
	network string // "tcp" or "unix"
	addr    string // host:port or socket path
	bind    bool
}

// parseEndpoint applies vLLM's rule (bind when the endpoint contains "*" or
// "::" or is ipc://, connect otherwise), plus: a tcp port of 0 binds. "*" is
// replaced by bindHost.
func parseEndpoint(ep, bindHost string) (endpoint, error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return endpoint{}, fmt.Errorf("zmq endpoint %q: missing scheme", ep)
	}
	switch scheme {
	case "tcp":
		bind := strings.Contains(rest, "*") || strings.Contains(rest, "::")
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return endpoint{}, fmt.Errorf("zmq endpoint %q: %w", ep, err)
		}
		if port == "0" {
			bind = true
		}
		if host == "*" {
			host = bindHost
		}
		return endpoint{network: "tcp", addr: net.JoinHostPort(host, port), bind: bind}, nil
	case "ipc":
		if rest == "" {
			return endpoint{}, fmt.Errorf("zmq endpoint %q: empty path", ep)
		}
		return endpoint{network: "unix", addr: rest, bind: true}, nil
	default:
		return endpoint{}, fmt.Errorf("zmq endpoint %q: scheme %q not supported (tcp, ipc)", ep, scheme)
	}
}

// endpointString formats a listener address as a ZMQ endpoint.
func endpointString(a net.Addr) string {
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// guardConn limits what a peer can make zmq4 or us allocate: it parses the
// ZMTP framing of everything read after the 64-byte greeting and fails a
// read whose frame header announces more than maxInFrame bytes, or a message
// with more than maxInFrames frames, before the bytes reach the parser.
type guardConn struct {
	net.Conn
	br       *bufio.Reader
	greeting int   // greeting bytes still to pass through
	hdrLeft  int   // bytes of the current frame header still to hand out
	bodyLeft int64 // bytes of the current frame body still to hand out
	next     int64 // body size of the frame whose header is being handed out
	frames   int   // frames in the current message so far
}

func newGuardConn(c net.Conn) *guardConn {
	return &guardConn{Conn: c, br: bufio.NewReaderSize(c, 4096), greeting: greetingLen}
}

func (g *guardConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	switch {
	case g.greeting > 0:
		n, err := g.br.Read(p[:min(len(p), g.greeting)])
		g.greeting -= n
		return n, err
	case g.hdrLeft > 0:
		n, err := g.br.Read(p[:min(len(p), g.hdrLeft)])
		g.hdrLeft -= n
		if g.hdrLeft == 0 {
			g.bodyLeft = g.next
		}
		return n, err
	case g.bodyLeft > 0:
		n, err := g.br.Read(p[:min(int64(len(p)), g.bodyLeft)])
		g.bodyLeft -= int64(n)
		return n, err
	}
	// At a frame header: inspect it before handing any of it out.
	h, err := g.br.Peek(2)
	if err != nil {
		return 0, err
	}
	flags := h[0]
	size := int64(h[1])
	hdrLen := 2
	if flags&flagLong != 0 {
		h, err = g.br.Peek(9)
		if err != nil {
			return 0, err
		}
		u := binary.BigEndian.Uint64(h[1:9])
		if u > maxInFrame {
			return 0, errFrameTooLarge
		}
		size = int64(u)
		hdrLen = 9
	}
	if size > maxInFrame {
		return 0, errFrameTooLarge
	}
	if flags&flagMore != 0 && flags&flagCommand == 0 {
		g.frames++
		if g.frames >= maxInFrames {
			return 0, errFrameTooLarge
		}
	} else {
		g.frames = 0
	}
	g.hdrLeft, g.next = hdrLen, size
	return g.Read(p)
}

// readMsg reads one ZMTP message (all frames) from g. Commands are returned
// with isCmd set and their single frame.
func readMsg(g *guardConn) (frames [][]byte, isCmd bool, err error) {
	var hdr [9]byte
	for {
		if _, err := io.ReadFull(g, hdr[:2]); err != nil {
			return nil, false, err
		}
		flags := hdr[0]
		size := uint64(hdr[1])
		if flags&flagLong != 0 {
			if _, err := io.ReadFull(g, hdr[2:9]); err != nil {
				return nil, false, err
			}
			size = binary.BigEndian.Uint64(hdr[1:9])
		}
		if size > maxInFrame {
			return nil, false, errFrameTooLarge
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(g, body); err != nil {
			return nil, false, err
		}
		frames = append(frames, body)
		if flags&flagCommand != 0 {
			return frames, true, nil
		}
		if flags&flagMore == 0 {
			return frames, false, nil
		}
		if len(frames) >= maxInFrames {
			return nil, false, errFrameTooLarge
		}
	}
}

// appendFrames appends the ZMTP encoding of a multipart message.
func appendFrames(dst []byte, frames ...[]byte) []byte {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags |= flagMore
		}
		if len(f) > 255 {
			dst = append(dst, flags|flagLong)
			dst = binary.BigEndian.AppendUint64(dst, uint64(len(f)))
		} else {
			dst = append(dst, flags, byte(len(f)))
		}
		dst = append(dst, f...)
	}
	return dst
}

// pongBody answers a ZMTP PING command (frame = name-len, "PING", ttl(2),
// context) with the PONG command body carrying the same context.
func pongReply(cmd []byte) ([]byte, bool) {
	if len(cmd) < 1+4+2 || cmd[0] != 4 || string(cmd[1:5]) != "PING" {
		return nil, false
	}
	ctx := cmd[7:]
	body := append([]byte{4}, "PONG"...)
	body = append(body, ctx...)
	out := []byte{flagCommand, byte(len(body))}
	if len(body) > 255 {
		return nil, false
	}
	return append(out, body...), true
}

// handshake performs the ZMTP greeting and NULL handshake on c as sockType.
// It never panics: zmq4 has panicked on malformed peer metadata.
func handshake(c net.Conn, sockType zmq4.SocketType, server bool) (g *guardConn, err error) {
	g = newGuardConn(c)
	if err := c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return nil, fmt.Errorf("zmtp handshake: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("zmtp handshake: peer caused a panic: %v", r)
		}
	}()
	var id [8]byte
	_, _ = rand.Read(id[:])
	if _, err := zmq4.Open(g, null.Security(), sockType, zmq4.SocketIdentity(hex.EncodeToString(id[:])), server, nil); err != nil {
		return nil, fmt.Errorf("zmtp handshake: %w", err)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("zmtp handshake: %w", err)
	}
	return g, nil
}
