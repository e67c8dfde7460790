// Package testwait is the test suite's one way to wait for a condition: poll
// it until it holds, and fail the test with what it waited for once a
// deadline passes. Tests wait on conditions, never on fixed sleeps, so a
// loaded machine only makes them slower.
package testwait

import (
	"testing"
	"time"
)

// maxPause is the longest pause between two polls: short enough that a
// test does not outwait its condition by much, long enough that a
// condition that scrapes an HTTP endpoint does not hammer it.
const maxPause = 10 * time.Millisecond

// For polls cond until it holds, failing tb with what it waited for when
// timeout passes first. The pauses between polls start at a millisecond
// and double up to maxPause, so a condition that is nearly met costs
// little time and one that takes seconds costs few polls.
func For(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, maxPause)
	}
}
