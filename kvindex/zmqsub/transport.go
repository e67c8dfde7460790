package zmqsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// transportName is the zmq4 scheme whose connections go through the frame
// guard. zmq4 looks transports up in a process-wide registry, so it is
// registered once; everything per socket travels in the socket's context.
const transportName = "llmgwtcp"

var registerTransport = sync.OnceValue(func() error {
	if err := zmq4.RegisterTransport(transportName, guardTransport{}); err != nil {
		return fmt.Errorf("zmqsub: register zmq4 transport: %w", err)
	}
	return nil
})

// keepAlive detects dead peers (a publisher host that vanished without a
// FIN) in about 30 s without an application idle timeout.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

type trackerKey struct{}

// tracker owns the guarded connections of one zmq4 socket. The transport
// finds it in the context zmq4 passes to Dial and Listen.
type tracker struct {
	lim         guardLimits
	dialTimeout time.Duration
	dialCtx     context.Context // cancelled to abort an in-flight TCP connect
	cancelDial  context.CancelFunc
	// onHandshake, if set, is told about each connection that became a zmq4
	// connection; it runs on a zmq4 goroutine and must not block for long.
	onHandshake func()

	mu     sync.Mutex
	closed bool
	conns  map[*guardConn]struct{}
	// live counts connections released to zmq4 (handshake done) that zmq4
	// has not closed yet: each has a zmq4 reader goroutine.
	live     int
	liveZero chan struct{} // closed when shut down and live reaches 0
}

func newTracker(lim guardLimits, dialTimeout time.Duration) *tracker {
	ctx, cancel := context.WithCancel(context.Background())
	return &tracker{
		lim:         lim,
		dialTimeout: dialTimeout,
		dialCtx:     ctx,
		cancelDial:  cancel,
		conns:       make(map[*guardConn]struct{}),
		liveZero:    make(chan struct{}),
	}
}

// context returns the context to create the zmq4 socket with. It is never
// cancelled: zmq4 leaks reader goroutines when its context ends before
// Close, so the socket's life is ended with shutdown + Close only.
func (t *tracker) context() context.Context {
	return context.WithValue(context.Background(), trackerKey{}, t)
}

func trackerFrom(ctx context.Context) *tracker {
	if ctx != nil {
		if t, ok := ctx.Value(trackerKey{}).(*tracker); ok {
			return t
		}
	}
	return nil
}

// wrap guards a fresh TCP connection, or refuses it after shutdown.
func (t *tracker) wrap(c net.Conn) (*guardConn, error) {
	g := newGuardConn(c, t.lim, connHooks{handshake: t.handshake, libClosed: t.libClosed, ended: t.ended})
	t.mu.Lock()
	closed := t.closed
	if !closed {
		t.conns[g] = struct{}{}
	}
	t.mu.Unlock()
	if closed {
		g.shutdown()
		return nil, errConnShutdown
	}
	return g, nil
}

func (t *tracker) handshake(g *guardConn) bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	t.live++
	g.released = true
	t.mu.Unlock()
	if t.onHandshake != nil {
		t.onHandshake()
	}
	return true
}

func (t *tracker) libClosed(g *guardConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.conns[g]; !ok {
		return
	}
	delete(t.conns, g)
	if g.released {
		t.live--
		if t.closed && t.live == 0 {
			close(t.liveZero)
		}
	}
}

// shutdown refuses new connections, aborts dials and ends every connection.
// zmq4's reader goroutines then deliver their last error and exit; wait on
// done() before closing the zmq4 socket.
func (t *tracker) shutdown() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	conns := make([]*guardConn, 0, len(t.conns))
	for g := range t.conns {
		conns = append(conns, g)
	}
	if t.live == 0 {
		close(t.liveZero)
	}
	t.mu.Unlock()
	t.cancelDial()
	for _, g := range conns {
		g.shutdown()
	}
}

// done is closed once shut down and every zmq4 reader goroutine has exited.
func (t *tracker) done() <-chan struct{} { return t.liveZero }

// ended forgets a failed connection zmq4 never took over, so a port
// scanner hitting a bound endpoint does not grow the set. Released ones stay
// until zmq4 closes them (libClosed): their reader goroutine is still alive.
func (t *tracker) ended(g *guardConn) {
	t.mu.Lock()
	if !g.released {
		delete(t.conns, g)
	}
	t.mu.Unlock()
}

// guardTransport is the zmq4 transport for transportName: plain TCP with
// keep-alive, every connection wrapped in a guardConn.
type guardTransport struct{}

func (guardTransport) Dial(ctx context.Context, _ transport.Dialer, addr string) (net.Conn, error) {
	t := trackerFrom(ctx)
	if t == nil {
		return nil, errors.New("zmqsub: guarded transport used outside zmqsub")
	}
	d := net.Dialer{Timeout: t.dialTimeout, KeepAliveConfig: keepAlive}
	c, err := d.DialContext(t.dialCtx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return t.wrap(c)
}

func (guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	t := trackerFrom(ctx)
	if t == nil {
		return nil, errors.New("zmqsub: guarded transport used outside zmqsub")
	}
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	l, err := lc.Listen(t.dialCtx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &guardListener{Listener: l, t: t, closed: make(chan struct{})}, nil
}

func (guardTransport) Addr(ep string) (string, error) {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return "", err
	}
	if host == "*" {
		host = "0.0.0.0"
	}
	if port == "*" || port == "" {
		port = "0"
	}
	return net.JoinHostPort(host, port), nil
}

// guardListener wraps accepted connections. It retries failed accepts itself
// with a backoff: zmq4's accept loop retries immediately and would spin.
type guardListener struct {
	net.Listener
	t         *tracker
	closeOnce sync.Once
	closed    chan struct{}
}

func (l *guardListener) Accept() (net.Conn, error) {
	delay := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			select {
			case <-l.closed:
				return nil, net.ErrClosed
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			select {
			case <-l.closed:
				return nil, net.ErrClosed
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 5 * time.Millisecond
		g, err := l.t.wrap(c)
		if err != nil {
			continue // shut down: refused and closed
		}
		return g, nil
	}
}

func (l *guardListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// splitEndpoint parses "tcp://host:port".
func splitEndpoint(ep string) (host string, port int, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("endpoint %q: only tcp://host:port is supported", ep)
	}
	h, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, fmt.Errorf("endpoint %q: %w", ep, err)
	}
	if p == "*" {
		p = "0"
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("endpoint %q: bad port %q", ep, p)
	}
	return h, n, nil
}
