package admission

import (
	"testing"
	"time"
)

// engines stands in for a fleet of two engines, "hot" (holding the
// prefixes of the placed requests) and "cold": a placed try takes a slot
// on hot when it prefers hot and hot has one, else (PassAny) any slot.
type engines struct {
	free    map[string]int
	took    []string // engine of each successful try, in order
	prefTry int      // PassPreferred tries
}

func (e *engines) take(name string) bool {
	if e.free[name] > 0 {
		e.free[name]--
		e.took = append(e.took, name)
		return true
	}
	return false
}

// placed is the try of a request whose prefix holder is pref ("" none).
func (e *engines) placed(pref string) PlacedFunc {
	return func(p Pass) bool {
		if p == PassPreferred {
			e.prefTry++
			return pref != "" && e.take(pref)
		}
		if pref != "" && e.take(pref) {
			return true
		}
		return e.take("hot") || e.take("cold")
	}
}

func mustPlace(t *testing.T, g *Gate, b Band, try PlacedFunc) *Waiter {
	t.Helper()
	w, err := g.EnterPlaced(b, try)
	if err != nil {
		t.Fatalf("EnterPlaced(%v): %v", b, err)
	}
	return w
}

// TestKickPrefersHolder: a slot frees on the engine holding the second
// waiter's prefix; that waiter takes it although the head, whose holder
// is elsewhere, is older; the head keeps its turn for the next slot.
func TestKickPrefersHolder(t *testing.T) {
	g, _ := newTestGate(Config{})
	e := &engines{free: map[string]int{}}
	head := mustPlace(t, g, Normal, e.placed("cold"))
	hit := mustPlace(t, g, Normal, e.placed("hot"))
	plain := mustEnter(t, g, Normal, func() bool { return e.take("hot") })
	e.free["hot"] = 1
	if n := g.kick(); n != 1 || !isReady(hit) || isReady(head) || isReady(plain) {
		t.Fatalf("kick admitted %d; hit %v head %v plain %v, want only the hit", n, isReady(hit), isReady(head), isReady(plain))
	}
	if s := g.Stats(); s.Preferred[Normal] != 1 || s.Admitted[Normal] != 1 {
		t.Fatalf("stats preferred %d admitted %d, want 1 and 1", s.Preferred[Normal], s.Admitted[Normal])
	}
	e.free["hot"] = 1 // the head may take it cold: its turn, FIFO
	if n := g.kick(); n != 1 || !isReady(head) || isReady(plain) {
		t.Fatalf("second kick admitted %d; head %v plain %v, want the head", n, isReady(head), isReady(plain))
	}
	if hit.Order() != OrderPreferred || head.Order() != OrderFIFO || plain.Order() != OrderNone {
		t.Fatalf("orders: hit %v, head %v, parked %v; want preferred, fifo, none", hit.Order(), head.Order(), plain.Order())
	}
	e.free["cold"] = 1
	if w := mustEnter(t, g, High, func() bool { return e.take("cold") }); w.Order() != OrderImmediate || w.Order().String() != "immediate" {
		t.Fatalf("a newcomer admitted at once: order %v", w.Order())
	}
}

// TestAgedWaiterIsNeverOvertaken: once the head has aged it takes the next
// free slot whatever it prefers, and no placed waiter goes ahead of it.
func TestAgedWaiterIsNeverOvertaken(t *testing.T) {
	g, clk := newTestGate(Config{Aging: time.Second})
	e := &engines{free: map[string]int{}}
	head := mustPlace(t, g, Normal, e.placed("cold"))
	clk.Advance(2 * time.Second)
	hit := mustPlace(t, g, Normal, e.placed("hot"))
	e.free["hot"] = 1
	if n := g.kick(); n != 1 || !isReady(head) || isReady(hit) {
		t.Fatalf("kick admitted %d; aged head %v, hit %v: want the aged head", n, isReady(head), isReady(hit))
	}
	if e.took[0] != "hot" {
		t.Fatalf("aged head took %v", e.took)
	}
	if head.Order() != OrderAged || head.Order().String() != "aged" {
		t.Fatalf("aged head's order %v", head.Order())
	}
}

// TestPreferredKeepsBandPriority: a parked High waiter that no engine can
// take blocks lower bands' preferred admissions too.
func TestPreferredKeepsBandPriority(t *testing.T) {
	g, _ := newTestGate(Config{})
	e := &engines{free: map[string]int{}}
	high := mustEnter(t, g, High, func() bool { return false })
	normal := mustPlace(t, g, Normal, e.placed("hot"))
	e.free["hot"] = 1
	if n := g.kick(); n != 0 || isReady(normal) || isReady(high) || e.prefTry != 0 {
		t.Fatalf("kick admitted %d (normal %v), %d preferred tries, behind a blocked High", n, isReady(normal), e.prefTry)
	}
}

// TestPlacedNewcomer: a placed newcomer behind same-band waiters goes at
// once when its holder has room, parks when it has not; behind a parked
// High waiter it parks without trying.
func TestPlacedNewcomer(t *testing.T) {
	g, _ := newTestGate(Config{})
	e := &engines{free: map[string]int{}}
	mustPlace(t, g, Normal, e.placed("cold"))
	e.free["hot"] = 1
	if w := mustPlace(t, g, Normal, e.placed("hot")); !isReady(w) {
		t.Fatal("newcomer whose holder had room parked")
	}
	if w := mustPlace(t, g, Normal, e.placed("hot")); isReady(w) {
		t.Fatal("newcomer admitted with its holder full")
	}
	mustEnter(t, g, High, func() bool { return false })
	e.free["hot"], e.prefTry = 1, 0
	if w := mustPlace(t, g, Normal, e.placed("hot")); isReady(w) || e.prefTry != 0 {
		t.Fatalf("newcomer behind a parked High: ready %v after %d preferred tries", isReady(w), e.prefTry)
	}
}
