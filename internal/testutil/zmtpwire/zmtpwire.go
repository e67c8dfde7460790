// Package zmtpwire writes ZMTP 3.0 wire pieces by hand, from the spec
// (rfc.zeromq.org/spec/23) rather than from internal/zmtp's encoders, so
// that tests of internal/zmtp and of the KV-event subscriber can play fake
// peers and hold the product's encoders to an independent reading of the
// spec. It is test support: no product package imports it.
package zmtpwire

import "encoding/binary"

// The spec's wire constants.
const (
	GreetingLen = 64   // bytes of a ZMTP 3.x greeting
	FlagMore    = 0x01 // more frames of this message follow
	FlagLong    = 0x02 // the size is 8 bytes, not 1
	FlagCommand = 0x04 // a command frame, not a message frame
)

// Greeting returns a greeting announcing mechanism and major version.
func Greeting(mechanism string, major byte) []byte {
	g := make([]byte, GreetingLen)
	g[0], g[9], g[10] = 0xff, 0x7f, major
	copy(g[12:32], mechanism)
	return g
}

// Frame returns one frame with flags; bodies over 255 bytes get a long size.
func Frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		b := make([]byte, 9, 9+len(body))
		b[0] = flags | FlagLong
		binary.BigEndian.PutUint64(b[1:], uint64(len(body)))
		return append(b, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// Command returns a command frame: the name's length, the name, the body.
func Command(name string, body []byte) []byte {
	b := append([]byte{byte(len(name))}, name...)
	return Frame(FlagCommand, append(b, body...))
}

// Prop returns one metadata property of a READY command.
func Prop(k, v string) []byte {
	b := append([]byte{byte(len(k))}, k...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// Ready returns a READY command announcing sockType.
func Ready(sockType string) []byte {
	return Command("READY", Prop("Socket-Type", sockType))
}

// Message returns a multipart data message of frames.
func Message(frames ...[]byte) []byte {
	var out []byte
	for i, f := range frames {
		var fl byte
		if i < len(frames)-1 {
			fl = FlagMore
		}
		out = append(out, Frame(fl, f)...)
	}
	return out
}

// Seq returns a sequence number as vLLM's publisher frames it: 8 bytes,
// big-endian.
func Seq(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }
