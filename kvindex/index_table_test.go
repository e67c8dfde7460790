package kvindex

import (
	"math/rand/v2"
	"testing"
)

// TestKeyTableAgainstMap drives the table and a Go map with the same random
// operations, with keys crowded into few subtables and home slots so probe
// runs wrap and backward-shift deletion is exercised, growth and shrinking
// included.
func TestKeyTableAgainstMap(t *testing.T) {
	for _, keySpace := range []uint64{64, 4096, 1 << 16} {
		var tb keyTable
		ref := map[uint64]uint64{}
		rng := rand.New(rand.NewPCG(keySpace, 1))
		key := func() uint64 {
			k := rng.Uint64N(keySpace)
			if rng.IntN(2) == 0 {
				k |= 0xab << 56 // crowd one subtable
			}
			return k // 0 included
		}
		for op := 0; op < 100000; op++ {
			k, bit := key(), uint64(1)<<rng.IntN(3)
			switch rng.IntN(3) {
			case 0, 1:
				if got, want := tb.or(k, bit), ref[k]; got != want {
					t.Fatalf("or(%#x) returned %#x, want %#x", k, got, want)
				}
				ref[k] |= bit
			case 2:
				tb.andNot(k, bit)
				if ref[k] &^= bit; ref[k] == 0 {
					delete(ref, k)
				}
			}
			if op%5000 == 0 {
				for k, v := range ref {
					if got := tb.get(k); got != v {
						t.Fatalf("op %d: get(%#x) = %#x, want %#x", op, k, got, v)
					}
				}
				if tb.len() != len(ref) {
					t.Fatalf("op %d: len %d, want %d", op, tb.len(), len(ref))
				}
			}
		}
		// Drain: every key removed, tables shrink back.
		for k, v := range ref {
			tb.andNot(k, v)
			if tb.get(k) != 0 {
				t.Fatalf("get(%#x) after removal", k)
			}
		}
		n := 0
		tb.each(func(uint64, uint64) { n++ })
		if tb.len() != 0 || n != 0 {
			t.Fatalf("%d keys (%d iterated) left after draining", tb.len(), n)
		}
		for i := range tb.subs {
			if l := len(tb.subs[i].slots); l > minSubSlots {
				t.Fatalf("subtable %d kept %d slots after draining", i, l)
			}
		}
	}
}
