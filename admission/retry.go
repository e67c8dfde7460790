package admission

import (
	"math"
	"time"
)

// RetryAfter returns how long a refused client should wait before retrying:
// position/drainRate seconds (the time for the requests ahead of it to be
// admitted at the recent rate), rounded up to whole seconds and clamped to
// [lo, hi]. The result is a whole number of seconds and never below 1s, as
// the Retry-After header counts seconds. hi <= 0 means no upper bound; lo
// and hi are rounded up to whole seconds; if hi < lo, hi wins.
//
// With no known rate (drainRate <= 0 or NaN) the queue is not draining, so
// the answer is hi, or lo when there is no upper bound. A position below 1
// counts as 1.
func RetryAfter(position int, drainRate float64, lo, hi time.Duration) time.Duration {
	loS, hiS := ceilSeconds(lo), ceilSeconds(hi)
	var secs float64
	if drainRate > 0 { // false for NaN too
		secs = math.Ceil(float64(max(position, 1)) / drainRate)
	} else if hiS > 0 {
		secs = float64(hiS)
	}
	secs = max(secs, float64(loS), 1)
	if hiS > 0 {
		secs = min(secs, float64(hiS))
	}
	// Bound before converting so a tiny rate cannot overflow Duration.
	const maxSecs = float64(math.MaxInt64 / int64(time.Second))
	return time.Duration(min(secs, maxSecs)) * time.Second
}

// ceilSeconds rounds d up to whole seconds; non-positive durations give 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}
