package h1client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http/httputil"
)

// head is what a response's status line and header section say.
type head struct {
	status        int
	contentLength int64 // -1 when not given
	chunked       bool
	close         bool // the connection ends with this response
}

// readResponse reads a response's head (skipping 1xx informational ones)
// within maxHeader bytes, and frames its body.
func readResponse(br *bufio.Reader, maxHeader int) (*Response, *respBody, error) {
	budget := maxHeader
	for {
		h, err := readHead(br, &budget)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case h.status == 101:
			return nil, nil, errors.New("unexpected 101 Switching Protocols")
		case h.status < 200:
			continue // informational: the final response follows
		}
		b := &respBody{br: br, close: h.close, n: h.contentLength}
		switch {
		case h.status == 204 || h.status == 304:
			b.n = 0
		case h.chunked:
			b.chunked, b.n = true, -1
			b.cr = httputil.NewChunkedReader(br)
			b.maxTrailer = maxHeader
		case h.contentLength < 0:
			b.close = true // the body runs to the connection's end
		}
		return &Response{StatusCode: h.status, ContentLength: b.n, Body: b}, b, nil
	}
}

// readHead reads one status line and header section.
func readHead(br *bufio.Reader, budget *int) (head, error) {
	h := head{contentLength: -1}
	line, err := readLine(br, budget)
	if err != nil {
		return h, err
	}
	if err := h.statusLine(line); err != nil {
		return h, err
	}
	for {
		line, err := readLine(br, budget)
		if err != nil {
			return h, err
		}
		if len(line) == 0 {
			return h, nil
		}
		if err := h.field(line); err != nil {
			return h, err
		}
	}
}

// statusLine parses "HTTP/1.x NNN reason".
func (h *head) statusLine(line []byte) error {
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' ||
		(len(line) > 12 && line[12] != ' ') {
		return fmt.Errorf("malformed status line %q", truncate(line))
	}
	switch line[7] {
	case '0':
		h.close = true // HTTP/1.0: no keep-alive unless negotiated, which this client does not
	case '1':
	default:
		return fmt.Errorf("unsupported protocol in status line %q", truncate(line))
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return fmt.Errorf("malformed status code in %q", truncate(line))
		}
		h.status = h.status*10 + int(c-'0')
	}
	if h.status < 100 {
		return fmt.Errorf("malformed status code in %q", truncate(line))
	}
	return nil
}

// field applies one header field line; only the fields that frame the
// message matter here.
func (h *head) field(line []byte) error {
	name, value, ok := bytes.Cut(line, []byte(":"))
	if !ok || len(name) == 0 || line[0] == ' ' || line[0] == '\t' || bytes.ContainsAny(name, " \t") {
		// A leading space is an obsolete line folding; a space before
		// the colon, a smuggling attempt: both are refused, as net/http
		// refuses them.
		return fmt.Errorf("malformed header line %q", truncate(line))
	}
	value = bytes.Trim(value, " \t")
	switch {
	case bytes.EqualFold(name, []byte("Content-Length")):
		n, err := parseLength(value)
		if err != nil || (h.contentLength >= 0 && n != h.contentLength) {
			return fmt.Errorf("invalid Content-Length %q", truncate(value))
		}
		h.contentLength = n
	case bytes.EqualFold(name, []byte("Transfer-Encoding")):
		if h.chunked || !bytes.EqualFold(value, []byte("chunked")) {
			return fmt.Errorf("unsupported Transfer-Encoding %q", truncate(value))
		}
		h.chunked = true
	case bytes.EqualFold(name, []byte("Connection")):
		if hasToken(value, "close") {
			h.close = true
		}
	}
	return nil
}

// readLine reads a line within *budget bytes and the read buffer's size,
// without its line ending.
func readLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	*budget -= len(line)
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("response header line longer than %d bytes", br.Size())
	case err == io.EOF && len(line) > 0:
		return nil, io.ErrUnexpectedEOF
	case err != nil:
		return nil, err
	case *budget < 0:
		return nil, errors.New("response header section too long")
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseLength parses a Content-Length: decimal digits only.
func parseLength(v []byte) (int64, error) {
	if len(v) == 0 || len(v) > 18 {
		return 0, errors.New("bad length")
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, errors.New("bad length")
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

// hasToken reports whether the comma-separated list v holds token,
// case-insensitively.
func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var part []byte
		part, v, _ = bytes.Cut(v, []byte(","))
		if bytes.EqualFold(bytes.Trim(part, " \t"), []byte(token)) {
			return true
		}
	}
	return false
}

// truncate shortens what an error quotes of a response.
func truncate(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

// respBody reads a response body as its head framed it, and tells
// whether it was read to its end with the framing intact, so that the
// connection can serve another call.
type respBody struct {
	br         *bufio.Reader
	n          int64 // bytes left of a Content-Length body; -1 otherwise
	chunked    bool
	cr         io.Reader // the chunked decoder
	maxTrailer int
	close      bool // the connection cannot be reused, whatever is read
	done       bool // a chunked body was read to its end, trailer included
	err        error
}

// Read implements io.Reader.
func (b *respBody) Read(p []byte) (int, error) {
	switch {
	case b.err != nil:
		return 0, b.err
	case b.chunked:
		return b.readChunked(p)
	case b.n == 0:
		return 0, io.EOF
	case b.n > 0 && int64(len(p)) > b.n:
		p = p[:b.n]
	}
	n, err := b.br.Read(p)
	if b.n > 0 {
		b.n -= int64(n)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // shorter than its Content-Length
		}
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

func (b *respBody) readChunked(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.cr.Read(p)
	switch {
	case err == io.EOF:
		budget := b.maxTrailer
		if err := skipTrailer(b.br, &budget); err != nil {
			b.err = fmt.Errorf("chunked trailer: %w", err)
			return n, b.err
		}
		b.done = true
	case err != nil:
		b.err = err
	}
	return n, err
}

// skipTrailer reads a chunked body's trailer fields up to the blank line
// that ends the message.
func skipTrailer(br *bufio.Reader, budget *int) error {
	for {
		line, err := readLine(br, budget)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return nil
		}
	}
}

// finished reports whether the body was read to its end, framing intact,
// on a connection that may serve another call.
func (b *respBody) finished() bool {
	if b.close || b.err != nil {
		return false
	}
	if b.chunked {
		return b.done
	}
	return b.n == 0
}
