package remotetok

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// A /tokenize request body is as long as the prompt (about 700 KB for a
// 128k-token chat), and allocating one per call cost page faults and
// clearing of fresh memory on every call. It is written into a pooled
// buffer instead. The buffer may only go back to the pool once nothing can
// read it any more, and http.Transport may read a request body after
// Client.Do returned (RoundTrip "may close the body in a separate
// goroutine even after RoundTrip returns"), and may take more readers of
// it through GetBody for a retry. So the buffer counts its users: the
// caller that made it, and every reader handed out, until it is closed.

// Through net/http only long bodies are pooled. A body the transport does
// not know to be in memory (a *bytes.Reader, say) has the request's
// headers flushed on their own before it, one more write and TCP segment
// per call, which costs more than allocating a short body; a long body
// takes several writes anyway, and its allocation is what costs. The
// synchronous client (remotetok/internal/h1client) writes from the slice itself, so
// every body it sends is pooled, and goes back when its call returns.
const minPooledRequest = 64 << 10

// requestBufs are the pooled body buffers.
var requestBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledRequest bounds the buffers kept in requestBufs (4 MiB: a
// prompt of some 900k tokens).
const maxPooledRequest = 4 << 20

// errBodyClosed is what a closed reader of a sharedBody returns.
var errBodyClosed = errors.New("tokenize: request body read after close")

// sharedBody is one request body and the count of its users.
type sharedBody struct {
	buf  *[]byte // from requestBufs; nil for a body not pooled
	b    []byte
	refs atomic.Int32
}

// newSharedBody returns a body written by fill into a pooled buffer
// (fill appends to the slice it is given), its maker counted as a user:
// the maker calls release when done.
func newSharedBody(fill func([]byte) []byte) *sharedBody {
	p := requestBufs.Get().(*[]byte)
	s := &sharedBody{buf: p, b: fill((*p)[:0])}
	s.refs.Store(1)
	return s
}

// plainBody is a body in a slice of its own, not pooled.
func plainBody(b []byte) *sharedBody {
	s := &sharedBody{b: b}
	s.refs.Store(1)
	return s
}

// request is a POST of the body to url. A pooled body gets readers of
// its own, with its length and GetBody for a retry or a redirect; a
// plain one is a *bytes.Reader, for which net/http sets both.
func (s *sharedBody) request(ctx context.Context, url string) (*http.Request, error) {
	if s.buf == nil {
		return http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(s.b))
	}
	rd, err := s.reader()
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, rd)
	if err != nil {
		rd.Close()
		return nil, err
	}
	req.ContentLength = int64(len(s.b))
	req.GetBody = s.reader
	return req, nil
}

// reader returns a reader of the body, counted as a user until its
// Close; it fails once every user is gone (nothing may read the buffer
// then).
func (s *sharedBody) reader() (io.ReadCloser, error) {
	for {
		n := s.refs.Load()
		if n <= 0 {
			return nil, errBodyClosed
		}
		if s.refs.CompareAndSwap(n, n+1) {
			return &bodyReader{s: s, r: bytes.NewReader(s.b)}, nil
		}
	}
}

// release ends one user's use; the last one puts the buffer back.
func (s *sharedBody) release() {
	if s.refs.Add(-1) != 0 || s.buf == nil {
		return
	}
	if cap(s.b) <= maxPooledRequest {
		*s.buf = s.b[:0]
		requestBufs.Put(s.buf)
	}
	s.buf, s.b = nil, nil
}

// bodyReader is one reader of a sharedBody. Close may come from another
// goroutine than Read's (the transport closes a body it is still writing
// when the call is cancelled): mu makes Close wait for a Read under way,
// so the buffer is never handed back while it is being read.
type bodyReader struct {
	mu     sync.Mutex
	s      *sharedBody
	r      *bytes.Reader
	closed bool
}

func (b *bodyReader) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errBodyClosed
	}
	return b.r.Read(p)
}

func (b *bodyReader) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		b.r = nil
		b.s.release()
	}
	return nil
}
