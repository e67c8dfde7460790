// Package testclock is the manually advanced clock tests hand to the
// packages that take one (admission gates, the KV index's TTLs and
// approximate tree, the registry's drain rates, the fleet), so that time
// passes only when a test says so.
package testclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only by Advance. It is safe for concurrent
// use. Its readings carry no monotonic part, like a wall clock's after a
// step.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock reading t.
func New(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d (back, for negative d).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
