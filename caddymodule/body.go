package caddymodule

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// The request bodies of inference calls: llm_admission reads a body whole
// under its limits and reinstalls it as a followingBody; lb_policy llm,
// when no llm_admission ran, reads ahead with a bound on its wait
// (readahead.Body). Either way the body is parsed once, and the parsed request
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
