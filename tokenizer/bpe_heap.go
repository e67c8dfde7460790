package tokenizer

// mergeCandidate is a possible merge of the symbol at pos with the symbol
// after it, as it stood when the candidate was queued.
type mergeCandidate struct {
	rank        uint32
	pos         int32
	left, right int32 // the pair's ids, to recognise stale candidates
	id          int32 // the merged token
}

func (a mergeCandidate) less(b mergeCandidate) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

// mergeHeap merges a long word with a priority queue of candidate merges,
// lowest rank first and leftmost on ties, which gives the same result as
// mergeSmall in O(n log n). Symbols are linked in place; merged-away
// symbols get end == start.
func (m *bpeModel) mergeHeap(syms []symbol, sc *scratch) []symbol {
	n := len(syms)
	next := growInt32(sc.next, n)
	prev := growInt32(sc.prev, n)
	for i := range n {
		next[i], prev[i] = int32(i+1), int32(i-1)
	}
	next[n-1] = -1
	h := candidateHeap(sc.heap[:0])
	push := func(i int32) {
		j := next[i]
		if j < 0 {
			return
		}
		if r, id, ok := m.rankOf(syms[i].id, syms[j].id); ok {
			h.push(mergeCandidate{r, i, syms[i].id, syms[j].id, id})
		}
	}
	for i := 0; i+1 < n; i++ {
		push(int32(i))
	}
	for len(h) > 0 {
		c := h.pop()
		j := next[c.pos]
		if syms[c.pos].start == syms[c.pos].end || j < 0 || syms[c.pos].id != c.left || syms[j].id != c.right {
			continue // stale: one side has been merged since
		}
		syms[c.pos].id, syms[c.pos].end = c.id, syms[j].end
		syms[j].end = syms[j].start
		next[c.pos] = next[j]
		if k := next[j]; k >= 0 {
			prev[k] = c.pos
		}
		if p := prev[c.pos]; p >= 0 {
			push(p)
		}
		push(c.pos)
	}
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	sc.next, sc.prev, sc.heap = next, prev, h[:0]
	return out
}

func growInt32(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

// candidateHeap is a binary min-heap, written out rather than through
// container/heap to avoid boxing every candidate.
type candidateHeap []mergeCandidate

func (h *candidateHeap) push(c mergeCandidate) {
	s := append(*h, c)
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
	*h = s
}

func (h *candidateHeap) pop() mergeCandidate {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, min := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].less(s[min]) {
			min = l
		}
		if r < len(s) && s[r].less(s[min]) {
			min = r
		}
		if min == i {
			break
		}
		s[i], s[min] = s[min], s[i]
		i = min
	}
	*h = s
	return top
}
