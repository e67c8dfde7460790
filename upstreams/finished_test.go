package upstreams

import (
	"math"
	"testing"
)

// finishedEngine is an engine behind a fake /metrics page with the given
// admission limit, for the Finished accounting tests.
func finishedEngine(t *testing.T, r *Registry, maxInflight int) (*fakeEngine, *Engine) {
	t.Helper()
	f := newFakeEngine(t)
	e := r.Ensure(f.dial())
	e.mu.Lock()
	e.cfg.MaxInflight = maxInflight
	e.mu.Unlock()
	return f, e
}

// checkLoad fails the test unless the engine's Dispatched, Finished and
// Free(0.9) are as given.
func checkLoad(t *testing.T, step string, e *Engine, dispatched, finished int64, free int) {
	t.Helper()
	l := e.Load()
	gotFree, known := e.Free(0.9)
	if l.Dispatched != dispatched || l.Finished != finished || gotFree != free || !known {
		t.Fatalf("%s: dispatched=%d finished=%d free=%d known=%v, want %d/%d/%d/true",
			step, l.Dispatched, l.Finished, gotFree, known, dispatched, finished, free)
	}
}

// TestFinishedFreesSlotBeforeNextScrape: a request the last scrape counted
// gives its slot back the moment it is Done; the next successful scrape,
// whose gauges no longer show it, resets the count, a failed one does not.
func TestFinishedFreesSlotBeforeNextScrape(t *testing.T) {
	r := NewRegistry(Options{})
	defer r.Close()
	f, e := finishedEngine(t, r, 4)

	// Two requests of ours run, one other client's waits: 3 of 4 used.
	f.set(2, 1, 0.1)
	r1, r2 := e.Reserve(), e.Reserve()
	r1.Sent()
	r2.Sent()
	pollOnceT(e)
	checkLoad(t, "scraped", e, 0, 0, 1)

	r1.Done()
	checkLoad(t, "counted request done", e, 0, 1, 2)
	r1.Done()
	checkLoad(t, "done twice", e, 0, 1, 2)
	if run, wait := e.Load().Estimated(); run != 2 || wait != 0 {
		t.Fatalf("Estimated = %v running, %v waiting; the waiting request takes the slot: want 2, 0", run, wait)
	}

	// A failed scrape says nothing new: the finish still counts.
	f.setMode(mode500)
	pollOnceT(e)
	checkLoad(t, "failed scrape", e, 0, 1, 2)
	f.setMode(modeOK)

	// The engine has let r1 go and started the waiting request.
	f.set(2, 0, 0.1)
	pollOnceT(e)
	checkLoad(t, "newer scrape resets", e, 0, 0, 2)

	r2.Done()
	checkLoad(t, "second counted request done", e, 0, 1, 3)
}

// TestFinishedOnlyWhatTheScrapeSaw: requests the last successful scrape
// could not show (sent after it started, never sent, moved away) do not
// count as finished.
func TestFinishedOnlyWhatTheScrapeSaw(t *testing.T) {
	r := NewRegistry(Options{})
	defer r.Close()
	f, a := finishedEngine(t, r, 4)
	g, b := finishedEngine(t, r, 4)
	f.set(1, 0, 0.1)
	g.set(0, 0, 0.1)
	pollOnceT(a)
	pollOnceT(b)

	// Sent after the scrape: dispatched, and its end just undoes that.
	late := a.Reserve()
	late.Sent()
	checkLoad(t, "sent after the scrape", a, 1, 0, 2)
	late.Done()
	checkLoad(t, "done after the scrape", a, 0, 0, 3)

	// Admitted and counted by a scrape, but never handed to the engine
	// (refused after admission): the engine never had it.
	unsent := a.Reserve()
	pollOnceT(a)
	unsent.Done()
	checkLoad(t, "never sent", a, 0, 0, 3)

	// Moved before it was sent: the old engine never had it; on the new
	// one it is dispatched.
	moved := a.Reserve()
	pollOnceT(a)
	moved.Move(b)
	checkLoad(t, "moved unsent, from", a, 0, 0, 3)
	checkLoad(t, "moved unsent, to", b, 1, 0, 3)

	// Sent to b, counted by b's scrape, then moved back to a (a retry
	// elsewhere): neither engine counts a finish for the move, and on a
	// the request is not sent yet.
	moved.Sent()
	g.set(1, 0, 0.1)
	pollOnceT(b)
	checkLoad(t, "sent and scraped on b", b, 0, 0, 3)
	moved.Move(a)
	checkLoad(t, "moved sent, from", b, 0, 0, 3)
	checkLoad(t, "moved sent, to", a, 1, 0, 2)
	pollOnceT(a) // counts it as at a's engine, but it was never sent there
	moved.Done()
	checkLoad(t, "moved, done unsent", a, 0, 0, 3)

	// Sent while a scrape is in flight: that scrape may not show it, so it
	// stays dispatched, and its end is no finish.
	f.mu.Lock()
	f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 1)
	f.mu.Unlock()
	done := make(chan struct{})
	go func() { defer close(done); pollOnceT(a) }()
	<-f.arrived
	during := a.Reserve()
	during.Sent()
	close(f.gate)
	<-done
	checkLoad(t, "sent during the scrape", a, 1, 0, 2)
	during.Done()
	checkLoad(t, "sent during the scrape, done", a, 0, 0, 3)
}

// TestFinishedDuringScrapeCountedByNeither: a counted request that ends
// while a scrape is in flight may or may not be in that scrape's gauges;
// the count takes the safe side and drops it when the scrape succeeds (the
// slot shows busy until the scrape after).
func TestFinishedDuringScrapeCountedByNeither(t *testing.T) {
	r := NewRegistry(Options{})
	defer r.Close()
	f, e := finishedEngine(t, r, 2)
	f.set(1, 0, 0.1)
	res := e.Reserve()
	res.Sent()
	pollOnceT(e)
	checkLoad(t, "scraped", e, 0, 0, 1)

	f.mu.Lock()
	f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 1)
	f.mu.Unlock()
	done := make(chan struct{})
	go func() { defer close(done); pollOnceT(e) }()
	<-f.arrived
	res.Done()
	checkLoad(t, "done during the scrape", e, 0, 1, 2)
	close(f.gate) // the page still shows it running
	<-done
	checkLoad(t, "the racing scrape succeeded", e, 0, 0, 1)
}

// TestFinishedNeverNegative: more finishes than the gauges show (another
// client's requests ended too, or the engine dropped ours early) floor the
// estimate at an idle engine.
func TestFinishedNeverNegative(t *testing.T) {
	r := NewRegistry(Options{})
	defer r.Close()
	f, e := finishedEngine(t, r, 3)
	f.set(1, 0, 0.1)
	rs := []*Reservation{e.Reserve(), e.Reserve(), e.Reserve()}
	for _, res := range rs {
		res.Sent()
	}
	pollOnceT(e)
	for _, res := range rs {
		res.Done()
	}
	checkLoad(t, "three done, one was running", e, 0, 3, 3)
	if run, wait := e.Load().Estimated(); run != 0 || wait != 0 {
		t.Fatalf("Estimated = %v, %v; want 0, 0", run, wait)
	}
}

func TestLoadEstimated(t *testing.T) {
	tests := []struct {
		name                   string
		running, waiting       float64
		finished               int64
		wantRunning, wantWaits float64
	}{
		{"none finished", 3, 2, 0, 3, 2},
		{"waiting first", 3, 2, 1, 3, 1},
		{"waiting exhausted, then running", 3, 2, 4, 1, 0},
		{"more than all", 3, 2, 9, 0, 0},
		{"nothing waiting", 3, 0, 2, 1, 0},
		{"negative finished ignored", 3, 2, -5, 3, 2},
		{"NaN gauges count as 0", math.NaN(), math.NaN(), 1, 0, 0},
		{"negative gauges count as 0", -1, -1, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run, wait := Load{Running: tc.running, Waiting: tc.waiting, Finished: tc.finished}.Estimated()
			if run != tc.wantRunning || wait != tc.wantWaits {
				t.Fatalf("Estimated = %v, %v; want %v, %v", run, wait, tc.wantRunning, tc.wantWaits)
			}
		})
	}
}
