package admission

// bandQueue is the FIFO of parked waiters of one band.
//
// Waiters live in a slice in arrival order. A waiter that leaves out of order
// becomes a tombstone (nil) so removal is O(1) and the order of the others
// does not move; a Fenwick tree over the slots counts live waiters so a
// waiter's rank (how many are ahead of it) is O(log n) even with 10,000
// parked. Arrival times and sequence numbers stay in tombstones, so both stay
// sorted and can be binary-searched. The slice is compacted when tombstones
// dominate, which keeps memory proportional to the live count (amortised).
type bandQueue struct {
	slots []slot
	fen   []int32 // Fenwick tree, 1-based: fen[i-1] covers slots (i-lowbit(i), i]
	head  int     // first slot that may be live; all before it are tombstones
	live  int
}

type slot struct {
	w   *Waiter // nil once the waiter left or was admitted
	t   int64   // arrival, nanoseconds since the gate's epoch
	seq uint64  // global arrival order across bands
}

// push appends w, recording its slot index in w.idx.
func (q *bandQueue) push(w *Waiter) {
	q.slots = append(q.slots, slot{w: w, t: w.t, seq: w.seq})
	n := len(q.slots) // 1-based index of the new slot
	// A new Fenwick node covers (n-lowbit(n), n]: its own 1 plus the live
	// slots in (n-lowbit(n), n-1], computed from two prefix sums.
	v := 1 + q.prefix(n-1) - q.prefix(n-(n&-n))
	q.fen = append(q.fen, int32(v))
	w.idx = n - 1
	q.live++
}

// prefix returns the number of live slots among the first k slots.
func (q *bandQueue) prefix(k int) int {
	s := 0
	for i := k; i > 0; i -= i & -i {
		s += int(q.fen[i-1])
	}
	return s
}

// remove turns slot idx (which must be live) into a tombstone.
func (q *bandQueue) remove(idx int) {
	q.slots[idx].w = nil
	for i := idx + 1; i <= len(q.fen); i += i & -i {
		q.fen[i-1]--
	}
	q.live--
	for q.head < len(q.slots) && q.slots[q.head].w == nil {
		q.head++
	}
	switch {
	case q.live == 0:
		q.reset()
	case len(q.slots)-q.live > q.live+64:
		q.compact()
	}
}

// reset empties the queue, dropping a large backing array so a burst of
// parked requests does not pin its memory forever.
func (q *bandQueue) reset() {
	if cap(q.slots) > 1024 {
		q.slots, q.fen = nil, nil
	} else {
		clear(q.slots) // drop *Waiter references for the GC
		q.slots, q.fen = q.slots[:0], q.fen[:0]
	}
	q.head = 0
}

// compact moves the live waiters to the front and rebuilds the tree.
func (q *bandQueue) compact() {
	n := 0
	for _, s := range q.slots[q.head:] {
		if s.w != nil {
			s.w.idx = n
			q.slots[n] = s
			n++
		}
	}
	clear(q.slots[n:])
	q.slots = q.slots[:n]
	q.fen = q.fen[:n]
	// Linear-time Fenwick build: every slot is live.
	for i := range q.fen {
		q.fen[i] = 1
	}
	for i := 1; i <= n; i++ {
		if j := i + (i & -i); j <= n {
			q.fen[j-1] += q.fen[i-1]
		}
	}
	q.head = 0
}

// first returns the oldest live waiter, or nil.
func (q *bandQueue) first() *Waiter {
	if q.head < len(q.slots) {
		return q.slots[q.head].w
	}
	return nil
}

// rank returns how many live waiters precede slot idx.
func (q *bandQueue) rank(idx int) int { return q.prefix(idx) }

// countBefore returns how many live waiters arrived before global sequence
// number seq.
func (q *bandQueue) countBefore(seq uint64) int {
	return q.prefix(q.search(func(s *slot) bool { return s.seq >= seq }))
}

// countArrivedBy returns how many live waiters arrived at or before t.
func (q *bandQueue) countArrivedBy(t int64) int {
	return q.prefix(q.search(func(s *slot) bool { return s.t > t }))
}

// search returns the first slot index in [head, len) for which pred holds,
// or len(slots); pred must be monotone over the slots (it is, since arrival
// times and sequence numbers only grow).
func (q *bandQueue) search(pred func(*slot) bool) int {
	lo, hi := q.head, len(q.slots)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if pred(&q.slots[m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}
