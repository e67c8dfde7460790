package zmqsub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/zmtp"
)

// The subscriber speaks ZMTP 3.0 itself (internal/zmtp, over its frame
// guard): as a SUB to the engines' publishers (dialled, or accepted in bind
// mode) and as a DEALER to their replay sockets. It did so through
// go-zeromq/zmq4 once, whose sockets read each connection on a goroutine of
// their own and hand every message through two channels before the
// handler sees it; with
// vLLM publishing a batch per scheduler step, those hand-offs and their
// wake-ups cost more CPU than reading and applying the batch. A dialled
// connection is read on the goroutine that applies its batches.

// keepAlive detects dead peers (a publisher host that vanished without a
// FIN) in about 30 s without an application idle timeout.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// GuardError reports a ZMTP stream the frame guard refused (internal/zmtp).
// It implements net.Error, never a timeout.
type GuardError = zmtp.GuardError

// dialSub connects to the publisher at addr and completes the handshake
// within cfg.Timeout: greetings, READY commands (the guard checks the
// peer's socket type), then the subscription to topic.
func dialSub(ctx context.Context, addr, topic string, cfg zmtp.Config) (*zmtp.Conn, error) {
	c, err := dialZMTP(ctx, addr, cfg)
	if err != nil {
		return nil, err
	}
	if err := subscribe(c, cfg.Timeout, topic); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// subscribe sends a SUB's subscription to topic within timeout, as ZMTP
// 3.0 does: a message whose body is 1 and the topic.
func subscribe(c *zmtp.Conn, timeout time.Duration, topic string) error {
	if err := c.Send(timeout, append([]byte{1}, topic...)); err != nil {
		return fmt.Errorf("zmtp subscribe: %w", err)
	}
	return nil
}

// dialZMTP connects to addr and completes the NULL handshake as
// cfg.SocketType within cfg.Timeout.
func dialZMTP(ctx context.Context, addr string, cfg zmtp.Config) (*zmtp.Conn, error) {
	d := net.Dialer{Timeout: cfg.Timeout, KeepAliveConfig: keepAlive}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err() // net reports a context deadline as "i/o timeout"
		}
		return nil, err
	}
	return zmtp.Start(ctx, nc, cfg)
}

// probe checks that addr speaks ZMTP before a session is dialled: connect,
// then read the 10-byte greeting signature (0xff, 8 bytes, 0x7f) that every
// ZMTP 3 peer sends first. A server that says nothing or something else
// fails here, with an error that says so, and costs no session.
func probe(ctx context.Context, addr string, dialTimeout, probeTimeout time.Duration) error {
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err() // net reports a context deadline as "i/o timeout"
		}
		return fmt.Errorf("connect %s: %w", addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	if err := c.SetReadDeadline(time.Now().Add(probeTimeout)); err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	var sig [10]byte
	n, err := io.ReadFull(c, sig[:])
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("probe %s: %w", addr, ctx.Err())
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("probe %s: no ZMTP greeting within %v (not a ZMQ publisher?)", addr, probeTimeout)
		}
		return fmt.Errorf("probe %s: read greeting (%d bytes): %w", addr, n, err)
	}
	if sig[0] != 0xff || sig[9] != 0x7f {
		return fmt.Errorf("probe %s: %w", addr, &GuardError{Reason: fmt.Sprintf("not a ZMTP peer (first bytes %q)", sig[:])})
	}
	return nil
}
