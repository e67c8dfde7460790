package routing

import (
	"fmt"
	"slices"
	"testing"
)

func dials(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1)
	}
	return out
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("prefix-%d", i)
	}
	return out
}

func TestRendezvousEmpty(t *testing.T) {
	if got := Rendezvous("k", nil); got != -1 {
		t.Fatalf("Rendezvous(nil) = %d, want -1", got)
	}
	if got := Rendezvous("k", []string{"only:1"}); got != 0 {
		t.Fatalf("single dial: %d, want 0", got)
	}
}

// TestRendezvousStable: the same key maps to the same dial, whatever the
// order the dials are listed in, and the keys spread evenly.
func TestRendezvousStable(t *testing.T) {
	ds := dials(8)
	rev := slices.Clone(ds)
	slices.Reverse(rev)
	counts := make(map[string]int)
	for _, k := range keys(1000) {
		i := Rendezvous(k, ds)
		if j := Rendezvous(k, ds); j != i {
			t.Fatalf("key %q: %d then %d", k, i, j)
		}
		if r := Rendezvous(k, rev); rev[r] != ds[i] {
			t.Fatalf("key %q: %s in one order, %s in the other", k, ds[i], rev[r])
		}
		counts[ds[i]]++
	}
	exp := 1000.0 / 8
	chi2 := 0.0
	for _, d := range ds {
		c := float64(counts[d])
		chi2 += (c - exp) * (c - exp) / exp
	}
	// 7 degrees of freedom, p = 0.001.
	if chi2 > 24.32 {
		t.Fatalf("uneven: %v chi2 %.1f", counts, chi2)
	}
}

// TestRendezvousRemove: removing one dial remaps exactly the keys that were
// on it.
func TestRendezvousRemove(t *testing.T) {
	ds := dials(8)
	for removed := range ds {
		rest := slices.Delete(slices.Clone(ds), removed, removed+1)
		moved := 0
		for _, k := range keys(1000) {
			before := ds[Rendezvous(k, ds)]
			after := rest[Rendezvous(k, rest)]
			if before == ds[removed] {
				moved++
				continue
			}
			if after != before {
				t.Fatalf("removing %s moved key %q from %s to %s", ds[removed], k, before, after)
			}
		}
		if moved == 0 {
			t.Fatalf("no key was on %s", ds[removed])
		}
	}
}

// TestRendezvousAdd: adding a ninth dial moves about 1/9 of the keys, all
// of them onto the new dial.
func TestRendezvousAdd(t *testing.T) {
	ds := dials(9)
	old := ds[:8]
	moved := 0
	for _, k := range keys(1000) {
		before := old[Rendezvous(k, old)]
		after := ds[Rendezvous(k, ds)]
		if after != before {
			if after != ds[8] {
				t.Fatalf("key %q moved from %s to %s, not to the new dial", k, before, after)
			}
			moved++
		}
	}
	t.Logf("adding 1 dial to 8 moved %d of 1000 keys (ideal %.0f)", moved, 1000.0/9)
	if moved < 1000/9/2 || moved > 1000*3/9/2 {
		t.Fatalf("moved %d keys, want about %d", moved, 1000/9)
	}
}
