// Package httpbody reads the bodies of the engines' answers the gateway
// parses (/metrics, /tokenize) within a size limit, and quotes the start of
// an error body for a message.
package httpbody

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// ErrTooLarge marks a body longer than the limit it was read with.
var ErrTooLarge = errors.New("response too large")

// ReadLimited reads all of r into buf (reused) but fails once more than
// limit bytes arrive, so a huge or endless body costs at most limit+1
// bytes.
func ReadLimited(r io.Reader, limit int64, buf []byte) ([]byte, error) {
	b := bytes.NewBuffer(buf[:0])
	n, err := b.ReadFrom(io.LimitReader(r, limit+1))
	if err != nil {
		return b.Bytes(), fmt.Errorf("read body: %w", err)
	}
	if n > limit {
		return b.Bytes(), fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)
	}
	return b.Bytes(), nil
}

// Snippet returns a short quoted prefix of an error body for messages.
func Snippet(r io.Reader) string {
	var p [160]byte
	n, _ := io.ReadFull(r, p[:])
	return strconv.Quote(string(bytes.TrimSpace(p[:n])))
}
