// Package h1client makes small HTTP/1.1 POST calls on the caller's own
// goroutine, over a pool of keep-alive connections.
//
// It exists for one hot call: the gateway's /tokenize request to an
// engine, made once per routed request. net/http's Transport runs two
// goroutines per connection and hands every request and response between
// them and the caller; on 2 cores that was some 15–25 µs of CPU per call,
// a seventh of what the gateway added to a small request. Here the caller
// writes the request and reads the answer itself: no goroutine per
// connection, nothing to hand over, and an idle connection costs only its
// socket and a 4 KiB read buffer.
//
// It speaks only what such a call needs: plain http:// (callers use
// net/http for anything else, see [Supports]), a request body of known
// length, a response framed by Content-Length, chunked encoding or the
// connection's end. Responses are read under a bound on their header
// section, and a malformed one is an error, never a panic.
package h1client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Options tunes a [Client]. Zero fields take the defaults.
type Options struct {
	// DialTimeout bounds a connection's dial (within the call's own
	// context). Default 3s.
	DialTimeout time.Duration
	// KeepAlive is the TCP keep-alive period of the connections.
	// Default 30s.
	KeepAlive time.Duration
	// IdleTimeout closes a connection left idle this long. Default 90s.
	IdleTimeout time.Duration
	// MaxIdlePerHost bounds the idle connections kept to one address.
	// Default 32.
	MaxIdlePerHost int
	// MaxIdle bounds the idle connections kept in all. Default 128.
	MaxIdle int
	// MaxHeaderBytes bounds a response's status line and header section.
	// Default 64 KiB.
	MaxHeaderBytes int
	// Header is sent with every call (before the call's own headers).
	Header http.Header
}

// Response is a call's response, valid only within the callback given to
// [Client.Post].
type Response struct {
	StatusCode int
	// ContentLength is the body's declared length; -1 when the body is
	// chunked or runs to the connection's end.
	ContentLength int64
	// Body reads the response body. A body not read to its end leaves
	// the connection closed rather than reused.
	Body io.Reader
}

// Client is a pool of HTTP/1.1 connections for POST calls. It starts no
// goroutine of its own; a timer closes idle connections. Safe for
// concurrent use.
type Client struct {
	o      Options
	dialer net.Dialer
	fixed  []byte // Options.Header, written once

	mu     sync.Mutex
	idle   map[string][]*conn // by address, most recently used last
	nidle  int
	closed bool
	sweep  *time.Timer // armed while connections are idle

	targets targetCache
	dials   atomic.Uint64
}

// New returns a Client; a header in o.Header that is not valid HTTP is an
// error.
func New(o Options) (*Client, error) {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 3 * time.Second
	}
	if o.KeepAlive <= 0 {
		o.KeepAlive = 30 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 90 * time.Second
	}
	if o.MaxIdlePerHost <= 0 {
		o.MaxIdlePerHost = 32
	}
	if o.MaxIdle <= 0 {
		o.MaxIdle = 128
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = 64 << 10
	}
	if err := checkHeader(o.Header); err != nil {
		return nil, err
	}
	fixed := appendHeader(nil, o.Header)
	return &Client{
		o:      o,
		dialer: net.Dialer{Timeout: o.DialTimeout, KeepAlive: o.KeepAlive},
		fixed:  fixed,
		idle:   make(map[string][]*conn),
	}, nil
}

// Supports reports whether Post can call url: an absolute http:// URL.
func Supports(url string) bool {
	return len(url) > len("http://") && strings.HasPrefix(url, "http://")
}

// Dials is how many connections the client has opened.
func (c *Client) Dials() uint64 { return c.dials.Load() }

// Post sends body to url with the header h (added to Options.Header) and
// calls read with the response. read must not keep the response's body
// beyond its return. The error is the call's or read's. A call on a
// pooled connection that fails before any byte of a response arrived
// (the engine closed it while it was idle) is made once more on a new
// connection: callers use Post for requests that are safe to repeat.
func (c *Client) Post(ctx context.Context, url string, h http.Header, body []byte, read func(*Response) error) error {
	if err := ctx.Err(); err != nil {
		return err // a pooled connection would be spoiled for nothing
	}
	t, err := c.targets.get(url)
	if err != nil {
		return err
	}
	if err := checkHeader(h); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		cn, reused, err := c.get(ctx, t, attempt == 0)
		if err != nil {
			return err
		}
		unsent, err := c.exchange(ctx, cn, t, call{header: h, body: body, read: read})
		if err != nil && unsent && reused && attempt == 0 && ctx.Err() == nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		return err
	}
}

// call is one request's parts.
type call struct {
	header http.Header
	body   []byte
	read   func(*Response) error
}

// exchange makes one call on cn and returns cn to the pool when it can
// serve another; unsent reports an error before any byte of a response
// was read (the call may be repeated).
func (c *Client) exchange(ctx context.Context, cn *conn, t *target, cl call) (unsent bool, err error) {
	stop := cn.watch(ctx)
	reusable := false
	defer func() {
		if stop() && reusable && cn.nc.SetDeadline(time.Time{}) == nil {
			c.put(cn)
		} else {
			_ = cn.nc.Close()
		}
		err = contextError(ctx, err)
	}()
	if err := cn.writeRequest(t, c.fixed, cl.header, cl.body); err != nil {
		return true, fmt.Errorf("writing request: %w", err)
	}
	if _, err := cn.br.Peek(1); err != nil {
		return true, fmt.Errorf("reading response: %w", err)
	}
	resp, rb, err := readResponse(cn.br, c.o.MaxHeaderBytes)
	if err != nil {
		return false, fmt.Errorf("reading response: %w", err)
	}
	if err := cl.read(resp); err != nil {
		return false, err
	}
	reusable = rb.finished()
	return false, nil
}

// contextError says in err that ctx ended the call, when it did: the
// connection's deadline is the context's, and may pass a moment before
// the context marks itself done.
func contextError(ctx context.Context, err error) error {
	if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	cerr := ctx.Err()
	if d, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(d) {
		cerr = context.DeadlineExceeded
	}
	if cerr == nil {
		return err
	}
	return fmt.Errorf("%w: %w", cerr, err)
}

// get returns an idle connection to t's address when idle is set and
// there is one, or dials one. A repeated call dials: the idle connection
// it failed on was not the only one the engine may have closed.
func (c *Client) get(ctx context.Context, t *target, idle bool) (cn *conn, reused bool, err error) {
	if idle {
		if cn := c.takeIdle(t.addr); cn != nil {
			return cn, true, nil
		}
	}
	nc, err := c.dialer.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, false, fmt.Errorf("dial %s: %w", t.addr, err)
	}
	c.dials.Add(1)
	return &conn{nc: nc, br: bufio.NewReaderSize(nc, 4<<10), addr: t.addr}, false, nil
}

// writeRequest writes the request line and headers, with the body in
// the same write when they fit in a pooled buffer together (one syscall
// and TCP segment for a typical call); a longer body is written after
// them from where it is. (Not one writev of both: the race detector does
// not see a writev as the write a reader of the socket synchronizes with,
// which made every test with its server in the same process report races.)
func (cn *conn) writeRequest(t *target, fixed []byte, h http.Header, body []byte) error {
	bp := writeBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= maxPooledWrite {
			writeBufs.Put(bp)
		}
	}()
	w := append((*bp)[:0], "POST "...)
	w = append(append(w, t.path...), " HTTP/1.1\r\nHost: "...)
	w = append(append(w, t.host...), "\r\nUser-Agent: caddy-llmgw\r\nContent-Length: "...)
	w = append(strconv.AppendInt(w, int64(len(body)), 10), "\r\n"...)
	w = append(w, fixed...)
	w = append(appendHeader(w, h), "\r\n"...)
	if len(w)+len(body) <= maxPooledWrite {
		w = append(w, body...)
		body = nil
	}
	*bp = w
	if _, err := cn.nc.Write(w); err != nil || len(body) == 0 {
		return err
	}
	_, err := cn.nc.Write(body)
	return err
}

// writeBufs is a documented pool of request buffers: a call's line,
// headers and (up to maxPooledWrite bytes in all) body, written at once.
var writeBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledWrite bounds what a pooled request buffer holds: a chat of
// some 15k tokens with its headers.
const maxPooledWrite = 64 << 10

// checkHeader refuses header names and values that are not valid HTTP
// (a value with a line break would start a header of its own), before a
// connection is taken for the call.
func checkHeader(h http.Header) error {
	for k, vs := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("invalid header name %q", k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("invalid value for header %q", k)
			}
		}
	}
	return nil
}

// appendHeader appends h's fields, checked by checkHeader, but for those
// this client frames the message with.
func appendHeader(dst []byte, h http.Header) []byte {
	for k, vs := range h {
		if framing[http.CanonicalHeaderKey(k)] {
			continue
		}
		for _, v := range vs {
			dst = append(append(append(append(dst, k...), ": "...), v...), "\r\n"...)
		}
	}
	return dst
}

// framing are the header fields the client writes itself or must not send.
var framing = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true, "Upgrade": true,
	"User-Agent": true,
}

// Close closes the idle connections; connections of calls in flight are
// closed when their call ends. The client stays usable, but from then on
// closes every connection after its call.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	idle := c.idle
	c.idle, c.nidle = make(map[string][]*conn), 0
	if c.sweep != nil {
		c.sweep.Stop()
		c.sweep = nil
	}
	c.mu.Unlock()
	for _, cs := range idle {
		for _, cn := range cs {
			_ = cn.nc.Close()
		}
	}
}
