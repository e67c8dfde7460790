package zmtp

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

// Hand-written ZMTP 3.0 wire pieces for fake peers, from the spec rather
// than from the package's own encoders.

func zmtpGreeting(mechanism string, major byte) []byte {
	g := make([]byte, GreetingLen)
	g[0], g[9], g[10] = 0xff, 0x7f, major
	copy(g[12:32], mechanism)
	return g
}

func zmtpFrame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		b := make([]byte, 9, 9+len(body))
		b[0] = flags | FlagLong
		binary.BigEndian.PutUint64(b[1:], uint64(len(body)))
		return append(b, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func zmtpCommand(name string, body []byte) []byte {
	b := append([]byte{byte(len(name))}, name...)
	return zmtpFrame(FlagCommand, append(b, body...))
}

func zmtpProp(k, v string) []byte {
	b := append([]byte{byte(len(k))}, k...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

func zmtpReady(sockType string) []byte {
	return zmtpCommand("READY", zmtpProp("Socket-Type", sockType))
}

// zmtpMessage encodes a multipart data message.
func zmtpMessage(frames ...[]byte) []byte {
	var out []byte
	for i, f := range frames {
		var fl byte
		if i < len(frames)-1 {
			fl = FlagMore
		}
		out = append(out, zmtpFrame(fl, f)...)
	}
	return out
}

func seqBytes(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// TestEncodersMatchSpec holds the package's encoders to the hand-written
// wire pieces above.
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
