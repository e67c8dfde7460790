package upstreams

import (
	"math"
	"time"
)

// drainTau is the time constant of the drain-rate estimator: completions
// older than a few tau no longer count.
const drainTau = 10 * time.Second

// drainMinWindow is the shortest span the drain rate is taken over: the
// first completions of a burst, a few milliseconds after its first
// request, say little about how fast the engine lets requests go, and
// over their own span would read as thousands per second.
const drainMinWindow = time.Second

// drainEstimator is an engine's completion rate, in requests per second:
// its completions through this gateway, each decaying with time constant
// drainTau, over the time it has watched them. A plain decaying average
// (the count over tau) starts at zero and reaches the rate only after a
// few tau, so for the first tens of seconds of traffic (after a start or
// a long idle spell) it read an engine as draining a third as fast as it
// did: the quality bench's parked requests were predicted twice the wait
// for a batch slot they had. Dividing by the watched span's weight,
// tau × (1 − e^(−span/tau)), reads the rate of the traffic seen so far
// and is the plain average once the span is long.
//
// The watch starts at the engine's first request and starts again at a
// request that finds the engine idle with its last completion more than
// drainIdle ago: the spell's completions have faded, and the rate starts
// over unknown rather than near zero.
type drainEstimator struct {
	sum  float64   // Σ e^(−(at−t)/tau) over the completions t, as of at
	at   time.Time // the latest completion; zero: none in this watch
	from time.Time // when this watch began; zero: not begun
}

// drainIdle is how long without a completion ends a watch (see
// drainEstimator): by then the completions before count for under 5%.
const drainIdle = 3 * drainTau

// begin notes a request sent to the engine, idle telling whether none
// was in flight there.
func (d *drainEstimator) begin(now time.Time, idle bool) {
	switch {
	case d.from.IsZero():
		d.from = now
	case idle && !d.at.IsZero() && now.Sub(d.at) > drainIdle:
		*d = drainEstimator{from: now}
	}
}

// done counts a completion.
func (d *drainEstimator) done(now time.Time) {
	d.begin(now, false) // a completion without a request begun: watch from it
	d.sum = d.decayed(now) + 1
	d.at = now
}

// decayed is the sum as of now.
func (d *drainEstimator) decayed(now time.Time) float64 {
	if d.at.IsZero() {
		return 0
	}
	if dt := now.Sub(d.at); dt > 0 {
		return d.sum * math.Exp(-float64(dt)/float64(drainTau))
	}
	return d.sum
}

// rate is the completion rate as of now; 0 before the watch's first
// completion.
func (d *drainEstimator) rate(now time.Time) float64 {
	if d.at.IsZero() {
		return 0
	}
	span := max(now.Sub(d.from), drainMinWindow)
	return d.decayed(now) / (drainTau.Seconds() * -math.Expm1(-float64(span)/float64(drainTau)))
}

// sinceDone is how long ago the watch's latest completion was; 0 when
// there was none.
func (d *drainEstimator) sinceDone(now time.Time) time.Duration {
	if d.at.IsZero() {
		return 0
	}
	return now.Sub(d.at)
}
