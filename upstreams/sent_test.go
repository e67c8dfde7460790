package upstreams

import (
	"testing"
	"time"
)

// TestSentRestampsReservation: a request reserved before a scrape started
// but handed to the engine only after it (routing, dialing, a parked
// request's goroutine waiting to run) is not in that scrape's gauges: it
// stays dispatched through any scrape until Sent, and from then on until
// a scrape that started after Sent succeeds.
func TestSentRestampsReservation(t *testing.T) {
	f := newFakeEngine(t)
	f.set(0, 0, 0.1)
	r := NewRegistry(Options{})
	defer r.Close()
	e := r.Ensure(f.dial())
	check := func(step string, inflight, dispatched int64) {
		t.Helper()
		if l := e.Load(); l.Inflight != inflight || l.Dispatched != dispatched {
			t.Fatalf("%s: inflight=%d dispatched=%d, want %d/%d", step, l.Inflight, l.Dispatched, inflight, dispatched)
		}
	}
	res := e.Reserve()
	check("reserved", 1, 1)
	pollOnceT(e) // started before the request reached the engine
	check("scraped without Sent", 1, 1)
	pollOnceT(e)
	check("scraped twice without Sent", 1, 1)
	res.Sent()
	check("sent after the scrapes", 1, 1)
	res.Sent()
	check("sent twice", 1, 1)
	pollOnceT(e) // started after Sent: its gauges would show the request
	check("scraped after Sent", 1, 0)

	other := e.Reserve()
	other.Sent() // same epoch: still counted once
	check("reserve and send between scrapes", 2, 1)
	other.Done()
	check("done", 1, 0)
	other.Sent()
	check("sent after done", 1, 0)
	res.Done()
	check("all done", 0, 0)
}

// TestSentJustBeforeScrapeStaysDispatched: an engine shows a request in its
// gauges only some time after it arrives, so the poller begins each
// scrape's epoch before the scrape starts. A request sent in between is
// not taken as in that scrape's gauges: it stays dispatched, and when it
// ends it frees no slot (which would be another client's). One sent before
// the epoch began is in the gauges and frees its slot the moment it ends.
func TestSentJustBeforeScrapeStaysDispatched(t *testing.T) {
	f := newFakeEngine(t)
	f.set(2, 0, 0.1) // our early request and another client's
	o := fastOpts()
	r := NewRegistry(o)
	defer r.Close()
	marks, resume, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(stop) // before Close: the poller may wait in the hook
	r.onMark = func(string) {
		select {
		case marks <- struct{}{}:
			select {
			case <-resume:
			case <-stop:
			}
		case <-stop:
		}
	}
	r.Apply([]EngineConfig{{Dial: f.dial(), MaxInflight: 4}}, o)
	e, _ := r.Get(f.dial())
	next := func() { <-marks }

	next() // before the first scrape
	resume <- struct{}{}
	early := e.Reserve()
	early.Sent()
	next() // the first scrape is recorded; the second's epoch just began
	late := e.Reserve()
	late.Sent()
	resume <- struct{}{}
	next() // the second scrape is recorded
	checkLoad(t, "after the scrape", e, 1, 0, 1)
	early.Done()
	checkLoad(t, "early request done", e, 1, 1, 2)
	late.Done()
	checkLoad(t, "late request done", e, 0, 1, 3)
}

// TestMarkLead: a scrape's epoch begins gaugeLag before it, or a quarter of
// the interval when that is shorter.
func TestMarkLead(t *testing.T) {
	for _, tc := range []struct{ interval, want time.Duration }{
		{2 * time.Second, 100 * time.Millisecond},
		{400 * time.Millisecond, 100 * time.Millisecond},
		{50 * time.Millisecond, 12500 * time.Microsecond},
	} {
		if got := markLead(tc.interval); got != tc.want {
			t.Errorf("markLead(%v) = %v, want %v", tc.interval, got, tc.want)
		}
	}
}
