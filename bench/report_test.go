package main

import (
	"math"
	"testing"
)

func TestCPUVsPlain(t *testing.T) {
	for _, tc := range []struct {
		name          string
		target, plain []float64
		want          roundStats
		ok            bool
	}{
		{name: "odd rounds", target: []float64{300, 200, 330}, plain: []float64{200, 200, 300},
			want: roundStats{median: 1.1, lo: 1, hi: 1.5, n: 3}, ok: true},
		{name: "even rounds average the middle two", target: []float64{120, 150, 130, 200}, plain: []float64{100, 100, 100, 100},
			want: roundStats{median: 1.4, lo: 1.2, hi: 2, n: 4}, ok: true},
		// A phase that served nothing (0) pairs with no other; rounds
		// only one of them ran are left out.
		{name: "empty phases skipped", target: []float64{0, 300, 400}, plain: []float64{100, 0, 200},
			want: roundStats{median: 2, lo: 2, hi: 2, n: 1}, ok: true},
		{name: "no common round", target: []float64{300}, plain: nil, ok: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := cpuVsPlain(&OverheadStat{CPURounds: tc.target}, &OverheadStat{CPURounds: tc.plain})
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
			if ok && (!near(got.median, tc.want.median) || !near(got.lo, tc.want.lo) || !near(got.hi, tc.want.hi) || got.n != tc.want.n) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAddedP50VsPlain(t *testing.T) {
	// Seconds in, milliseconds out; a round where plain served nothing is
	// left out.
	got, ok := addedP50VsPlain(&OverheadStat{P50Rounds: []float64{0.006, 0.005, 0.009}}, &OverheadStat{P50Rounds: []float64{0.004, 0, 0.0045}})
	want := roundStats{median: 3.25, lo: 2, hi: 4.5, n: 2}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !ok || !near(got.median, want.median) || !near(got.lo, want.lo) || !near(got.hi, want.hi) || got.n != want.n {
		t.Fatalf("got %+v (%v), want %+v", got, ok, want)
	}
	if s := got.millis(); s != "+3.25 ms (+2.00 to +4.50, 2 rounds)" {
		t.Fatalf("written as %q", s)
	}
}
