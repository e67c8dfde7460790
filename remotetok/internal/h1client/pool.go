package h1client

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// conn is one connection and what its calls reuse.
type conn struct {
	nc     net.Conn
	br     *bufio.Reader
	addr   string
	idleAt time.Time // when it went back to the pool
}

// watch bounds cn's I/O by ctx: its deadline at once, its cancellation
// when it comes. stop reports false once a cancellation has interrupted
// the connection, which then may not be reused.
func (cn *conn) watch(ctx context.Context) (stop func() bool) {
	if d, ok := ctx.Deadline(); ok {
		_ = cn.nc.SetDeadline(d)
	}
	return context.AfterFunc(ctx, func() { _ = cn.nc.SetDeadline(time.Unix(1, 0)) })
}

// takeIdle returns the most recently used idle connection to addr that
// is still open, nil when there is none.
//
// An engine closes keep-alive connections of its own accord (vLLM's
// uvicorn after 5 s idle), and no goroutine here watches the idle ones
// for that, as net/http's do: each is checked when taken (alive), one
// syscall, and one found closed is dropped rather than written to.
func (c *Client) takeIdle(addr string) *conn {
	for {
		cn, fresh := c.popIdle(addr)
		if cn == nil || (fresh && cn.alive()) {
			return cn
		}
		_ = cn.nc.Close()
	}
}

// popIdle takes the most recently used idle connection to addr; fresh is
// false when it was idle for IdleTimeout, in which case all the older
// ones, dropped here, were too.
func (c *Client) popIdle(addr string) (cn *conn, fresh bool) {
	c.mu.Lock()
	cs := c.idle[addr]
	if len(cs) == 0 {
		c.mu.Unlock()
		return nil, false
	}
	cn = cs[len(cs)-1]
	if time.Since(cn.idleAt) < c.o.IdleTimeout {
		cs[len(cs)-1] = nil
		c.idle[addr] = cs[:len(cs)-1]
		c.nidle--
		c.mu.Unlock()
		return cn, true
	}
	// The most recent is too old, so are all the others (the sweep's
	// timer has not fired yet).
	delete(c.idle, addr)
	c.nidle -= len(cs)
	c.mu.Unlock()
	for _, old := range cs[:len(cs)-1] {
		_ = old.nc.Close()
	}
	return cn, false
}

// alive reports whether an idle connection can still carry a call: the
// peer has neither closed it nor sent anything unasked.
func (cn *conn) alive() bool {
	return cn.br.Buffered() == 0 && connAlive(cn.nc)
}

// put returns cn to the pool, or closes it when the pool is full or the
// client closed.
func (c *Client) put(cn *conn) {
	cn.idleAt = time.Now()
	c.mu.Lock()
	if c.closed || c.nidle >= c.o.MaxIdle || len(c.idle[cn.addr]) >= c.o.MaxIdlePerHost {
		c.mu.Unlock()
		_ = cn.nc.Close()
		return
	}
	c.idle[cn.addr] = append(c.idle[cn.addr], cn)
	c.nidle++
	if c.sweep == nil {
		c.sweep = time.AfterFunc(c.o.IdleTimeout, c.sweepIdle)
	}
	c.mu.Unlock()
}

// sweepIdle closes the connections idle for IdleTimeout and arms the timer
// again for the oldest of the others.
func (c *Client) sweepIdle() {
	now := time.Now()
	var expired []*conn
	var next time.Duration
	c.mu.Lock()
	for addr, cs := range c.idle {
		i := 0 // cs runs from the oldest to the most recent
		for i < len(cs) && now.Sub(cs[i].idleAt) >= c.o.IdleTimeout {
			i++
		}
		switch {
		case i == len(cs):
			delete(c.idle, addr)
		case i > 0:
			c.idle[addr] = append([]*conn(nil), cs[i:]...)
		}
		expired = append(expired, cs[:i]...)
		if i < len(cs) {
			if wait := c.o.IdleTimeout - now.Sub(cs[i].idleAt); next == 0 || wait < next {
				next = wait
			}
		}
	}
	c.nidle -= len(expired)
	c.sweep = nil
	if next > 0 && !c.closed {
		c.sweep = time.AfterFunc(next, c.sweepIdle)
	}
	c.mu.Unlock()
	for _, cn := range expired {
		_ = cn.nc.Close()
	}
}

// Idle is how many idle connections the client holds.
func (c *Client) Idle() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nidle
}

// target is where a URL's calls go.
type target struct {
	addr string // host:port to dial
	host string // the Host header
	path string // the request target: path and query
}

// targetCache keeps the parsed URLs (the engines' /tokenize URLs, a few
// per engine), so that a call parses nothing. It is emptied when it
// reaches maxTargets, which only a churn of engines can make it do.
type targetCache struct {
	mu sync.RWMutex
	m  map[string]*target
}

const maxTargets = 1024

func (tc *targetCache) get(raw string) (*target, error) {
	tc.mu.RLock()
	t := tc.m[raw]
	tc.mu.RUnlock()
	if t != nil {
		return t, nil
	}
	t, err := parseTarget(raw)
	if err != nil {
		return nil, err
	}
	tc.mu.Lock()
	if tc.m == nil || len(tc.m) >= maxTargets {
		tc.m = make(map[string]*target)
	}
	tc.m[raw] = t
	tc.mu.Unlock()
	return t, nil
}

// parseTarget checks that raw is an http:// URL this client can call.
func parseTarget(raw string) (*target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("h1client: %w", err)
	}
	if u.Scheme != "http" || u.Host == "" || u.User != nil || u.Opaque != "" || !httpguts.ValidHostHeader(u.Host) {
		return nil, fmt.Errorf("h1client: unsupported URL %q: want http://host[:port]/path", raw)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	return &target{addr: addr, host: u.Host, path: u.RequestURI()}, nil
}
