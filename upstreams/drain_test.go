package upstreams

import (
	"math"
	"testing"
	"time"
)

// TestDrainEstimator: the completion rate reads the traffic seen so far
// from its first seconds on, not a fraction of it that grows over a few
// tau; it is the plain decaying average once the watch is long; a burst's
// first completions read over at least drainMinWindow; and a long idle
// spell starts the rate over unknown.
func TestDrainEstimator(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// steady sends one request at 0 and completes one every 1/r s from
	// first on, up to until, reading the rate at until.
	steady := func(r, first, until float64) float64 {
		var d drainEstimator
		d.begin(at(0), true)
		for s := first; s <= until+1e-9; s += 1 / r {
			d.done(at(s))
		}
		return d.rate(at(until))
	}
	cases := []struct {
		name     string
		got      float64
		min, max float64
	}{
		// A plain decaying average would read 4 × (1 − e^(−0.5)) = 1.6.
		{"5 s of 4/s, from the first request", steady(4, 1, 5), 3.4, 4.6},
		{"60 s of 4/s", steady(4, 1, 60), 3.6, 4.4},
		// 21 completions in the 5 s watched, the last 2 s at 10/s: more
		// than the span's mean, less than the recent rate.
		{"2 s of 10/s after a 3 s first request", steady(10, 3, 5), 21 / 5.0, 10},
		// Read over 1 s, not 1 ms: about 4/s, not 4000/s.
		{"4 completions at once, 1 ms after the first request", func() float64 {
			var d drainEstimator
			d.begin(at(0), true)
			for range 4 {
				d.done(at(0.001))
			}
			return d.rate(at(0.001))
		}(), 4, 4 / (drainTau.Seconds() * -math.Expm1(-1/drainTau.Seconds()))},
	}
	for _, c := range cases {
		if !(c.got >= c.min && c.got <= c.max) {
			t.Errorf("%s: rate %.3f, want %.3f to %.3f", c.name, c.got, c.min, c.max)
		}
	}

	var d drainEstimator
	if d.rate(at(1)) != 0 || d.sinceDone(at(1)) != 0 {
		t.Fatal("a rate before any completion")
	}
	d.begin(at(0), true)
	d.done(at(2))
	if d.rate(at(3)) <= 0 || d.sinceDone(at(3)) != time.Second {
		t.Fatalf("after one completion: rate %v, since %v", d.rate(at(3)), d.sinceDone(at(3)))
	}
	d.begin(at(10), false) // not idle: the watch goes on
	if d.from != at(0) {
		t.Fatal("a busy engine's watch restarted")
	}
	d.begin(at(20), true) // idle, but its completion is recent
	if d.from != at(0) {
		t.Fatal("the watch restarted within drainIdle of a completion")
	}
	idleEnd := at(2).Add(drainIdle + time.Second)
	d.begin(idleEnd, true)
	if d.rate(idleEnd) != 0 || d.sinceDone(idleEnd) != 0 || d.from != idleEnd {
		t.Fatalf("after an idle spell: rate %v since %v from %v, want unknown from %v", d.rate(idleEnd), d.sinceDone(idleEnd), d.from, idleEnd)
	}
}
