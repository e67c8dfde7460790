package sighting

import "testing"

// TestSeen: a key is new the first time, seen after; the record holds at
// most its bound.
func TestSeen(t *testing.T) {
	s := NewSeen(100)
	if s.Again(7) {
		t.Fatal("a key offered once was seen before")
	}
	if !s.Again(7) {
		t.Fatal("a key offered twice was not seen before")
	}
	for k := range uint64(1000) {
		s.Again(k << 8)
		if s.Len() > 100 {
			t.Fatalf("%d keys recorded, bound 100", s.Len())
		}
	}
}

// TestKeep: an entry is kept from its key's second offer, replaces its
// key's, stays within the budget, and one over a quarter of the budget is
// not kept (nor made).
func TestKeep(t *testing.T) {
	k := NewKeep[string](1000, 64)
	made := 0
	mk := func(s string) func() string { return func() string { made++; return s } }
	k.Offer(1, 100, mk("a"))
	if _, ok := k.Get(1); ok || made != 0 {
		t.Fatal("kept, or made, on its first offer")
	}
	k.Offer(1, 100, mk("a"))
	if e, ok := k.Get(1); !ok || e != "a" || k.Bytes() != 100 {
		t.Fatalf("second offer: %q %v, %d bytes", e, ok, k.Bytes())
	}
	k.Offer(1, 50, mk("b"))
	if e, _ := k.Get(1); e != "b" || k.Bytes() != 50 || k.Len() != 1 {
		t.Fatalf("replacement: %q, %d bytes, %d entries", e, k.Bytes(), k.Len())
	}
	k.Offer(2, 251, mk("big"))
	k.Offer(2, 251, mk("big"))
	if _, ok := k.Get(2); ok {
		t.Fatal("an entry over a quarter of the budget was kept")
	}
	for key := uint64(10); key < 40; key++ {
		k.Offer(key, 200, mk("x"))
		k.Offer(key, 200, mk("x"))
		if k.Bytes() > 1000 {
			t.Fatalf("%d bytes kept, budget 1000", k.Bytes())
		}
	}
}
