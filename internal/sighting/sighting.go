// Package sighting holds what the gateway's kept-prefix sets share: a
// bounded record of the keys offered once, so that a set keeps only what
// comes again, and the budgeted set of kept entries itself. (How much of
// a kept prompt a new one shares is bytescan.CommonPrefix.)
package sighting

import "sync"

// Seen records keys offered once, up to a bound; past it the record
// starts again (a key then counts as new once more, which costs only a
// later keep). It is safe for concurrent use.
type Seen struct {
	max int
	mu  sync.Mutex
	m   map[uint64]struct{}
}

// NewSeen returns a record of at most max keys.
func NewSeen(max int) *Seen { return &Seen{max: max, m: make(map[uint64]struct{})} }

// Again reports whether key was offered before, and records that it was.
func (s *Seen) Again(key uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[key]; ok {
		return true
	}
	if len(s.m) >= s.max {
		clear(s.m)
	}
	s.m[key] = struct{}{}
	return false
}

// Len is how many keys are recorded.
func (s *Seen) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Keep is a bounded set of entries by key, each counted at a cost in
// bytes, kept only from its key's second offer (Seen). A new entry
// replaces its key's; one that would take the set past its budget empties
// it first (the sets it serves are caches of recent prompts, refilled by
// the traffic that uses them). It is safe for concurrent use; entries are
// never changed once kept.
type Keep[E any] struct {
	budget int
	seen   *Seen

	mu    sync.RWMutex
	m     map[uint64]kept[E]
	bytes int
}

type kept[E any] struct {
	e    E
	cost int
}

// NewKeep returns a set of at most budget bytes, recording at most
// maxSeen keys offered once.
func NewKeep[E any](budget, maxSeen int) *Keep[E] {
	return &Keep[E]{budget: budget, seen: NewSeen(maxSeen), m: make(map[uint64]kept[E])}
}

// Get returns key's entry.
func (k *Keep[E]) Get(key uint64) (E, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	x, ok := k.m[key]
	return x.e, ok
}

// Offer keeps the entry make returns under key, at cost, when key was
// offered before and the entry takes at most a quarter of the budget.
// make runs only then (it may copy what the entry holds), outside the
// lock.
func (k *Keep[E]) Offer(key uint64, cost int, make func() E) {
	if cost > k.budget/4 || !k.seen.Again(key) {
		return
	}
	e := make()
	k.mu.Lock()
	defer k.mu.Unlock()
	if old, ok := k.m[key]; ok {
		k.bytes -= old.cost
	}
	if k.bytes+cost > k.budget {
		clear(k.m)
		k.bytes = 0
	}
	k.m[key] = kept[E]{e: e, cost: cost}
	k.bytes += cost
}

// Len is the number of entries kept, Bytes their cost.
func (k *Keep[E]) Len() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.m)
}

// Bytes is the cost of the entries kept.
func (k *Keep[E]) Bytes() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.bytes
}
