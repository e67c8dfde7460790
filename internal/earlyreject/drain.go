// Package earlyreject lets a client that sends its whole request body
// before reading the response (Python's urllib, many simple clients) read
// an early refusal — 413, 408, 400 given while the body is still
// arriving — instead of a connection reset.
//
// Without it, an HTTP/1.x server that answers and closes the connection
// with unread body bytes in its socket makes the kernel send RST, and the
// client, still writing, never sees the answer. Go's net/http discards at
// most 256 KiB of unread body after the handler returns; beyond that it
// closes. Refuse instead answers with Connection: close, flushes the
// answer, then reads and discards the rest of the body, bounded in bytes
// ([Limit]: 4 × max_body clamped to [MinDrain, MaxDrain]) and in time
// ([Deadline]), so the connection closes cleanly once the client is done.
//
// HTTP/2 and HTTP/3 need none of this: a stream is reset on its own
// (Go's server sends RST_STREAM(NO_ERROR) after the complete response,
// RFC 9113 §8.1), the connection and the answer survive it.
package earlyreject

import (
	"io"
	"math"
	"net/http"
	"strings"
	"time"
)

// The drain's bounds.
const (
	// Factor times max_body is how much of the rest of a refused body is
	// discarded, clamped to [MinDrain, MaxDrain].
	Factor = 4
	// MinDrain is the least the drain will read (1 MiB), so that a small
	// max_body does not refuse a modestly larger body with a reset.
	MinDrain int64 = 1 << 20
	// MaxDrain is the most the drain will read (64 MiB): past it the
	// client is sending far more than anyone would accept, and the
	// connection is closed with a reset.
	MaxDrain int64 = 64 << 20
	// Deadline bounds the drain's time (5s): a stalled or slow client
	// holds the handler no longer than this after its refusal.
	Deadline = 5 * time.Second
)

// Limit is how many bytes of a refused body are drained for a handler
// whose largest accepted body is maxBody: Factor × maxBody within
// [MinDrain, MaxDrain]. Any maxBody, negative or huge, gives a value in
// that range.
func Limit(maxBody int64) int64 {
	if maxBody > math.MaxInt64/Factor {
		return MaxDrain
	}
	return min(max(Factor*maxBody, MinDrain), MaxDrain)
}

// Result says what Refuse did after writing the answer.
type Result struct {
	// Skipped is why nothing was drained ("" when it was tried):
	// "multiplexed" (HTTP/2 or HTTP/3: the stream is reset on its own,
	// without harm to the answer), "no body", "expect-continue" (the
	// client waits for 100 Continue and has sent no body), or "no
	// deadline" (the connection's read deadline cannot be set, and an
	// unbounded drain is worse than a reset).
	Skipped string
	// Drained is how many body bytes were read and discarded.
	Drained int64
	// Complete says the drain reached the body's end: the connection
	// closes cleanly. False with Skipped empty means the byte or time
	// bound ended it, or the body was malformed.
	Complete bool
}

// Refuse answers r with write (which writes a complete error response,
// e.g. a JSON 413), then on HTTP/1.x drains the rest of r's body within
// [Limit](maxBody) bytes (and one more, when the limit is reached, to see
// whether the body ends there) and [Deadline]. It sets Connection: close before
// write: the connection is not reused after a refusal. It must be called
// before anything of the response was written, instead of plain write.
//
// Order matters: the answer is written and flushed first, so that clients
// reading while they send get it at once and may stop sending; the drain
// then lets those that only read once done finish their write; the server
// closes the connection afterwards with nothing unread, so without RST.
//
// A client sending Expect: 100-continue whose declared length is over
// maxBody is refused before the server read anything, so it got no 100
// Continue and sends no body: nothing is drained (reading would wait for
// bytes that never come). The caller must refuse such bodies unread.
func Refuse(w http.ResponseWriter, r *http.Request, maxBody int64, write func()) Result {
	return refuse(w, r, maxBody, Limit(maxBody), Deadline, write)
}

func refuse(w http.ResponseWriter, r *http.Request, maxBody, limit int64, d time.Duration, write func()) Result {
	skip := skipReason(r, maxBody)
	if skip != "multiplexed" {
		// Whatever the drain does, this connection ends with the answer.
		w.Header().Set("Connection", "close")
	}
	write()
	if skip != "" {
		return Result{Skipped: skip}
	}
	rc := http.NewResponseController(w)
	_ = rc.Flush() // the answer goes out before the drain's wait
	if rc.SetReadDeadline(time.Now().Add(d)) != nil {
		return Result{Skipped: "no deadline"}
	}
	// io.Discard's ReadFrom reads through one pooled 8 KiB buffer:
	// constant memory whatever the limit.
	n, err := io.Copy(io.Discard, io.LimitReader(r.Body, limit))
	complete := err == nil && n < limit
	if err == nil && n == limit {
		// The body may end right at the limit: a length-delimited body
		// says so without a byte read; otherwise at most one byte more.
		var one [1]byte
		m, err := r.Body.Read(one[:])
		complete = m == 0 && err == io.EOF
	}
	return Result{Drained: n, Complete: complete}
}

// skipReason is why r's body is not drained, "" when it is.
func skipReason(r *http.Request, maxBody int64) string {
	switch {
	case r.ProtoMajor != 1:
		return "multiplexed"
	case r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0:
		return "no body"
	case strings.EqualFold(r.Header.Get("Expect"), "100-continue") && r.ContentLength > maxBody:
		return "expect-continue"
	}
	return ""
}
