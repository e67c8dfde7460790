package fleetsim

import "container/list"

// blockLRU is a least-recently-used set of at most capacity block ids:
// an engine's CPU offload tier (cputier.go) and the pooled cache of a
// trace's hit ceiling (PooledCeiling).
type blockLRU struct {
	capacity int
	order    *list.List // front: most recent
	at       map[uint64]*list.Element
}

func newBlockLRU(capacity int) *blockLRU {
	return &blockLRU{capacity: max(capacity, 0), order: list.New(), at: map[uint64]*list.Element{}}
}

// len is how many blocks the set holds.
func (l *blockLRU) len() int { return l.order.Len() }

// has reports whether the set holds h.
func (l *blockLRU) has(h uint64) bool { _, ok := l.at[h]; return ok }

// touch makes h the most recently used, if the set holds it.
func (l *blockLRU) touch(h uint64) bool {
	e, ok := l.at[h]
	if ok {
		l.order.MoveToFront(e)
	}
	return ok
}

// use makes h the most recently used, adding it when the set lacks it;
// when that took the set past its capacity, its least recently used
// block left and is returned. A set of capacity 0 holds nothing.
func (l *blockLRU) use(h uint64) (evicted uint64, ok bool) {
	if l.touch(h) || l.capacity == 0 {
		return 0, false
	}
	l.at[h] = l.order.PushFront(h)
	if l.order.Len() <= l.capacity {
		return 0, false
	}
	old := l.order.Back()
	l.order.Remove(old)
	evicted = old.Value.(uint64)
	delete(l.at, evicted)
	return evicted, true
}

// run is how many of hashes, from the first, the set holds in a row.
func (l *blockLRU) run(hashes []uint64) int {
	for i, h := range hashes {
		if !l.has(h) {
			return i
		}
	}
	return len(hashes)
}
