package kvindex

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Replayer asks the engine's replay endpoint for every buffered message
// with seq >= startSeq, oldest first, and calls fn for each one,
// synchronously, until the buffer's end marker, ctx is done, or fn returns
// an error; it then stops and returns (fn's error may be returned as is).
// fn must not be called after the Replayer returns.
type Replayer func(ctx context.Context, startSeq uint64, fn func(seq uint64, payload []byte) error) error

// FeedConfig tunes a Feed.
type FeedConfig struct {
	// ReplayTimeout bounds one gap replay (default 2s).
	ReplayTimeout time.Duration
	// MaxReplay is the largest gap, in messages, worth replaying (default
	// 10000, vLLM's default replay buffer); a larger gap resets at once.
	MaxReplay uint64
	// Backfill asks the replay endpoint, when a subscription starts, for
	// every message the engine still buffers (at most MaxReplay of them),
	// so a gateway that subscribes after the engine cached a prefix learns
	// it as if it had been there; see Feed.backfill. BackfillTimeout
	// bounds it (default 10s).
	Backfill        bool
	BackfillTimeout time.Duration
}

// Feed applies one engine's ZeroMQ event stream to its Mirror, tracking
// sequence numbers so that the mirror never holds a block the engine has
// dropped for longer than one resync: any message it cannot account for
// (a gap the replay endpoint cannot fill, a sequence going backwards, an
// undecodable payload) resets the mirror.
//
// Connected, Message and Disconnected must be called from one goroutine
// (the subscriber's); Close may be called from any.
type Feed struct {
	m      *Mirror
	replay Replayer
	cfg    FeedConfig
	dec    *Decoder

	ctx    context.Context
	cancel context.CancelFunc

	haveSeq bool
	last    uint64
	// recent is what the subscription's backfill applied last, until the
	// live stream passes it.
	recent recentPayloads
}

// NewFeed returns a Feed applying events to m. replay may be nil when the
// engine has no replay endpoint; gaps then always reset.
func NewFeed(m *Mirror, replay Replayer, cfg FeedConfig) *Feed {
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.MaxReplay == 0 {
		cfg.MaxReplay = 10000
	}
	if cfg.BackfillTimeout <= 0 {
		cfg.BackfillTimeout = 10 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Feed{m: m, replay: replay, cfg: cfg, dec: NewDecoder(), ctx: ctx, cancel: cancel}
}

// Close aborts a replay in progress and makes later gaps reset at once
// instead of replaying. Messages are still applied; stop calling the Feed
// to stop that.
func (f *Feed) Close() { f.cancel() }

// Connected reports that a new connection or subscription began: what was
// published meanwhile is unknown, so the mirror is reset (reason
// "subscribe") and the next message's sequence number is taken as is —
// or, with Backfill, rebuilt from the engine's replay buffer first.
func (f *Feed) Connected() {
	f.m.wmu.Lock()
	defer f.m.wmu.Unlock()
	f.haveSeq = false
	f.recent = recentPayloads{}
	f.m.setConnected(true, nil)
	f.m.clear("subscribe")
	if f.cfg.Backfill && f.replay != nil {
		f.backfill()
	}
}

// Disconnected reports that the subscription ended. Nothing the engine does
// from now on can be seen, so the mirror is reset (reason "disconnect")
// rather than left to claim blocks the engine may drop.
func (f *Feed) Disconnected(err error) {
	f.m.wmu.Lock()
	defer f.m.wmu.Unlock()
	f.haveSeq = false
	f.m.setConnected(false, err)
	f.m.clear("disconnect")
}

var (
	errReplayDone = errors.New("kvindex: replay complete")
	errReplayHole = errors.New("kvindex: replay skipped a message")
)

// Message applies one ZMQ message [topic, seq, payload]. The topic is not
// interpreted: subscription filtering happens in the subscriber.
func (f *Feed) Message(topic []byte, seq uint64, payload []byte) {
	f.m.wmu.Lock()
	defer f.m.wmu.Unlock()
	if f.isDuplicate(seq, payload) {
		return
	}
	if f.recent.n > 0 {
		f.recent = recentPayloads{} // in step with the live stream from here
	}
	switch {
	case !f.haveSeq || seq == f.last+1:
	case seq > f.last+1:
		if !f.fill(f.last+1, seq) {
			f.m.clear("gap")
		}
	default:
		// vLLM numbers messages from 0 in every process: a sequence
		// going backwards is a restarted engine with an empty cache.
		f.m.clear("restart")
	}
	f.haveSeq, f.last = true, seq
	f.applyPayload(seq, payload)
}

// fill replays messages [from, to) and reports whether every one of them
// was applied.
func (f *Feed) fill(from, to uint64) bool {
	if f.replay == nil {
		return false
	}
	if to-from > f.cfg.MaxReplay {
		f.m.noteReplay(false, 0, fmt.Errorf("gap of %d messages exceeds MaxReplay %d", to-from, f.cfg.MaxReplay))
		return false
	}
	ctx, cancel := context.WithTimeout(f.ctx, f.cfg.ReplayTimeout)
	defer cancel()
	next := from
	err := f.replayGuarded(ctx, from, func(seq uint64, payload []byte) error {
		switch {
		case next == to:
			return errReplayDone
		case seq < next:
			return nil // already applied: an overlap, not a hole
		case seq > next:
			return errReplayHole
		}
		f.applyPayload(seq, payload)
		next++
		if next == to {
			return errReplayDone
		}
		return nil
	})
	// Success is judged by what was applied, not by how the replay ended.
	filled := next == to
	switch {
	case filled:
	case errors.Is(err, errReplayHole):
		err = fmt.Errorf("replay from %d skipped %d", from, next)
	case err == nil:
		err = fmt.Errorf("replay from %d ended at %d, before %d", from, next, to)
	default:
		err = fmt.Errorf("replay from %d: %w", from, err)
	}
	f.m.noteReplay(filled, next-from, err)
	return filled
}

// backfill replays everything the engine still buffers (vLLM keeps the
// last buffer_steps batches, 10000 by default; at most MaxReplay are
// applied), oldest first, when a subscription starts. Blocks stored within
// that window and not removed in it are held, whatever came before: a
// message lost before the window can only have stored blocks the mirror
// never claims, or removed them. Events in the window whose parents are
// older are orphans (see orphans.go). A hole inside the window starts it
// anew after the hole, the mirror reset (reason "backfill"). Messages
// published while the replay ran arrive live as well: backfill remembers
// the payloads it applied last so Message can tell such a duplicate from
// an engine restart (see isDuplicate). Callers hold m.wmu.
func (f *Feed) backfill() {
	ctx, cancel := context.WithTimeout(f.ctx, f.cfg.BackfillTimeout)
	defer cancel()
	var applied uint64
	started := false
	err := f.replayGuarded(ctx, 0, func(seq uint64, payload []byte) error {
		switch {
		case applied >= f.cfg.MaxReplay:
			return errReplayDone
		case started && seq <= f.last:
			return nil // an overlap
		case started && seq > f.last+1:
			f.m.clear("backfill")
		}
		started = true
		f.haveSeq, f.last = true, seq
		f.recent.note(seq, payload)
		f.applyPayload(seq, payload)
		applied++
		return nil
	})
	f.m.noteBackfill(applied, err)
}

// replayGuarded calls the Replayer with fn, which it shields from calls
// made after the Replayer returned: the contract forbids them, but fn
// changes the mirror and the feed's state, which the caller reads once
// replayGuarded returns.
func (f *Feed) replayGuarded(ctx context.Context, start uint64, fn func(seq uint64, payload []byte) error) error {
	var mu sync.Mutex
	done := false
	err := f.replay(ctx, start, func(seq uint64, payload []byte) error {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return errReplayDone
		}
		return fn(seq, payload)
	})
	mu.Lock()
	done = true
	mu.Unlock()
	return err
}

// isDuplicate reports whether a live message is one the backfill applied
// already: its sequence number at most the last one applied, and its
// payload the one applied under that number. A restarted engine numbers
// from 0 again, with other payloads.
func (f *Feed) isDuplicate(seq uint64, payload []byte) bool {
	return f.recent.n > 0 && seq <= f.last && f.recent.has(seq, payload)
}

// recentPayloads remembers the digests of the last payloads a backfill
// applied, by sequence number: the ones a live subscription may deliver
// again.
type recentPayloads struct {
	seq [64]uint64
	sum [64]uint64
	n   int
}

func (r *recentPayloads) note(seq uint64, payload []byte) {
	i := r.n % len(r.seq)
	r.seq[i], r.sum[i] = seq, xxhash.Sum64(payload)
	r.n++
}

func (r *recentPayloads) has(seq uint64, payload []byte) bool {
	for i := range min(r.n, len(r.seq)) {
		if r.seq[i] == seq {
			return r.sum[i] == xxhash.Sum64(payload)
		}
	}
	return false
}

// applyPayload decodes and applies one payload. Callers hold m.wmu.
func (f *Feed) applyPayload(seq uint64, payload []byte) {
	b, err := f.dec.Decode(payload)
	if err != nil {
		// A lost event could have been a removal: only a reset keeps the
		// mirror from claiming a block the engine dropped.
		f.m.noteDecodeError(seq, err)
		f.m.clear("decode")
		return
	}
	for i := range b.Events {
		f.m.verify.check(&b.Events[i])
	}
	f.m.apply(seq, b)
}
