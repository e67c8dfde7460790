package fleet

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

// testClock is a settable clock.
type testClock struct{ t time.Time }

func (c *testClock) now() time.Time { return c.t }

// TestResponseStoreBound: the store keeps the newest max ids; recording
// an id again moves it to the front of the queue, and a dead entry leaves
// without taking the new one with it.
func TestResponseStoreBound(t *testing.T) {
	clock := &testClock{t: time.Unix(1_700_000_000, 0)}
	s := newResponseStore(3, time.Hour, clock.now)
	for i := range 5 {
		s.record(fmt.Sprintf("resp_%d", i), "a:1")
	}
	for i := range 5 {
		_, _, _, ok := s.lookup(fmt.Sprintf("resp_%d", i))
		if ok != (i >= 2) {
			t.Errorf("resp_%d found %v, want %v", i, ok, i >= 2)
		}
	}
	s.record("resp_2", "b:1") // again, elsewhere: the newest now
	s.record("resp_5", "a:1") // pushes out resp_3, the oldest live
	s.record("resp_6", "a:1") // pushes out the dead resp_2 entry, then resp_4
	if dial, _, _, ok := s.lookup("resp_2"); !ok || dial != "b:1" {
		t.Errorf("resp_2: %q, %v; want on b:1", dial, ok)
	}
	for _, id := range []string{"resp_3", "resp_4"} {
		if _, _, _, ok := s.lookup(id); ok {
			t.Errorf("%s still found", id)
		}
	}
	if n := s.len(); n != 3 || len(s.queue) != 3 {
		t.Errorf("%d ids in a queue of %d, want 3 and 3", n, len(s.queue))
	}
	if len(s.dials) != 2 {
		t.Errorf("%d dials kept, want 2", len(s.dials))
	}
}

// TestResponseStoreTTL: an id is forgotten once its TTL has passed, and
// the dials of expired entries with it.
func TestResponseStoreTTL(t *testing.T) {
	clock := &testClock{t: time.Unix(1_700_000_000, 0)}
	s := newResponseStore(100, time.Hour, clock.now)
	s.record("old", "a:1")
	clock.t = clock.t.Add(30 * time.Minute)
	s.record("new", "b:1")
	clock.t = clock.t.Add(30*time.Minute - time.Nanosecond)
	if _, _, _, ok := s.lookup("old"); !ok {
		t.Fatal("forgotten before its TTL")
	}
	clock.t = clock.t.Add(time.Nanosecond)
	if _, _, _, ok := s.lookup("old"); ok {
		t.Fatal("remembered past its TTL")
	}
	if _, _, _, ok := s.lookup("new"); !ok || s.len() != 1 || s.dials["a:1"] != nil {
		t.Fatalf("after the first expired: new found %v, %d ids, dials %v", ok, s.len(), s.dials)
	}
	clock.t = clock.t.Add(time.Hour)
	if s.len() != 1 { // len does not expire; lookups and records do
		t.Fatalf("%d ids", s.len())
	}
	s.lookup("x")
	if s.len() != 0 || len(s.dials) != 0 || len(s.queue) != 0 {
		t.Fatalf("%d ids, %d dials, queue %d after both expired", s.len(), len(s.dials), len(s.queue))
	}
}

// TestPreviousResponse: a recorded id is stored on its engine until the
// engine restarts; ids recorded after a restart are the new process's; an
// id never recorded is unknown. An engine that leaves the registry keeps
// its ids (the caller checks candidates): a discovered engine forgotten
// for idleness may still be running with them.
func TestPreviousResponse(t *testing.T) {
	a, b := deadDials[0], deadDials[1]
	f := manualFleet(t, &EngineConfig{Dial: a}, &EngineConfig{Dial: b})
	f.RecordResponse("resp_a", a)
	f.RecordResponse("resp_b", b)
	check := func(id, wantDial string, want ResponseState) {
		t.Helper()
		if dial, st := f.PreviousResponse(id); dial != wantDial || st != want {
			t.Errorf("PreviousResponse(%q) = %q, %v; want %q, %v", id, dial, st, wantDial, want)
		}
	}
	check("resp_a", a, ResponseStored)
	check("resp_x", "", ResponseUnknown)
	check("", "", ResponseUnknown)

	scrape(f, a, upstreams.Gauges{PromptTokens: 9000, PrefillSeconds: 3})
	scrape(f, a, upstreams.Gauges{PromptTokens: 10, PrefillSeconds: 0.01}) // counters down: restarted
	check("resp_a", "", ResponseGone)
	check("resp_b", b, ResponseStored)
	f.RecordResponse("resp_a2", a)
	check("resp_a2", a, ResponseStored)

	// b leaves the fleet (a config without it, nothing in flight).
	cfg := testConfig(&EngineConfig{Dial: a})
	cfg.IdleTTL = time.Nanosecond
	f.Start(f.NewGeneration(cfg, zap.NewNop()))
	if _, ok := f.registry.Get(b); ok {
		t.Fatal("b is still in the registry")
	}
	check("resp_b", b, ResponseStored)
	check("resp_a2", a, ResponseStored)
}

// TestRoutePin: a pinned query goes to its pin whatever the cache key,
// and to no candidate when the pin is not one; placement leaves it alone.
func TestRoutePin(t *testing.T) {
	f := manualFleet(t, &EngineConfig{Dial: deadDials[0]}, &EngineConfig{Dial: deadDials[1]})
	q := Query{Request: chatRequest(t, nil, "hello"), Dials: deadDials[:2], Settings: DefaultSettings(), CacheKey: "k", Pin: deadDials[1]}
	if d := f.route(t.Context(), q); d.Index != 1 {
		t.Errorf("pinned to %s: index %d", q.Pin, d.Index)
	}
	q.Pin = deadDials[2]
	if d := f.route(t.Context(), q); d.Index != -1 {
		t.Errorf("pinned to a non-candidate: index %d", d.Index)
	}
	if p := f.Place(t.Context(), q); p != nil {
		t.Errorf("a pinned request was placed: %+v", p)
	}
}

// TestSetResponseTTL: the configured TTL applies to the ids already
// recorded, and a non-positive one is the default.
func TestSetResponseTTL(t *testing.T) {
	clock := &testClock{t: time.Unix(1_700_000_000, 0)}
	f := New(zap.NewNop(), Options{ManualScrape: true, Now: clock.now})
	t.Cleanup(f.Close)
	f.RecordResponse("resp_1", deadDials[0])
	clock.t = clock.t.Add(10 * time.Minute)
	f.SetResponseTTL(0)
	if _, st := f.PreviousResponse("resp_1"); st != ResponseStored {
		t.Fatalf("under the default TTL: %v", st)
	}
	f.SetResponseTTL(5 * time.Minute)
	if _, st := f.PreviousResponse("resp_1"); st != ResponseUnknown {
		t.Fatalf("past a shorter TTL: %v", st)
	}
}
