package upstreams

import (
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
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
// scrape's epoch at least markLead before the scrape starts. A request
// sent in between is not taken as in that scrape's gauges: it stays
// dispatched, and when it ends it frees no slot (which would be another
// client's). One sent before the epoch began is in the gauges and frees
// its slot the moment it ends. A new engine's first scrape, taken at once,
// begins no epoch: a request sent before it stays dispatched through it.
func TestSentJustBeforeScrapeStaysDispatched(t *testing.T) {
	f := newFakeEngine(t)
	f.set(2, 0, 0.1) // our early request and another client's
	o := fastOpts()
	o.PollInterval = 200 * time.Millisecond
	lead := markLead(o.PollInterval, 0, false) // the fake engine exports no step time
	r := NewRegistry(o)
	defer r.Close()
	marks, resume, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(stop)       // before Close: the poller may wait in the hook
	var resumed []time.Time // when each mark's hook returned
	r.onMark = func(string) {
		select {
		case marks <- struct{}{}:
			select {
			case <-resume:
			case <-stop:
			}
		case <-stop:
		}
		resumed = append(resumed, time.Now()) // read by the test only while the poller waits in the hook
	}
	// Sent before the engine's poller runs: a request routed to an engine
	// just added.
	e := r.Ensure(f.dial())
	early := e.Reserve()
	early.Sent()
	r.Apply([]EngineConfig{{Dial: f.dial(), MaxInflight: 4}}, o)
	// mark waits for the poller's next mark, which must come after exactly
	// that many scrapes: the first at once, each later one started at least
	// lead after the hook of the mark before it returned.
	mark := func(scrapes int) {
		t.Helper()
		select {
		case <-marks:
		case <-time.After(30 * time.Second):
			t.Fatalf("no mark after %d scrapes", scrapes)
		}
		for i := range scrapes {
			at, ok := f.arrival(i)
			if !ok {
				t.Fatalf("mark before scrape %d", i+1)
			}
			if i == 0 {
				continue
			}
			if gap := at.Sub(resumed[i-1]); gap < lead {
				t.Fatalf("scrape %d started %v after its epoch began, want at least %v", i+1, gap, lead)
			}
		}
		if _, ok := f.arrival(scrapes); ok {
			t.Fatalf("more than %d scrapes before this mark", scrapes)
		}
	}

	mark(1) // the first scrape is recorded; the second's epoch began
	checkLoad(t, "after the first scrape", e, 1, 0, 1)
	late := e.Reserve()
	late.Sent()
	resume <- struct{}{}
	mark(2) // the second scrape is recorded
	checkLoad(t, "after the second scrape", e, 1, 0, 1)
	early.Done()
	checkLoad(t, "early request done", e, 1, 1, 2)
	late.Done()
	checkLoad(t, "late request done", e, 0, 1, 3)

	// A scrape overdue after a slow one also starts lead after its mark:
	// the third scrape is held past the interval.
	gate := make(chan struct{})
	f.mu.Lock()
	f.gate = gate
	f.mu.Unlock()
	resume <- struct{}{}
	testwait.For(t, 15*time.Second, "the third scrape", func() bool { _, ok := f.arrival(2); return ok })
	<-time.After(o.PollInterval * 3 / 2)
	f.mu.Lock()
	f.gate = nil
	f.mu.Unlock()
	close(gate)
	mark(3) // the fourth scrape, overdue, has its epoch
	resume <- struct{}{}
	mark(4)
}

// TestMarkLead: a scrape's epoch begins two engine steps plus apiLag before
// it when the step time is known, else gaugeLag; never more than a
// quarter of the interval.
func TestMarkLead(t *testing.T) {
	for _, tc := range []struct {
		interval, step time.Duration
		known          bool
		want           time.Duration
	}{
		{2 * time.Second, 0, false, 100 * time.Millisecond},
		{400 * time.Millisecond, 0, false, 100 * time.Millisecond},
		{50 * time.Millisecond, 0, false, 12500 * time.Microsecond},
		{2 * time.Second, 20 * time.Millisecond, true, 45 * time.Millisecond},
		{2 * time.Second, 0, true, 5 * time.Millisecond},
		{2 * time.Second, 200 * time.Millisecond, true, 405 * time.Millisecond},
		{400 * time.Millisecond, 200 * time.Millisecond, true, 100 * time.Millisecond},
	} {
		if got := markLead(tc.interval, tc.step, tc.known); got != tc.want {
			t.Errorf("markLead(%v, %v, %v) = %v, want %v", tc.interval, tc.step, tc.known, got, tc.want)
		}
	}
}

// TestLeadFollowsStepTime: once the engine's inter-token latency gives its
// step time, the poller begins each scrape's epoch two steps plus apiLag
// before it (here longer than the default gaugeLag, so a poller still
// using the default fails), and Load reports both. A timer never fires
// early, so the lower bound cannot flake.
func TestLeadFollowsStepTime(t *testing.T) {
	f := newFakeEngine(t)
	f.set(1, 0, 0.1)
	f.setITL(5, 100)
	o := fastOpts()
	o.PollInterval = 1200 * time.Millisecond
	r := NewRegistry(o)
	defer r.Close()
	var mu sync.Mutex
	var marks []time.Time
	r.onMark = func(string) {
		mu.Lock()
		marks = append(marks, time.Now())
		mu.Unlock()
	}
	r.Apply([]EngineConfig{{Dial: f.dial()}}, o)
	e, ok := r.Get(f.dial())
	if !ok {
		t.Fatal("engine not registered")
	}
	testwait.For(t, 15*time.Second, "the first scrape", func() bool { return e.Load().Known })
	if l := e.Load(); l.StepTime != 0 || l.ScrapeLead != gaugeLag {
		t.Fatalf("before a second scrape: step %v lead %v, want 0 and %v", l.StepTime, l.ScrapeLead, gaugeLag)
	}
	f.setITL(5+100*0.1, 200) // 100 gaps of 100 ms since the first scrape
	testwait.For(t, 15*time.Second, "the third scrape", func() bool { _, ok := f.arrival(2); return ok })
	const want = 2*100*time.Millisecond + apiLag
	if l := e.Load(); l.StepTime != 100*time.Millisecond || l.ScrapeLead != want {
		t.Fatalf("step %v lead %v, want 100ms and %v", l.StepTime, l.ScrapeLead, want)
	}
	at, _ := f.arrival(2)
	mu.Lock()
	mark := marks[1] // the first scrape, of a new engine, begins no epoch
	mu.Unlock()
	if gap := at.Sub(mark); gap < want {
		t.Fatalf("third scrape started %v after its epoch began, want at least %v", gap, want)
	}
}
