package kvindex

import (
	"sync/atomic"
	"time"
)

// clock is the one time policy of the index's timed entries (speculative
// entries, the approximate tree's records): nanoseconds since its first
// reading, from a time source that tests may replace, and never earlier
// than a time it has returned. time.Now's readings carry Go's monotonic
// clock, which Sub uses, so a step of the wall clock changes nothing. A
// source without one (a fake, a reading stripped of it) may step back:
// the step is added to skew, so time stands still across it and moves on
// from there. Were it not, every entry would live the step longer, and
// entries kept in time order would stop being so, an old one at the head
// holding back the expiry of all behind it.
type clock struct {
	now   func() time.Time
	epoch time.Time // the source's reading at construction
	// skew is added to the source's readings: the steps back it took.
	// seen is the latest time returned, skew included.
	skew, seen atomic.Int64
}

func newClock(now func() time.Time) *clock {
	if now == nil {
		now = time.Now
	}
	return &clock{now: now, epoch: now()}
}

// read is the source's reading in ns since epoch, skew included: cheap and
// lock-free, for a look that decides whether to take a lock; it may be
// earlier than a time returned before.
func (c *clock) read() int64 { return int64(c.now().Sub(c.epoch)) + c.skew.Load() }

// monotonic is the time now in ns since epoch, never earlier than a time
// it returned before. Its callers serialize it (a writer's lock).
func (c *clock) monotonic() int64 {
	t := c.read()
	if seen := c.seen.Load(); t < seen {
		c.skew.Add(seen - t)
		t = seen
	}
	c.seen.Store(t)
	return t
}

// latest is the latest time monotonic returned.
func (c *clock) latest() int64 { return c.seen.Load() }
