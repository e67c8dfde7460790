package upstreams

import (
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
)

// TestOccupy: a long prefill's hold shows in Load.Occupied until its
// expected end, moves with its reservation and ends with it.
func TestOccupy(t *testing.T) {
	clk := testclock.New(time.Unix(1_000_000, 0))
	r := NewRegistry(Options{ManualScrape: true, Now: clk.Now})
	defer r.Close()
	a, b := r.Ensure("127.0.0.1:1"), r.Ensure("127.0.0.1:2")
	occupied := func(e *Engine) time.Duration { return e.Load().Occupied }

	res := a.Reserve()
	res.Occupy(0) // not long: no hold
	if d := occupied(a); d != 0 {
		t.Fatalf("Occupy(0): occupied %v", d)
	}
	res.Occupy(2 * time.Second)
	other := a.Reserve()
	other.Occupy(time.Second)
	if d := occupied(a); d != 2*time.Second {
		t.Fatalf("occupied %v, want the longest hold, 2s", d)
	}
	clk.Advance(1500 * time.Millisecond)
	if d := occupied(a); d != 500*time.Millisecond {
		t.Fatalf("after 1.5s: occupied %v, want 500ms (the 1s hold has ended)", d)
	}
	res.Move(b)
	if da, db := occupied(a), occupied(b); da != 0 || db != 500*time.Millisecond {
		t.Fatalf("after Move: occupied %v on the old engine and %v on the new, want 0 and 500ms", da, db)
	}
	res.Done()
	if d := occupied(b); d != 0 {
		t.Fatalf("after Done: occupied %v", d)
	}
	res.Occupy(time.Second) // after Done: no-op
	if d := occupied(b); d != 0 {
		t.Fatalf("Occupy after Done: occupied %v", d)
	}
	third := a.Reserve()
	third.Occupy(time.Hour)
	third.Prefilled() // its first token came: the hold ends at once
	if d := occupied(a); d != 0 {
		t.Fatalf("after Prefilled: occupied %v", d)
	}
	third.Done()
	var none *Reservation
	none.Prefilled() // no reservation: no-op
	other.Done()
	if len(a.occupied) != 0 || len(b.occupied) != 0 {
		t.Fatalf("holds left: %v %v", a.occupied, b.occupied)
	}
}
