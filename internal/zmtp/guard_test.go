package zmtp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// streamConn is a net.Conn that serves a fixed byte stream in chunks and
// swallows writes: the inbound side of a peer, for driving a guardConn.
type streamConn struct {
	r      *bytes.Reader
	chunk  int
	closed bool
}

func newStreamConn(data []byte, chunk int) *streamConn {
	return &streamConn{r: bytes.NewReader(data), chunk: max(chunk, 1)}
}

func (c *streamConn) Read(p []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	if len(p) > c.chunk {
		p = p[:c.chunk]
	}
	return c.r.Read(p)
}
func (c *streamConn) Write(p []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	return len(p), nil
}
func (c *streamConn) Close() error                     { c.closed = true; return nil }
func (c *streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

func validPrefix() []byte {
	return append(zmtpGreeting("NULL", 3), zmtpReady("PUB")...)
}

// readFrames reads g as a Conn does (greeting, READY, then frame
// headers and bodies with io.ReadFull) and checks every frame the guard
// released against the limits. It returns the bytes read and the first
// error.
func readFrames(t testing.TB, g *guardConn, limit int64) ([]byte, error) {
	var got bytes.Buffer
	read := func(n int64) ([]byte, error) {
		b := make([]byte, n)
		k, err := io.ReadFull(g, b)
		got.Write(b[:k])
		return b, err
	}
	if _, err := read(GreetingLen); err != nil {
		return got.Bytes(), err
	}
	first := true
	frames, msgBytes := 0, int64(0)
	for {
		hdr, err := read(2)
		if err != nil {
			return got.Bytes(), err
		}
		size := int64(hdr[1])
		if hdr[0]&FlagLong != 0 {
			rest, err := read(7)
			if err != nil {
				return got.Bytes(), err
			}
			u := binary.BigEndian.Uint64(append([]byte{hdr[1]}, rest...))
			if u > uint64(limit+MessageOverhead) {
				t.Fatalf("guard released a header announcing %d bytes (limit %d)", u, limit)
			}
			size = int64(u)
		}
		if hdr[0]&^flagsKnown != 0 {
			t.Fatalf("guard released reserved flags 0x%02x", hdr[0])
		}
		isCmd := hdr[0]&FlagCommand != 0
		switch {
		case isCmd && size > MaxCommandSize:
			t.Fatalf("guard released a %d-byte command", size)
		case !isCmd && size > limit:
			t.Fatalf("guard released a %d-byte frame (limit %d)", size, limit)
		}
		if !isCmd {
			frames++
			msgBytes += size
			if frames > MaxFramesPerMessage || msgBytes > limit+MessageOverhead {
				t.Fatalf("guard released a message of %d frames / %d bytes", frames, msgBytes)
			}
			if hdr[0]&FlagMore == 0 {
				frames, msgBytes = 0, 0
			}
		}
		body, err := read(size)
		if err != nil {
			return got.Bytes(), err
		}
		if first {
			// The READY released is whole and names an accepted peer.
			if !isCmd {
				t.Fatal("guard released a data frame as the handshake")
			}
			n := int(body[0])
			if n > len(body)-1 || string(body[1:1+n]) != "READY" {
				t.Fatalf("guard released a non-READY handshake %q", body)
			}
			if st, ok := socketType(body[1+n:]); !ok || (st != "PUB" && st != "XPUB") {
				t.Fatalf("guard released READY metadata %q (peer type %q)", body[1+n:], st)
			}
			first = false
		}
	}
}

func TestGuardStreams(t *testing.T) {
	msg := zmtpMessage([]byte("kv@x"), seqBytes(3), bytes.Repeat([]byte{7}, 1000))
	for _, tc := range []struct {
		name   string
		stream []byte
		want   string // substring of the GuardError; "" = clean EOF
	}{
		{"valid", append(validPrefix(), bytes.Repeat(msg, 5)...), ""},
		{"valid-ping", append(validPrefix(), zmtpCommand("PING", []byte{0, 1})...), ""},
		{"xpub", append(append(zmtpGreeting("NULL", 3), zmtpReady("XPUB")...), msg...), ""},
		{"zmtp3.1-as-server", func() []byte {
			g := zmtpGreeting("NULL", 3)
			g[11], g[32] = 1, 1
			return append(g, zmtpReady("PUB")...)
		}(), ""},
		{"bad-signature", append([]byte{0xfe}, validPrefix()[1:]...), "signature"},
		{"zmtp2", append(zmtpGreeting("NULL", 2), zmtpReady("PUB")...), "version"},
		{"curve", append(zmtpGreeting("CURVE", 3), zmtpReady("PUB")...), "mechanism"},
		{"null-suffix", append(zmtpGreeting("NULLX", 3), zmtpReady("PUB")...), "mechanism"},
		{"data-before-ready", append(zmtpGreeting("NULL", 3), msg...), "READY"},
		{"ready-with-more", append(zmtpGreeting("NULL", 3), zmtpFrame(FlagCommand|FlagMore, []byte("\x05READY"))...), "READY"},
		{"hello", append(zmtpGreeting("NULL", 3), zmtpCommand("HELLO", nil)...), "HELLO"},
		{"error", append(zmtpGreeting("NULL", 3), zmtpCommand("ERROR", []byte("\x03bad"))...), `"bad"`},
		{"no-socket-type", append(zmtpGreeting("NULL", 3), zmtpCommand("READY", zmtpProp("Identity", ""))...), "socket type"},
		{"lowercase-socket-type", append(zmtpGreeting("NULL", 3), zmtpCommand("READY", zmtpProp("socket-type", "PUB"))...), ""},
		// ZMTP's property names are case-insensitive.
		{"uppercase-socket-type", append(zmtpGreeting("NULL", 3), zmtpCommand("READY", zmtpProp("SOCKET-TYPE", "PUB"))...), ""},
		{"rep", append(zmtpGreeting("NULL", 3), zmtpReady("REP")...), "REP"},
		{"empty-key", append(zmtpGreeting("NULL", 3), zmtpCommand("READY", zmtpProp("", "x"))...), "empty metadata"},
		{"value-overrun", append(zmtpGreeting("NULL", 3), zmtpCommand("READY", zmtpProp("Socket-Type", "PUB")[:15])...), "truncated"},
		{"name-overrun", append(zmtpGreeting("NULL", 3), zmtpFrame(FlagCommand, []byte{9, 'R'})...), "truncated"},
		{"huge-frame", append(validPrefix(), FlagLong, 0x10, 0, 0, 0, 0, 0, 0, 0), "announces"},
		{"frame-over-limit", append(validPrefix(), zmtpFrame(0, make([]byte, 4097))...), "limit 4096"},
		{"huge-command", append(validPrefix(), zmtpCommand("PING", make([]byte, MaxCommandSize))...), "command"},
		{"command-mid-message", append(append(validPrefix(), zmtpFrame(FlagMore, []byte("a"))...), zmtpCommand("PING", nil)...), "inside a multipart"},
		{"reserved-flags", append(validPrefix(), 0x08, 0), "reserved"},
		{"truncated-header", append(validPrefix(), FlagLong, 0, 0), "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, chunk := range []int{1, 3, 64 << 10} {
				g := newGuardConn(newStreamConn(tc.stream, chunk), guardLimits{maxFrame: 4096, peerTypes: []string{"PUB", "XPUB"}})
				got, err := readFrames(t, g, 4096)
				if !bytes.Equal(got[:min(len(got), len(tc.stream))], tc.stream[:min(len(got), len(tc.stream))]) {
					t.Fatal("guard altered the stream")
				}
				if tc.want == "" {
					if !errors.Is(err, io.EOF) || len(got) < len(tc.stream) {
						t.Fatalf("chunk %d: err %v after %d of %d bytes, want clean EOF at the end", chunk, err, len(got), len(tc.stream))
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("chunk %d: err %v, want it to mention %q", chunk, err, tc.want)
				}
				if !g.Conn.(*streamConn).closed {
					t.Fatal("refused connection left open")
				}
			}
		})
	}
}

// FuzzFrameGuard feeds arbitrary byte streams through the guard, read
// frame by frame and then by a Conn, handshake and messages: neither may
// panic, and the guard must never alter bytes or release a frame over the
// limit or a READY that is not whole.
func FuzzFrameGuard(f *testing.F) {
	msg := zmtpMessage([]byte("kv@x"), seqBytes(3), []byte("payload"))
	f.Add(append(validPrefix(), msg...), uint8(7), uint16(1024))
	f.Add(append(validPrefix(), zmtpCommand("PING", []byte{0, 1})...), uint8(1), uint16(64))
	f.Add(append(validPrefix(), FlagLong, 0x10, 0, 0, 0, 0, 0, 0, 0), uint8(255), uint16(1024))
	f.Add(append(zmtpGreeting("NULL", 3), zmtpCommand("READY", []byte{11, 'S'})...), uint8(3), uint16(100))
	f.Add(append(zmtpGreeting("NULL", 3), zmtpCommand("READY", append(zmtpProp("Socket-Type", "PUB"), 5, 'H', 'e', 'l', 'l', 'o', 0, 0))...), uint8(3), uint16(100))
	f.Add(append(validPrefix(), zmtpFrame(FlagMore, make([]byte, 300))...), uint8(50), uint16(200))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), uint8(4), uint16(100))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8, limit uint16) {
		lim := guardLimits{maxFrame: int64(limit), peerTypes: []string{"PUB", "XPUB"}}
		g := newGuardConn(newStreamConn(data, int(chunk)), lim)
		got, _ := readFrames(t, g, int64(limit))
		if !bytes.HasPrefix(data, got[:min(len(got), len(data))]) {
			t.Fatal("guard altered the stream")
		}

		c := &Conn{g: newGuardConn(newStreamConn(data, int(chunk)), lim)}
		if c.handshake(Sub, nil) != nil {
			return
		}
		var m Message
		for range len(data) + 1 {
			if c.Read(&m) != nil {
				break
			}
			if m.Command {
				_ = c.Pong(m.frames[0])
			}
		}
	})
}

// socketType walks READY metadata (name length, name, 4-byte value length,
// value) and returns its Socket-Type, the last one, with false when the
// metadata is not whole.
func socketType(props []byte) (string, bool) {
	st := ""
	for len(props) > 0 {
		kl := int(props[0])
		if kl == 0 || len(props) < 1+kl+4 {
			return st, false
		}
		vl := binary.BigEndian.Uint32(props[1+kl:])
		rest := props[1+kl+4:]
		if uint64(vl) > uint64(len(rest)) {
			return st, false
		}
		if strings.EqualFold(string(props[1:1+kl]), "Socket-Type") {
			st = string(rest[:vl])
		}
		props = rest[vl:]
	}
	return st, true
}
