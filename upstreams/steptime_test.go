package upstreams

import (
	"testing"
	"time"
)

// TestStepEstimator: the step time is Δsum/Δcount of the inter-token
// histogram between scrapes, smoothed by how many gaps a window holds; a
// window without a gap stays open, and a counter going down (a restart)
// starts over without a sample.
func TestStepEstimator(t *testing.T) {
	var s stepEstimator
	t0 := time.Now()
	want := func(what string, d time.Duration, ok bool) {
		t.Helper()
		got, gotOK := s.estimate()
		if gotOK != ok || (ok && (got < d-time.Microsecond || got > d+time.Microsecond)) {
			t.Fatalf("%s: estimate %v %v, want %v %v", what, got, gotOK, d, ok)
		}
	}
	want("empty", 0, false)
	s.observe(stepSample{secs: 10, count: 100}, t0)
	want("first sample only sets the base", 0, false)
	s.observe(stepSample{secs: 10, count: 100}, t0)
	want("no new gaps", 0, false)
	s.observe(stepSample{secs: 10.02, count: 100.5}, t0)
	want("under one gap keeps the window open", 0, false)
	s.observe(stepSample{secs: 10.04, count: 101}, t0)
	want("first window", 40*time.Millisecond, true)
	// A window of 1000 gaps replaces the estimate (weight 1-e^-15.6).
	s.observe(stepSample{secs: 30.04, count: 1101}, t0)
	want("large window", 20*time.Millisecond, true)
	// One gap of 84 ms moves it 1-e^(-1/64) ≈ 1.55% of the way.
	s.observe(stepSample{secs: 30.124, count: 1102}, t0)
	want("small window", 20*time.Millisecond+time.Duration(0.0155035*64e6), true)
	s.observe(stepSample{secs: 1, count: 10}, t0)
	want("restart keeps the estimate", 20*time.Millisecond+time.Duration(0.0155035*64e6), true)
	s.observe(stepSample{secs: 1.5, count: 10 + 1e6}, t0)
	want("after a restart, from the new base", 500*time.Nanosecond, true)
}

// TestStepEstimatorStreamsFirst: the gateway's own stream measurements set
// the step; while one is under streamPrecedence old the engine's histogram
// only moves its window base, and after that it counts again.
func TestStepEstimatorStreamsFirst(t *testing.T) {
	var s stepEstimator
	t0 := time.Now()
	s.observe(stepSample{secs: 1, count: 10}, t0)
	s.observeStream(0, 0, t0) // no gaps: no sample
	if _, ok := s.estimate(); ok {
		t.Fatal("a stream without gaps set the estimate")
	}
	s.observeStream(400*time.Millisecond, 100, t0) // 4 ms steps, wall time
	// The engine's histogram, on another clock, says 20 ms: ignored.
	s.observe(stepSample{secs: 1 + 1000*0.02, count: 1010}, t0.Add(streamPrecedence-time.Second))
	if got, _ := s.estimate(); got != 4*time.Millisecond {
		t.Fatalf("estimate %v while streams are fresh, want 4ms", got)
	}
	// Later the histogram counts, from the base the ignored scrape left.
	s.observe(stepSample{secs: 21 + 1000*0.02, count: 2010}, t0.Add(streamPrecedence))
	if got, _ := s.estimate(); got < 19*time.Millisecond || got > 20*time.Millisecond {
		t.Fatalf("estimate %v once streams are old, want about 20ms", got)
	}
}
