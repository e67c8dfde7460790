package kvindex

import (
	"bytes"
	"fmt"
	"io"
	"math"
)

// This file holds the msgpack primitives the Decoder reads events with:
// type codes and bounded readers of lengths, strings, ints, floats and
// nested values. Each checks an announced length against the bytes left
// before it allocates; decode.go reads vLLM's event shapes with them.

// msgpack type codes, as constants so switches compile to jump tables.
const (
	cNil      = 0xc0
	cFalse    = 0xc2
	cTrue     = 0xc3
	cBin8     = 0xc4
	cBin16    = 0xc5
	cBin32    = 0xc6
	cExt8     = 0xc7
	cExt16    = 0xc8
	cExt32    = 0xc9
	cFloat    = 0xca
	cDouble   = 0xcb
	cUint8    = 0xcc
	cUint16   = 0xcd
	cUint32   = 0xce
	cUint64   = 0xcf
	cInt8     = 0xd0
	cInt16    = 0xd1
	cInt32    = 0xd2
	cInt64    = 0xd3
	cFixExt1  = 0xd4
	cFixExt2  = 0xd5
	cFixExt4  = 0xd6
	cFixExt8  = 0xd7
	cFixExt16 = 0xd8
	cStr8     = 0xd9
	cStr16    = 0xda
	cStr32    = 0xdb
	cArray16  = 0xdc
	cArray32  = 0xdd
	cMap16    = 0xde
	cMap32    = 0xdf
)

func isArray(c byte) bool { return c&0xf0 == 0x90 || c == cArray16 || c == cArray32 }

func isMap(c byte) bool { return c&0xf0 == 0x80 || c == cMap16 || c == cMap32 }

func isStr(c byte) bool { return c&0xe0 == 0xa0 || c == cStr8 || c == cStr16 || c == cStr32 }

func isBin(c byte) bool { return c == cBin8 || c == cBin16 || c == cBin32 }

func isPosInt(c byte) bool { return c <= 0x7f || (c >= cUint8 && c <= cUint64) }

func isNegInt(c byte) bool { return c >= 0xe0 || (c >= cInt8 && c <= cInt64) }

func isInt(c byte) bool { return isPosInt(c) || isNegInt(c) }

// peek returns the next type code without consuming it. It reads the
// payload directly rather than through msgpack's PeekCode, which costs two
// interface calls per value.
func (d *Decoder) peek() (byte, error) {
	off := len(d.payload) - d.br.Len()
	if off >= len(d.payload) {
		return 0, io.ErrUnexpectedEOF
	}
	return d.payload[off], nil
}

// arrayLen reads an array header and checks the announced length against
// the bytes left: every element takes at least one byte, so nothing is
// allocated for elements that cannot be there.
func (d *Decoder) arrayLen() (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if !isArray(c) {
		return 0, fmt.Errorf("expected array, got code %#x", c)
	}
	n, err := d.md.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n < 0 || n > d.br.Len() {
		return 0, fmt.Errorf("array of %d elements exceeds the %d bytes left", n, d.br.Len())
	}
	return n, nil
}

func (d *Decoder) mapLen() (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if !isMap(c) {
		return 0, fmt.Errorf("expected map, got code %#x", c)
	}
	n, err := d.md.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n < 0 || n > d.br.Len()/2 {
		return 0, fmt.Errorf("map of %d entries exceeds the %d bytes left", n, d.br.Len())
	}
	return n, nil
}

// rawBytes reads a str or bin value into the scratch buffer, checking its
// announced length first. The result is only valid until the next read.
func (d *Decoder) rawBytes() ([]byte, error) {
	n, err := d.md.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > d.br.Len() {
		return nil, fmt.Errorf("string of %d bytes exceeds the %d bytes left", n, d.br.Len())
	}
	if cap(d.buf) < n {
		d.buf = make([]byte, n)
	}
	d.buf = d.buf[:n]
	d.used.buf = max(d.used.buf, n)
	if err := d.md.ReadFull(d.buf); err != nil {
		return nil, err
	}
	return d.buf, nil
}

// key reads a string (a map key or tag) into the scratch buffer; ok is false,
// with the value skipped, if it is not a string. Callers compare it with
// switch string(key), which does not allocate, and must not keep it.
func (d *Decoder) key() ([]byte, bool, error) {
	c, err := d.peek()
	if err != nil {
		return nil, false, err
	}
	if !isStr(c) {
		return nil, false, d.skip(0)
	}
	b, err := d.rawBytes()
	if err != nil {
		return nil, false, err
	}
	return b, true, nil
}

func (d *Decoder) optString() (string, error) {
	c, err := d.peek()
	if err != nil {
		return "", err
	}
	if c == cNil {
		_, err := d.br.ReadByte()
		return "", err
	}
	if !isStr(c) {
		return "", fmt.Errorf("expected string, got code %#x", c)
	}
	b, err := d.rawBytes()
	if err != nil {
		return "", err
	}
	return intern(b), nil
}

// intern returns the values vLLM sends in every event (medium, spec kind)
// without allocating.
func intern(b []byte) string {
	switch string(b) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "cpu":
		return "cpu"
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	case "mamba":
		return "mamba"
	}
	return string(b)
}

// optInt reads an integer or nil (ok false).
func (d *Decoder) optInt() (v int64, ok bool, err error) {
	c, err := d.peek()
	if err != nil {
		return 0, false, err
	}
	if c == cNil {
		_, err := d.br.ReadByte()
		return 0, false, err
	}
	if !isInt(c) {
		return 0, false, fmt.Errorf("expected integer, got code %#x", c)
	}
	if c == cUint64 {
		u, err := d.md.DecodeUint64()
		if err != nil {
			return 0, false, err
		}
		if u > math.MaxInt64 {
			return 0, false, fmt.Errorf("integer %d out of range", u)
		}
		return int64(u), true, nil
	}
	v, err = d.md.DecodeInt64()
	return v, err == nil, err
}

func (d *Decoder) float() (float64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c == cDouble || c == cFloat:
		return d.md.DecodeFloat64()
	case isPosInt(c) && c != cUint64, isNegInt(c):
		v, err := d.md.DecodeInt64()
		return float64(v), err
	case c == cUint64:
		v, err := d.md.DecodeUint64()
		return float64(v), err
	}
	return 0, fmt.Errorf("expected number, got code %#x", c)
}

// value decodes one extra-key value. Maps and extension types never occur
// in vLLM's hash inputs and are refused.
func (d *Decoder) value(depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nesting deeper than %d", maxDepth)
	}
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == cNil:
		_, err := d.br.ReadByte()
		return nil, err
	case c == cFalse || c == cTrue:
		return d.md.DecodeBool()
	case isNegInt(c):
		return d.md.DecodeInt64()
	case isPosInt(c):
		u, err := d.md.DecodeUint64()
		if err != nil {
			return nil, err
		}
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case c == cFloat || c == cDouble:
		return d.md.DecodeFloat64()
	case isStr(c):
		b, err := d.rawBytes()
		return string(b), err
	case isBin(c):
		b, err := d.rawBytes()
		return bytes.Clone(b), err
	case isArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = d.value(depth + 1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported extra-key value code %#x", c)
}

// skipN skips n values.
func (d *Decoder) skipN(n, depth int) error {
	for i := 0; i < n; i++ {
		if err := d.skip(depth); err != nil {
			return err
		}
	}
	return nil
}

// skip skips one value of any type with bounded depth and without reading
// strings or binaries into memory.
func (d *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nesting deeper than %d", maxDepth)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		return d.skipN(n, depth+1)
	case isMap(c):
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		return d.skipN(2*n, depth+1)
	case isStr(c) || isBin(c):
		n, err := d.md.DecodeBytesLen()
		if err != nil {
			return err
		}
		return d.discard(n)
	case c >= cFixExt1 && c <= cFixExt16:
		_, _ = d.br.ReadByte()
		return d.discard(1 + 1<<(c-cFixExt1))
	case c == cExt8 || c == cExt16 || c == cExt32:
		_, _ = d.br.ReadByte()
		var hdr [4]byte
		w := 1 << (c - cExt8)
		if _, err := io.ReadFull(&d.br, hdr[:w]); err != nil {
			return err
		}
		var n int
		for _, x := range hdr[:w] {
			n = n<<8 | int(x)
		}
		return d.discard(n + 1)
	}
	// Scalars: nil, bools, ints, floats; Skip knows their widths.
	return d.md.Skip()
}

func (d *Decoder) discard(n int) error {
	if n < 0 || n > d.br.Len() {
		return fmt.Errorf("value of %d bytes exceeds the %d bytes left", n, d.br.Len())
	}
	_, err := d.br.Seek(int64(n), io.SeekCurrent)
	return err
}
