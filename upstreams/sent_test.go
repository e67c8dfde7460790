package upstreams

import "testing"

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
