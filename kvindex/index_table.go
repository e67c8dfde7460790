package kvindex

// keyTable maps gateway keys to 64-bit engine sets. It is an open-addressing
// hash table with linear probing, split into 256 subtables by the key's top
// byte. Keys are already uniform hashes, so they index slots directly; a
// lookup is a few instructions and usually one cache line, several times
// cheaper than a Go map lookup on an index of millions of keys, and a query
// walks thousands. Subtables grow one at a time, so a resize stalls writers
// for at most 1/256 of the table. Not safe for concurrent use; Index guards
// it.
type keyTable struct {
	subs [256]subTable
	n    int
}

type subTable struct {
	slots []tslot // len is a power of two, or 0
	mask  uint64
	n     int
}

type tslot struct{ key, bits uint64 }

// Key 0 marks an empty slot; the one key in 2^64 that is 0 is stored as
// another constant, at the cost of colliding with that constant.
const zeroKeyStandIn = 0x9e3779b97f4a7c15

const minSubSlots = 16

func normKey(k uint64) uint64 {
	if k == 0 {
		return zeroKeyStandIn
	}
	return k
}

// get returns the engine set of key k (0 if absent).
func (t *keyTable) get(k uint64) uint64 {
	k = normKey(k)
	s := &t.subs[k>>56]
	if s.n == 0 {
		return 0
	}
	for i := k & s.mask; ; i = (i + 1) & s.mask {
		sl := &s.slots[i]
		if sl.key == k {
			return sl.bits
		}
		if sl.key == 0 {
			return 0
		}
	}
}

// getMany sets got[j] to the engine set of ks[j] (0 if absent), for up to
// len(got) keys. It first loads every key's home slot with no branch on
// what it finds, so the CPU has all of their cache misses in flight at
// once; a lookup's own loop branches on each slot it reads, and a
// mispredicted branch held the next lookup's load back until the miss
// was served (a cold 8Ki-token match took ~140 ns a key).
func (t *keyTable) getMany(ks []uint64, got []uint64) {
	var home [16]uint64
	for j, k := range ks[:min(len(ks), len(home))] {
		k = normKey(k)
		s := &t.subs[k>>56]
		if len(s.slots) > 0 {
			home[j] = s.slots[k&s.mask].key
		}
	}
	for j, k := range ks {
		if nk := normKey(k); j < len(home) && home[j] == nk {
			s := &t.subs[nk>>56]
			got[j] = s.slots[nk&s.mask].bits
			continue
		}
		got[j] = t.get(k)
	}
}

// or adds bits to k's set and returns the set before.
func (t *keyTable) or(k, bits uint64) uint64 {
	k = normKey(k)
	s := &t.subs[k>>56]
	if (s.n+1)*4 > len(s.slots)*3 {
		s.resize(max(minSubSlots, 2*len(s.slots)))
	}
	for i := k & s.mask; ; i = (i + 1) & s.mask {
		sl := &s.slots[i]
		if sl.key == k {
			old := sl.bits
			sl.bits |= bits
			return old
		}
		if sl.key == 0 {
			*sl = tslot{key: k, bits: bits}
			s.n++
			t.n++
			return 0
		}
	}
}

// andNot removes bits from k's set, deleting k when the set empties.
func (t *keyTable) andNot(k, bits uint64) {
	k = normKey(k)
	s := &t.subs[k>>56]
	if s.n == 0 {
		return
	}
	for i := k & s.mask; ; i = (i + 1) & s.mask {
		sl := &s.slots[i]
		if sl.key == 0 {
			return
		}
		if sl.key != k {
			continue
		}
		if sl.bits &^= bits; sl.bits == 0 {
			s.deleteAt(i)
			s.n--
			t.n--
			if len(s.slots) > minSubSlots && s.n*8 < len(s.slots) {
				s.resize(len(s.slots) / 2)
			}
		}
		return
	}
}

// deleteAt empties slot i by backward-shift deletion: later entries of the
// probe run move back, so no tombstones are needed.
func (s *subTable) deleteAt(i uint64) {
	mask := s.mask
	for {
		s.slots[i] = tslot{}
		j := i
		for {
			j = (j + 1) & mask
			k := s.slots[j].key
			if k == 0 {
				return
			}
			// The entry at j may fill the hole at i unless its home
			// slot lies cyclically in (i, j].
			if (j-k)&mask >= (j-i)&mask {
				s.slots[i] = s.slots[j]
				i = j
				break
			}
		}
	}
}

func (s *subTable) resize(n int) {
	old := s.slots
	s.slots = make([]tslot, n)
	s.mask = uint64(n - 1)
	for _, sl := range old {
		if sl.key == 0 {
			continue
		}
		i := sl.key & s.mask
		for s.slots[i].key != 0 {
			i = (i + 1) & s.mask
		}
		s.slots[i] = sl
	}
}

// len returns the number of keys.
func (t *keyTable) len() int { return t.n }

// each calls fn for every key and its set.
func (t *keyTable) each(fn func(k, bits uint64)) {
	for i := range t.subs {
		for _, sl := range t.subs[i].slots {
			if sl.key != 0 {
				fn(sl.key, sl.bits)
			}
		}
	}
}
