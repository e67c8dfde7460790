package kvindex

import (
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
)

// TestClockNeverGoesBack: a source that steps back makes time stand still
// across the step and move on from there, for the speculative entries and
// the approximate tree alike.
func TestClockNeverGoesBack(t *testing.T) {
	src := testclock.New(time.Unix(1_700_000_000, 0))
	c := newClock(src.Now)
	src.Advance(10 * time.Second)
	if got := c.monotonic(); got != int64(10*time.Second) {
		t.Fatalf("after 10s: %v", time.Duration(got))
	}
	src.Advance(-time.Hour) // a wall clock stepped back
	if got := c.monotonic(); got != int64(10*time.Second) {
		t.Fatalf("across a step back: %v, want time to stand still at 10s", time.Duration(got))
	}
	src.Advance(time.Second)
	if got := c.monotonic(); got != int64(11*time.Second) {
		t.Fatalf("a second after the step: %v, want 11s", time.Duration(got))
	}
	if c.latest() != int64(11*time.Second) {
		t.Fatalf("latest %v", time.Duration(c.latest()))
	}
}
