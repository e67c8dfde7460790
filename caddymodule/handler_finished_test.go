package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/fleet"
)

// TestAdmissionFinishedFreesSlotBeforeNextPoll: with a long poll_interval
// (5s) and max_inflight 1, a streaming request through the gateway occupies
// the engine and a second request parks. When the occupant ends, the parked
// request is admitted from the gateway's own accounting — it saw the
// occupant, which the last scrape counted, finish — long before the next
// poll: within 2.5s of the end while the next poll is at least 4s away, and
// with the gateway's last scrape still the one that counted the occupant.
// Without the accounting it would wait for that poll.
func TestAdmissionFinishedFreesSlotBeforeNextPoll(t *testing.T) {
	const (
		poll  = 5 * time.Second
		bound = 2500 * time.Millisecond
	)
	e := slowEngine(t)
	gateway{
		engines:   noKVEngines(e),
		appExtra:  "\t\tpoll_interval 5s\n",
		admission: "\t\tmax_inflight 1\n\t\tmax_park 30s\n",
	}.load(t)
	testwait.For(t, 15*time.Second, "engine gauges known", func() bool { return getEngineReport(t, e.Addr()).Known })

	occ, endOccupant := openOccupant(t)
	occ.next(t, 10*time.Second) // streaming from the engine
	if st := e.Stats(); st.Running+st.Waiting != 1 {
		t.Fatalf("engine stats with the occupant: %+v", st)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	parked := sendAsync(ctx, "", chatBody(false, "parked behind the occupant"), nil)
	waitQueueDepth(t, "normal", 1)

	scrapedAt, endedAt := endAfterScrape(t, e.Addr(), poll, func() {
		if d := queueDepth(t, "normal"); d != 1 {
			t.Fatalf("parked request left the queue before the occupant ended (depth %d)", d)
		}
		endOccupant()
	})

	// Up to past the next poll, to tell which came first.
	w := newWait(t, time.Until(endedAt.Add(2*poll)), "the parked request admitted after the occupant ended").pace(2 * time.Millisecond)
	for queueDepth(t, "normal") != 0 {
		w.tick(lazy(func() string { return fmt.Sprintf("engine %+v", getEngineReport(t, e.Addr())) }))
	}
	admittedAt := time.Now()
	r := getEngineReport(t, e.Addr())
	took := admittedAt.Sub(endedAt)
	t.Logf("occupant ended -> parked request admitted: %v (poll_interval %v, next poll due in %v at the end)",
		took, poll, scrapedAt.Add(poll).Sub(endedAt).Round(time.Millisecond))
	if !r.ScrapedAt.Equal(scrapedAt) {
		t.Errorf("a poll (at %v, %v after the one that counted the occupant) came before the admission: the wakeup was the poll's",
			r.ScrapedAt, r.ScrapedAt.Sub(scrapedAt))
	}
	if took > bound {
		t.Errorf("parked request admitted %v after the occupant ended; want within %v", took, bound)
	}
	if res := waitReply(t, parked, 30*time.Second); res.err != nil || res.status != http.StatusOK {
		t.Fatalf("parked request: %d %v %s", res.status, res.err, res.body)
	}
}

// TestPolicyFinishedNotSaturatedBeforeNextPoll: lb_policy llm (without
// llm_admission) sees the slot of a request the last scrape counted free as
// soon as the request ends, as admission does: the engine, at its
// max_inflight of 1 while the request runs, is no longer excluded as
// saturated, well before the next poll.
func TestPolicyFinishedNotSaturatedBeforeNextPoll(t *testing.T) {
	const poll = 5 * time.Second
	e := slowEngine(t)
	gateway{
		engines:     noKVEngines(e),
		appExtra:    "\t\tpoll_interval 5s\n",
		engineExtra: "\t\t\tmax_inflight 1\n",
		admission:   "-",
	}.load(t)
	testwait.For(t, 15*time.Second, "engine gauges known", func() bool { return getEngineReport(t, e.Addr()).Known })

	occ, endOccupant := openOccupant(t)
	occ.next(t, 10*time.Second)

	explain := func(step, wantExcluded string) {
		t.Helper()
		var ex explainReply
		if code := adminJSON(t, http.MethodPost, "/llm/explain", chatBody(false, "where would this go?"), &ex); code != http.StatusOK {
			t.Fatalf("%s: /llm/explain: %d", step, code)
		}
		if len(ex.Candidates) != 1 || ex.Candidates[0].Excluded != wantExcluded {
			t.Fatalf("%s: candidates %+v, want excluded %q", step, ex.Candidates, wantExcluded)
		}
	}
	scrapedAt, _ := endAfterScrape(t, e.Addr(), poll, func() {
		explain("occupant running and scraped", "saturated")
		endOccupant()
	})
	testwait.For(t, poll/2, "the occupant's reservation released", func() bool {
		return getEngineReport(t, e.Addr()).Inflight == 0
	})
	explain("occupant ended", "")
	if r := getEngineReport(t, e.Addr()); !r.ScrapedAt.Equal(scrapedAt) {
		t.Fatalf("a poll came in between (%v after the one that counted the occupant): the test proves nothing", r.ScrapedAt.Sub(scrapedAt))
	}
}

// endAfterScrape waits for a scrape of dial that counts exactly one request
// running and none dispatched, then calls end, so that the next poll is a
// whole poll_interval away; should the machine be too slow to call end
// within 1s of a scrape, it waits for the next one (3 tries). It returns the
// scrape's time and when end was called.
func endAfterScrape(t *testing.T, dial string, poll time.Duration, end func()) (scrapedAt, endedAt time.Time) {
	t.Helper()
	for range 3 {
		prev := getEngineReport(t, dial).ScrapedAt
		var r fleet.EngineReport
		testwait.For(t, 2*poll, "a fresh scrape", func() bool {
			r = getEngineReport(t, dial)
			return r.ScrapedAt.After(prev)
		})
		if r.Running != 1 || r.Dispatched != 0 {
			t.Fatalf("scrape did not count the occupant as running: %+v", r)
		}
		if time.Since(r.ScrapedAt) < time.Second {
			end()
			return r.ScrapedAt, time.Now()
		}
	}
	t.Fatal("could not end the occupant within 1s of a scrape in 3 tries")
	return
}

// openOccupant opens a long streaming request through the gateway; end
// makes its client leave. The stream is drained when the test ends, so its
// reader does not outlive the test.
func openOccupant(t *testing.T) (occ *sseStream, end context.CancelFunc) {
	t.Helper()
	ctx, end := context.WithCancel(context.Background())
	occ = openStream(t, ctx, chat{user: "occupant", maxTokens: 20000, stream: true, usage: true}.body(), nil)
	t.Cleanup(func() {
		end()
		for range occ.lines {
		}
	})
	if occ.res.StatusCode != http.StatusOK {
		t.Fatalf("occupant: %d", occ.res.StatusCode)
	}
	return occ, end
}
