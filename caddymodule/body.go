package caddymodule

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"
)

// The request bodies of inference calls: llm_admission reads a body whole
// under its limits and reinstalls it as a followingBody; lb_policy llm,
// when no llm_admission ran, reads ahead with a bound on its wait
// (aheadBody). Either way the body is parsed once, and the parsed request
// rides in the request vars.

// readBody reads the whole body under max_body and body_timeout.
func (h *Admission) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	if r.ContentLength > h.MaxBody {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body of %d bytes exceeds max_body %d", r.ContentLength, h.MaxBody)
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(time.Duration(h.BodyTimeout))) == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	var body []byte
	var err error
	switch {
	case r.ContentLength >= 0 && r.ContentLength <= 64<<10:
		// Known length (the server enforces it): one exact allocation
		// instead of ReadAll's doublings.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, body)
	case r.ContentLength > 0:
		// Larger: allocate as the bytes arrive, or a header declaring
		// max_body would cost max_body for body_timeout without a byte sent.
		buf := bytes.NewBuffer(make([]byte, 0, 64<<10))
		_, err = buf.ReadFrom(io.LimitReader(r.Body, r.ContentLength))
		body = buf.Bytes()
		if err == nil && int64(len(body)) < r.ContentLength {
			err = io.ErrUnexpectedEOF
		}
	default:
		body, err = io.ReadAll(io.LimitReader(r.Body, h.MaxBody+1))
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Not err's text: it names the listener's address.
			return nil, http.StatusRequestTimeout, fmt.Errorf("request body not received within body_timeout %v", time.Duration(h.BodyTimeout))
		}
		return nil, http.StatusBadRequest, fmt.Errorf("reading request body: %w", err)
	}
	if int64(len(body)) > h.MaxBody {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds max_body %d bytes", h.MaxBody)
	}
	return body, 0, nil
}

// followingBody is the request body reinstalled after reading it; the
// proxy reading it tells where and when the request goes. Its first Read
// happens when reverse_proxy sends the request to the upstream it picked,
// whose address is then known: onSend moves the admission reservation there
// when no llm policy did (any other selection policy). Once it is all read
// the request is at the engine: onSent re-stamps the reservation, so a
// scrape that started before cannot drop it from the dispatched count.
type followingBody struct {
	*bytes.Reader
	onSend, onSent func()
}

// Read implements io.Reader.
func (b *followingBody) Read(p []byte) (int, error) {
	if f := b.onSend; f != nil {
		b.onSend = nil
		f()
	}
	n, err := b.Reader.Read(p)
	if b.Reader.Len() == 0 && b.onSent != nil {
		f := b.onSent
		b.onSent = nil
		f()
	}
	return n, err
}

// Close implements io.Closer; the body is in memory.
func (b *followingBody) Close() error { return nil }

// aheadBody reads a request body in a goroutine of its own, up to limit
// bytes, so that Select can stop waiting for a slow client without losing
// what was read. As an io.ReadCloser it yields the whole body: the bytes
// read ahead, then (past the limit) the rest straight from the source.
//
// The goroutine stops at the limit, at the end of the body, or when a read
// fails — which a stalled client's read does when its connection closes
// (client gone, Caddy's read_body timeout, server shutdown). Nothing else
// can interrupt a read of a server request body, and closing the body
// meanwhile would block on the read, so Close only makes later Reads fail
// and the server closes the source once the request is over.
type aheadBody struct {
	src    io.ReadCloser
	limit  int64
	length int64         // declared length, -1 if unknown
	done   chan struct{} // closed when the goroutine stops reading src

	mu       sync.Mutex
	cond     sync.Cond // signalled when buf grows, reading stops or Close is called
	buf      []byte    // read ahead; appended to by the goroutine only
	err      error     // why reading stopped: io.EOF, a read error, or nil at the limit
	finished bool      // the goroutine stopped reading
	pos      int       // bytes of buf already returned by Read
	closed   bool
}

// readAheadPrealloc is the largest declared length allocated before the bytes
// arrive (a client must not make the gateway hold max_body for a body it
// never sends); past it the buffer grows by doubling as bytes come.
const readAheadPrealloc = 64 << 10

func readAhead(src io.ReadCloser, limit, contentLength int64) *aheadBody {
	b := &aheadBody{src: src, limit: limit, length: contentLength, done: make(chan struct{})}
	b.cond.L = &b.mu
	size := int64(512)
	if contentLength >= 0 {
		size = contentLength + 1 // +1: EOF then needs no growth
	}
	go b.run(make([]byte, 0, min(size, limit, readAheadPrealloc)))
	return b
}

// run is the reading goroutine. It reads into buf's spare capacity, which
// is its alone (readers look at buf[:len] only, under the lock), and grows
// buf when full.
func (b *aheadBody) run(buf []byte) {
	defer close(b.done)
	for {
		if len(buf) == cap(buf) {
			// Double, but no further than the declared length (+1 for
			// EOF) and the limit. Readers may be copying from the old
			// array meanwhile: both only read it.
			n := int64(max(len(buf), 512))
			if b.length >= int64(len(buf)) {
				n = min(n, b.length+1-int64(len(buf)))
			}
			n = min(n, b.limit-int64(len(buf)))
			buf = slices.Grow(buf, int(n))
		}
		dst := buf[len(buf):min(int64(cap(buf)), b.limit)]
		n, err := b.src.Read(dst)
		b.mu.Lock()
		buf = buf[:len(buf)+n]
		b.buf = buf
		if err != nil {
			b.err = err
		}
		b.finished = err != nil || int64(len(buf)) >= b.limit
		finished := b.finished
		b.mu.Unlock()
		b.cond.Broadcast()
		if finished {
			return
		}
	}
}

// buffered returns how many bytes were read ahead so far.
func (b *aheadBody) buffered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.buf)
}

// Read implements io.Reader.
func (b *aheadBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b.mu.Lock()
	for b.pos == len(b.buf) && !b.finished && !b.closed {
		b.cond.Wait()
	}
	if b.closed {
		b.mu.Unlock()
		return 0, http.ErrBodyReadAfterClose
	}
	if b.pos < len(b.buf) {
		n := copy(p, b.buf[b.pos:])
		b.pos += n
		b.mu.Unlock()
		return n, nil
	}
	err := b.err
	b.mu.Unlock()
	if err == nil {
		// Stopped at the limit: the rest comes from the client directly.
		return b.src.Read(p)
	}
	return 0, err
}

// Close implements io.Closer: later Reads fail, and a Read waiting for the
// goroutine returns. The source is the server's to close.
func (b *aheadBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
	return nil
}
