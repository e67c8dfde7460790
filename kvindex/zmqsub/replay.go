package zmqsub

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/zmtp"
)

// ReplayIdleTimeout bounds the wait for each reply from a replay socket when
// ctx has no earlier deadline: vLLM answers at once or ignores the request.
const ReplayIdleTimeout = 10 * time.Second

// EndSeq is the sequence number of vLLM's replay end marker (-1 as int64).
const EndSeq = ^uint64(0)

// ErrReplayFrame reports a replay reply that is not a vLLM batch.
var ErrReplayFrame = errors.New("zmqsub: malformed replay reply")

// Replay asks vLLM's replay ROUTER at endpoint ("tcp://host:port") for every
// buffered batch with seq >= startSeq and calls fn for each, in order. It
// sends ["", 8-byte big-endian startSeq] from a DEALER and accepts both reply
// layouts, ["", seq, payload] and ["", topic, seq, payload] (vLLM #45177).
// It returns nil at the end marker (seq ff×8); an error on ctx, when no
// reply arrives for ReplayIdleTimeout, on a malformed or out-of-order reply,
// or when fn fails. maxFrame bounds each frame (0 = DefaultMaxFrameSize).
// The connection is guarded like Run's (probe, frame guard).
func Replay(ctx context.Context, endpoint string, startSeq uint64, maxFrame int64, fn func(seq uint64, payload []byte) error) error {
	host, port, err := splitEndpoint(endpoint)
	if err != nil {
		return fmt.Errorf("zmqsub: replay: %w", err)
	}
	if host == "" || host == "*" || port == 0 {
		return fmt.Errorf("zmqsub: replay endpoint %q needs a host and a port", endpoint)
	}
	if maxFrame < 0 {
		return fmt.Errorf("zmqsub: replay: negative maxFrame %d", maxFrame)
	}
	if maxFrame == 0 {
		maxFrame = DefaultMaxFrameSize
	}
	if fn == nil {
		return errors.New("zmqsub: replay: nil callback")
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	if err := probe(ctx, addr, DefaultDialTimeout, DefaultProbeTimeout); err != nil {
		return fmt.Errorf("zmqsub: replay: %w", err)
	}
	cfg := zmtp.Config{SocketType: zmtp.Dealer, PeerTypes: zmtp.PeerTypes(zmtp.Dealer), MaxFrame: maxFrame, Timeout: DefaultDialTimeout}
	c, err := dialZMTP(ctx, addr, cfg)
	if err != nil {
		return fmt.Errorf("zmqsub: replay: dial %s: %w", addr, err)
	}
	defer c.Shutdown()
	stop := context.AfterFunc(ctx, c.Shutdown)
	defer stop()
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], startSeq)
	// The empty delimiter frame is required: vLLM's ROUTER ignores requests
	// that are not exactly [identity, "", start_seq].
	if err := c.Send(DefaultDialTimeout, nil, req[:]); err != nil {
		return fmt.Errorf("zmqsub: replay: send request: %w", err)
	}
	return replayReplies(ctx, c, addr, startSeq, fn)
}

// replayReplies reads the replies to a request for startSeq and on until
// the end marker.
func replayReplies(ctx context.Context, c *zmtp.Conn, addr string, startSeq uint64, fn func(seq uint64, payload []byte) error) error {
	next := startSeq // lowest acceptable seq
	var m zmtp.Message
	for {
		c.SetIdle(ReplayIdleTimeout)
		err := c.Read(&m)
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("zmqsub: replay from %s: %w", addr, ctx.Err())
		case errors.Is(err, os.ErrDeadlineExceeded):
			return fmt.Errorf("zmqsub: replay from %s: no reply within %v", addr, ReplayIdleTimeout)
		case err != nil:
			return fmt.Errorf("zmqsub: replay from %s: %w", addr, err)
		case m.Command:
			if err := c.Pong(m.Parts()[0]); err != nil {
				return fmt.Errorf("zmqsub: replay from %s: %w", addr, err)
			}
			continue // a ZMTP PING; not part of the reply
		}
		seq, payload, err := parseReplay(m.Parts())
		if err != nil {
			return fmt.Errorf("zmqsub: replay from %s: %w", addr, err)
		}
		if seq == EndSeq {
			return nil
		}
		if seq < next {
			return fmt.Errorf("zmqsub: replay from %s: %w: seq %d after %d (requested from %d)", addr, ErrReplayFrame, seq, next-1, startSeq)
		}
		next = seq + 1
		if err := fn(seq, payload); err != nil {
			return fmt.Errorf("zmqsub: replay batch %d: %w", seq, err)
		}
	}
}

// parseReplay decodes one reply as a DEALER sees it (the ROUTER's identity
// frame is gone): ["", seq, payload] or ["", topic, seq, payload].
func parseReplay(frames [][]byte) (seq uint64, payload []byte, err error) {
	if len(frames) < 3 || len(frames) > 4 || len(frames[0]) != 0 {
		return 0, nil, fmt.Errorf("%w: %d frames %s", ErrReplayFrame, len(frames), describeFrames(frames))
	}
	seqFrame, payload := frames[len(frames)-2], frames[len(frames)-1]
	if len(seqFrame) != 8 {
		return 0, nil, fmt.Errorf("%w: sequence frame of %d bytes", ErrReplayFrame, len(seqFrame))
	}
	return binary.BigEndian.Uint64(seqFrame), payload, nil
}

// describeFrames summarises frames for an error message without dumping
// payloads.
func describeFrames(frames [][]byte) string {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, f := range frames {
		if i == 8 {
			b.WriteString(" ...")
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%dB", len(f))
	}
	b.WriteByte(']')
	return b.String()
}
