// Package readahead reads an HTTP request body in the background, so that
// a caller can stop waiting for a slow client without losing what was read.
package readahead

import (
	"io"
	"net/http"
	"slices"
	"sync"
)

// Body reads a request body in a goroutine of its own, up to limit
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
type Body struct {
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

// prealloc is the largest declared length allocated before the bytes
// arrive (a client must not make the gateway hold max_body for a body it
// never sends); past it the buffer grows by doubling as bytes come.
const prealloc = 64 << 10

// New starts reading src, up to limit bytes, in a goroutine of its own.
// contentLength is the declared length, -1 if unknown: no more than it
// (and no more than 64 KiB) is allocated before the bytes arrive.
func New(src io.ReadCloser, limit, contentLength int64) *Body {
	b := &Body{src: src, limit: limit, length: contentLength, done: make(chan struct{})}
	b.cond.L = &b.mu
	size := int64(512)
	if contentLength >= 0 {
		size = contentLength + 1 // +1: EOF then needs no growth
	}
	go b.run(make([]byte, 0, min(size, limit, prealloc)))
	return b
}

// run is the reading goroutine. It reads into buf's spare capacity, which
// is its alone (readers look at buf[:len] only, under the lock), and grows
// buf when full.
func (b *Body) run(buf []byte) {
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

// Done is closed when the goroutine has stopped reading: at the limit, at
// the end of the body, or at a read error.
func (b *Body) Done() <-chan struct{} { return b.done }

// Result is what was read and why reading stopped (io.EOF at the end of
// the body, a read error, or nil at the limit). Only after Done.
func (b *Body) Result() ([]byte, error) {
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf, b.err
}

// Buffered returns how many bytes were read ahead so far.
func (b *Body) Buffered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.buf)
}

// Read implements io.Reader.
func (b *Body) Read(p []byte) (int, error) {
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
func (b *Body) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
	return nil
}
