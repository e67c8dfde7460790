package zmtp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// ZMTP 3.x wire constants (https://rfc.zeromq.org/spec/23/).
const (
	// GreetingLen is the length of the greeting each peer sends first.
	GreetingLen = 64

	// FlagMore, FlagLong and FlagCommand are a frame header's flag bits:
	// more frames follow, an 8-byte size, a command frame.
	FlagMore    = 0x01
	FlagLong    = 0x02
	FlagCommand = 0x04
	flagsKnown  = FlagMore | FlagLong | FlagCommand

	// MaxCommandSize bounds a ZMTP command (READY metadata, PING, ...). Real
	// commands are a few hundred bytes; the bound keeps the READY body small
	// enough to be validated in the read buffer before it is released.
	MaxCommandSize = 16 << 10
	// MaxFramesPerMessage bounds a multipart message. vLLM sends 3 frames;
	// a few more are let through so a subscriber can count them as dropped.
	MaxFramesPerMessage = 16
	// MessageOverhead is what a multipart message may carry beyond one
	// frame of the maximum size (topic, sequence number and stray extra
	// frames).
	MessageOverhead = 64 << 10

	readBufferSize = 64 << 10
)

// GuardError reports a ZMTP stream the frame guard refused. It implements
// net.Error, never a timeout.
type GuardError struct {
	Reason string
}

func (e *GuardError) Error() string { return "zmtp guard: " + e.Reason }

// Timeout implements net.Error.
func (e *GuardError) Timeout() bool { return false }

// Temporary implements net.Error.
func (e *GuardError) Temporary() bool { return false }

// ErrShutdown fails the reads and writes of a connection ended by Shutdown.
var ErrShutdown = errors.New("zmtp: connection shut down")

// guardLimits configures what a guardConn lets through.
type guardLimits struct {
	maxFrame  int64    // largest data frame
	peerTypes []string // acceptable peer Socket-Type values; empty = any
	// handshakeTimeout bounds greeting + READY; 0 = no deadline.
	handshakeTimeout time.Duration
}

func (l guardLimits) maxMessage() int64 { return l.maxFrame + MessageOverhead }

// guardPhase is where a guardConn is in the inbound ZMTP stream.
type guardPhase uint8

const (
	phaseGreeting guardPhase = iota
	phaseReady
	phaseFrames
)

// guardConn wraps the connection a Conn reads. It parses the inbound
// ZMTP stream and only releases bytes it has validated: the greeting and
// the peer's READY command are checked whole (metadata, socket type), and
// every frame header is checked before its reader sees it, so nothing
// allocates for a frame larger than the limit. Any violation closes the
// connection and fails the read. Reads are also buffered: a reader's small
// reads (a frame header, then its body) cost no syscall each.
type guardConn struct {
	net.Conn // the underlying connection (addresses, deadlines)

	lim guardLimits

	rmu     sync.Mutex // serialises Read; guards the fields below
	br      *bufio.Reader
	phase   guardPhase
	release int64 // validated bytes not yet released to the reader
	// readyLeft counts READY bytes still to be released; the handshake is
	// complete when it drops to zero.
	readyLeft int64
	inMsg     bool
	msgFrames int
	msgBytes  int64

	emu sync.Mutex // guards err
	err error      // sticky: once set, every Read/Write fails
}

func newGuardConn(c net.Conn, lim guardLimits) *guardConn {
	g := &guardConn{
		Conn: c,
		lim:  lim,
		br:   bufio.NewReaderSize(c, readBufferSize),
	}
	if lim.handshakeTimeout > 0 {
		// Bounds the handshake; cleared once the peer's READY is read.
		_ = c.SetReadDeadline(time.Now().Add(lim.handshakeTimeout))
	}
	return g
}

// stickyErr returns the error that ended this connection, if any.
func (g *guardConn) stickyErr() error {
	g.emu.Lock()
	defer g.emu.Unlock()
	return g.err
}

// fail records err as the connection's fate (first error wins) and closes
// the underlying connection so any blocked read or write returns.
func (g *guardConn) fail(err error) error {
	g.emu.Lock()
	first := g.err == nil
	if first {
		g.err = err
	}
	err = g.err
	g.emu.Unlock()
	if first {
		_ = g.Conn.Close()
	}
	return err
}

// shutdown ends the connection on its owner's behalf: a read or write in
// progress fails with ErrShutdown.
func (g *guardConn) shutdown() { g.fail(ErrShutdown) }

// Close ends the connection; later reads and writes fail with
// net.ErrClosed.
func (g *guardConn) Close() error {
	g.fail(net.ErrClosed)
	return nil
}

// Write passes the reader's output through; a failed write ends the
// connection.
func (g *guardConn) Write(p []byte) (int, error) {
	if err := g.stickyErr(); err != nil {
		return 0, err
	}
	n, err := g.Conn.Write(p)
	if err != nil {
		return n, g.fail(err)
	}
	return n, nil
}

// Read releases validated inbound bytes.
func (g *guardConn) Read(p []byte) (int, error) {
	g.rmu.Lock()
	defer g.rmu.Unlock()
	if err := g.stickyErr(); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	for g.release == 0 {
		if err := g.advance(); err != nil {
			return 0, g.fail(err)
		}
	}
	want := int64(len(p))
	if want > g.release {
		want = g.release
	}
	if g.readyLeft > 0 && want >= g.readyLeft && g.lim.handshakeTimeout > 0 {
		// The READY command completes with this read: the handshake's
		// deadline ends.
		_ = g.Conn.SetReadDeadline(time.Time{})
	}
	n, err := g.br.Read(p[:want])
	g.release -= int64(n)
	if g.readyLeft > 0 {
		g.readyLeft -= int64(n)
		if g.readyLeft < 0 {
			g.readyLeft = 0
		}
	}
	if err != nil {
		return n, g.fail(err)
	}
	return n, nil
}

// peek returns the next n buffered bytes, reading from the network as needed.
// A clean EOF before the first byte stays io.EOF: the reader sees a closed peer.
func (g *guardConn) peek(n int) ([]byte, error) {
	b, err := g.br.Peek(n)
	if err != nil {
		if errors.Is(err, io.EOF) && len(b) > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return b, nil
}

// advance validates the next unit of the inbound stream (greeting, READY,
// or one frame header) and makes it releasable.
func (g *guardConn) advance() error {
	switch g.phase {
	case phaseGreeting:
		b, err := g.peek(GreetingLen)
		if err != nil {
			return err
		}
		if err := checkGreeting(b); err != nil {
			return err
		}
		g.release = GreetingLen
		g.phase = phaseReady
		return nil
	case phaseReady:
		flags, size, hdrLen, err := g.frameHeader()
		if err != nil {
			return err
		}
		if flags&FlagCommand == 0 || flags&FlagMore != 0 {
			return &GuardError{Reason: "expected a READY command after the greeting"}
		}
		if size > MaxCommandSize {
			return &GuardError{Reason: fmt.Sprintf("handshake command of %d bytes exceeds %d", size, MaxCommandSize)}
		}
		b, err := g.peek(hdrLen + int(size))
		if err != nil {
			return err
		}
		if err := checkReady(b[hdrLen:], g.lim.peerTypes); err != nil {
			return err
		}
		g.release = int64(hdrLen) + size
		g.readyLeft = g.release
		g.phase = phaseFrames
		return nil
	default:
		flags, size, hdrLen, err := g.frameHeader()
		if err != nil {
			return err
		}
		if err := g.checkFrame(flags, size); err != nil {
			return err
		}
		g.release = int64(hdrLen) + size
		return nil
	}
}

// frameHeader decodes the next frame header without consuming it.
func (g *guardConn) frameHeader() (flags byte, size int64, hdrLen int, err error) {
	b, err := g.peek(2)
	if err != nil {
		return 0, 0, 0, err
	}
	flags = b[0]
	if flags&^flagsKnown != 0 {
		return 0, 0, 0, &GuardError{Reason: fmt.Sprintf("reserved frame flag bits set (0x%02x)", flags)}
	}
	if flags&FlagLong == 0 {
		return flags, int64(b[1]), 2, nil
	}
	b, err = g.peek(9)
	if err != nil {
		return 0, 0, 0, err
	}
	u := binary.BigEndian.Uint64(b[1:9])
	if u > uint64(g.lim.maxMessage()) {
		return 0, 0, 0, &GuardError{Reason: fmt.Sprintf("frame announces %d bytes, limit %d", u, g.lim.maxFrame)}
	}
	return flags, int64(u), 9, nil
}

// checkFrame applies the per-frame and per-message limits after the handshake.
func (g *guardConn) checkFrame(flags byte, size int64) error {
	if flags&FlagCommand != 0 {
		// Commands (PING, ...) stand alone: a reader would merge one into a
		// multipart message in progress.
		if flags&FlagMore != 0 || g.inMsg {
			return &GuardError{Reason: "command frame inside a multipart message"}
		}
		if size > MaxCommandSize {
			return &GuardError{Reason: fmt.Sprintf("command of %d bytes exceeds %d", size, MaxCommandSize)}
		}
		return nil
	}
	if size > g.lim.maxFrame {
		return &GuardError{Reason: fmt.Sprintf("frame announces %d bytes, limit %d", size, g.lim.maxFrame)}
	}
	g.msgFrames++
	g.msgBytes += size
	if g.msgFrames > MaxFramesPerMessage {
		return &GuardError{Reason: fmt.Sprintf("message has more than %d frames", MaxFramesPerMessage)}
	}
	if g.msgBytes > g.lim.maxMessage() {
		return &GuardError{Reason: fmt.Sprintf("message exceeds %d bytes", g.lim.maxMessage())}
	}
	if flags&FlagMore != 0 {
		g.inMsg = true
	} else {
		g.inMsg, g.msgFrames, g.msgBytes = false, 0, 0
	}
	return nil
}

// checkGreeting validates a 64-byte ZMTP 3.x greeting with the NULL mechanism,
// the only one this package speaks.
func checkGreeting(b []byte) error {
	if b[0] != 0xff || b[9] != 0x7f {
		return &GuardError{Reason: "not a ZMTP peer (bad greeting signature)"}
	}
	if b[10] < 3 {
		return &GuardError{Reason: fmt.Sprintf("unsupported ZMTP version %d.%d", b[10], b[11])}
	}
	mech := b[12:32]
	if string(mech[:4]) != "NULL" {
		return &GuardError{Reason: fmt.Sprintf("unsupported security mechanism %q", trimNUL(mech))}
	}
	for _, c := range mech[4:] {
		if c != 0 {
			return &GuardError{Reason: fmt.Sprintf("unsupported security mechanism %q", trimNUL(mech))}
		}
	}
	if b[32] > 1 {
		return &GuardError{Reason: "invalid as-server flag in greeting"}
	}
	return nil
}

func trimNUL(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// checkReady validates a READY command body: every property whole, and
// the peer's socket type, whose property name is matched regardless of
// case as ZMTP says (the last one counts).
func checkReady(body []byte, peerTypes []string) error {
	if len(body) == 0 {
		return &GuardError{Reason: "empty handshake command"}
	}
	n := int(body[0])
	if n > len(body)-1 {
		return &GuardError{Reason: "truncated handshake command name"}
	}
	name := string(body[1 : 1+n])
	if name == "ERROR" {
		reason := body[1+n:]
		if len(reason) > 0 && int(reason[0]) <= len(reason)-1 {
			reason = reason[1 : 1+int(reason[0])]
		}
		return &GuardError{Reason: fmt.Sprintf("peer refused the handshake: %q", reason)}
	}
	if name != "READY" {
		return &GuardError{Reason: fmt.Sprintf("expected READY, got command %q", name)}
	}
	props := body[1+n:]
	sockType, found := "", false
	for len(props) > 0 {
		kl := int(props[0])
		if kl == 0 {
			return &GuardError{Reason: "empty metadata property name"}
		}
		if len(props) < 1+kl+4 {
			return &GuardError{Reason: "truncated metadata property"}
		}
		key := props[1 : 1+kl]
		vl := binary.BigEndian.Uint32(props[1+kl:])
		rest := props[1+kl+4:]
		if uint64(vl) > uint64(len(rest)) {
			return &GuardError{Reason: "truncated metadata value"}
		}
		if strings.EqualFold(string(key), "Socket-Type") {
			sockType, found = string(rest[:vl]), true
		}
		props = rest[vl:]
	}
	if len(peerTypes) == 0 {
		return nil
	}
	if !found {
		return &GuardError{Reason: "peer did not announce its socket type"}
	}
	for _, t := range peerTypes {
		if sockType == t {
			return nil
		}
	}
	return &GuardError{Reason: fmt.Sprintf("incompatible peer socket type %q", sockType)}
}
