package vllmsim

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/zmtp"
)

// The simulator's PUB and ROUTER sockets speak ZMTP through internal/zmtp
// (greeting, NULL handshake, frame guard, message reader), with their own
// accept/dial loops, queues and writers: a slow subscriber must not block
// the others, nothing may outlive Close (many tests start and stop
// simulators), and no peer may make the simulator allocate whatever frame
// size it announces.

const (
	maxInFrame       = 64 << 10                 // frames a subscriber or replay client may send us
	maxInFrames      = zmtp.MaxFramesPerMessage // frames per inbound message
	handshakeTimeout = 5 * time.Second
	writeTimeout     = 30 * time.Second
)

// endpoint is a parsed ZMQ endpoint.
type endpoint struct {
	network string // "tcp" or "unix"
	addr    string // host:port or socket path
	bind    bool
}

// parseEndpoint applies vLLM's rule (bind when the endpoint contains "*" or
// "::" or is ipc://, connect otherwise), plus: a tcp port of 0 binds. "*" is
// replaced by bindHost.
func parseEndpoint(ep, bindHost string) (endpoint, error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return endpoint{}, fmt.Errorf("zmq endpoint %q: missing scheme", ep)
	}
	switch scheme {
	case "tcp":
		bind := strings.Contains(rest, "*") || strings.Contains(rest, "::")
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return endpoint{}, fmt.Errorf("zmq endpoint %q: %w", ep, err)
		}
		if port == "0" {
			bind = true
		}
		if host == "*" {
			host = bindHost
		}
		return endpoint{network: "tcp", addr: net.JoinHostPort(host, port), bind: bind}, nil
	case "ipc":
		if rest == "" {
			return endpoint{}, fmt.Errorf("zmq endpoint %q: empty path", ep)
		}
		return endpoint{network: "unix", addr: rest, bind: true}, nil
	default:
		return endpoint{}, fmt.Errorf("zmq endpoint %q: scheme %q not supported (tcp, ipc)", ep, scheme)
	}
}

// endpointString formats a listener address as a ZMQ endpoint.
func endpointString(a net.Addr) string {
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// handshake performs the ZMTP greeting and NULL handshake on c as sockType,
// accepted or dialled alike, within handshakeTimeout; ctx ending aborts it.
// The peer must be of a type ZMTP pairs with sockType. Like libzmq, a
// ROUTER or DEALER announces an (empty) Identity. On failure c is closed.
func handshake(ctx context.Context, c net.Conn, sockType string) (*zmtp.Conn, error) {
	cfg := zmtp.Config{SocketType: sockType, PeerTypes: zmtp.PeerTypes(sockType), MaxFrame: maxInFrame, Timeout: handshakeTimeout}
	if sockType == zmtp.Router || sockType == zmtp.Dealer {
		cfg.Identity = []byte{}
	}
	return zmtp.Start(ctx, c, cfg)
}

// readMsg reads one ZMTP message (all frames) from c, at most maxInFrames
// frames of maxInFrame bytes. A command is returned with isCmd set, as its
// one frame.
func readMsg(c *zmtp.Conn) (frames [][]byte, isCmd bool, err error) {
	var m zmtp.Message
	if err := c.Read(&m); err != nil {
		return nil, false, err
	}
	return m.Parts(), m.Command, nil
}
