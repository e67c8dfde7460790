package zmtp

import (
	"bytes"
	"io"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/testutil/zmtpwire"
)

// Hand-written ZMTP 3.0 wire pieces for fake peers, from the spec rather
// than from the package's own encoders (internal/testutil/zmtpwire).

var (
	zmtpGreeting = zmtpwire.Greeting
	zmtpFrame    = zmtpwire.Frame
	zmtpCommand  = zmtpwire.Command
	zmtpProp     = zmtpwire.Prop
	zmtpReady    = zmtpwire.Ready
	zmtpMessage  = zmtpwire.Message
	seqBytes     = zmtpwire.Seq
)

// TestEncodersMatchSpec holds the package's encoders to the hand-written
// wire pieces of internal/testutil/zmtpwire.
func TestEncodersMatchSpec(t *testing.T) {
	long := bytes.Repeat([]byte{7}, 300)
	for _, tc := range []struct {
		name      string
		got, want []byte
	}{
		{"greeting", Greeting(), zmtpGreeting("NULL", 3)},
		{"ready", AppendReady(nil, Pub, nil), zmtpReady("PUB")},
		{"ready-identity", AppendReady(nil, Router, []byte{}), zmtpCommand("READY", append(zmtpProp("Socket-Type", "ROUTER"), zmtpProp("Identity", "")...))},
		{"message", AppendMessage(nil, []byte("kv@x"), seqBytes(3), long), zmtpMessage([]byte("kv@x"), seqBytes(3), long)},
		{"pong", AppendPong(nil, []byte("\x04PING\x00\x0actx")), zmtpCommand("PONG", []byte("ctx"))},
		{"not-a-ping", AppendPong(nil, []byte("\x05READY")), nil},
	} {
		if !bytes.Equal(tc.got, tc.want) {
			t.Errorf("%s: %x, want %x", tc.name, tc.got, tc.want)
		}
	}
}

// BenchmarkGuardRead measures the frame guard's own cost per 1.7 KB batch,
// read frame by frame, as a Conn reads it.
func BenchmarkGuardRead(b *testing.B) {
	payload := make([]byte, 1700)
	one := zmtpMessage([]byte("kv@bench"), seqBytes(1), payload)
	const perStream = 1000
	stream := append(validPrefix(), bytes.Repeat(one, perStream)...)
	var g *guardConn
	left := 0
	hdr := make([]byte, 9)
	body := make([]byte, len(payload))
	b.ReportAllocs()
	b.SetBytes(int64(len(one)))
	for b.Loop() {
		if left == 0 {
			g = newGuardConn(newStreamConn(stream, 1<<20), guardLimits{maxFrame: 64 << 20})
			if _, err := io.ReadFull(g, make([]byte, len(validPrefix()))); err != nil {
				b.Fatal(err)
			}
			left = perStream
		}
		for range 3 {
			if _, err := io.ReadFull(g, hdr[:2]); err != nil {
				b.Fatal(err)
			}
			n := int(hdr[1])
			if hdr[0]&FlagLong != 0 {
				if _, err := io.ReadFull(g, hdr[2:9]); err != nil {
					b.Fatal(err)
				}
				n = len(payload)
			}
			if _, err := io.ReadFull(g, body[:n]); err != nil {
				b.Fatal(err)
			}
		}
		left--
	}
}
