package caddymodule

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
)

// The request bodies of inference calls: llm_admission reads a body whole
// under its limits and reinstalls it as a followingBody; lb_policy llm,
// when no llm_admission ran, reads ahead with a bound on its wait
// (readahead.Body). Either way the body is parsed once, and the parsed request
// rides in the request vars. A request for a model alias has its body
// rewritten to the served name right after that parse (parseRequest), so
// everything after it — admission, routing, labels, tokenization and the
// engine — sees the served name.

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

// parseRequest parses body with the parser of its endpoint (ep, from the
// request's path), and when its model is an alias of the running config
// (see [fleet.Fleet.ResolveAlias]) rewrites the body's model to the served
// name and parses the result, whose Raw fields alias it. It returns the
// request and the body to send on: body itself unless rewritten. Errors
// are the parser's; an endpoint the gateway does not parse gives a nil
// request and no error.
func parseRequest(f *fleet.Fleet, ep openai.Endpoint, body []byte) (*openai.Request, []byte, error) {
	req, err := ep.Parse(body)
	if req == nil || err != nil {
		return nil, body, err
	}
	served, ok := f.ResolveAlias(req.Model)
	if !ok {
		return req, body, nil
	}
	out, ok := rewriteModel(body, served)
	if !ok {
		// The parser found a string model in a well-formed object, so
		// the rewrite cannot fail; should it, the engine must not get
		// the alias, which it does not serve.
		return nil, body, fmt.Errorf("rewriting model alias %q to %q failed", req.Model, served)
	}
	alias := req.Model
	if req, err = ep.Parse(out); err != nil {
		return nil, body, fmt.Errorf("request after rewriting model alias: %w", err)
	}
	req.Alias = alias
	return req, out, nil
}

// setBodyLength makes r's framing match a body of n bytes now in memory:
// a rewrite changes its length, and a chunked body is now of known length.
func setBodyLength(r *http.Request, n int) {
	r.ContentLength = int64(n)
	r.TransferEncoding = nil
	r.Header.Set("Content-Length", strconv.Itoa(n))
}
