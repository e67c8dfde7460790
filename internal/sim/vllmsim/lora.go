package vllmsim

import "slices"

// loraSlots models vLLM's two limits on adapters: the distinct adapters of
// the step being planned (the scheduler's scheduled_loras, at most
// capacity = --max-loras) and the LRU of adapters loaded in the GPU's
// capacity slots. Adapters are lora_ids 1..n; 0 is the base model. Guarded
// by Engine.mu.
type loraSlots struct {
	capacity int
	stamp    uint64   // numbers planned steps; 0 is never a step
	mark     []uint64 // by lora_id: the step whose batch holds it
	batch    []int    // distinct lora_ids of the step being planned
	lastUse  []uint64 // by lora_id: the last step that used it loaded; 0 = not loaded
	loaded   int
}

func newLoRASlots(capacity, adapters int) *loraSlots {
	return &loraSlots{
		capacity: capacity,
		mark:     make([]uint64, adapters+1),
		lastUse:  make([]uint64, adapters+1),
	}
}

// begin starts planning a step whose batch so far is the running requests
// in reqs: vLLM takes scheduled_loras from the running requests it
// scheduled before it looks at the waiting queue.
func (s *loraSlots) begin(reqs []*simRequest) {
	s.stamp++
	s.batch = s.batch[:0]
	for _, r := range reqs {
		s.add(r.loraID)
	}
}

// add puts a request's adapter in the batch being planned.
func (s *loraSlots) add(id int) {
	if id <= 0 || id >= len(s.mark) || s.mark[id] == s.stamp {
		return
	}
	s.mark[id] = s.stamp
	s.batch = append(s.batch, id)
}

// admits reports whether a request for adapter id may join the batch: the
// base model always may, an adapter when it is in the batch already or the
// batch has a free slot.
func (s *loraSlots) admits(id int) bool {
	if id <= 0 || id >= len(s.mark) {
		return true
	}
	return s.mark[id] == s.stamp || len(s.batch) < s.capacity
}

// load makes the batch's adapters resident, evicting the least recently
// used others, and returns how many it had to load. The batch never holds
// more than capacity adapters, so a loaded one of the batch is never
// evicted for another.
func (s *loraSlots) load() int {
	for _, id := range s.batch {
		if s.lastUse[id] > 0 {
			s.lastUse[id] = s.stamp
		}
	}
	n := 0
	for _, id := range s.batch {
		if s.lastUse[id] == s.stamp {
			continue
		}
		if s.loaded < s.capacity || !s.evict() {
			s.loaded++
		}
		s.lastUse[id] = s.stamp
		n++
	}
	return n
}

// evict unloads the least recently used adapter not used by the current
// step; false when there is none.
func (s *loraSlots) evict() bool {
	victim, oldest := 0, s.stamp
	for id, t := range s.lastUse {
		if t > 0 && t < oldest {
			victim, oldest = id, t
		}
	}
	if victim == 0 {
		return false
	}
	s.lastUse[victim] = 0
	return true
}

// reset unloads every adapter, as a process restart does.
func (s *loraSlots) reset() {
	clear(s.lastUse)
	s.loaded = 0
}

// resident returns the loaded lora_ids, for tests.
func (s *loraSlots) resident() []int {
	var ids []int
	for id, t := range s.lastUse {
		if t > 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// countAdapterArrivalLocked counts an arriving request for adapter id (0:
// the base model, not counted), and whether requests for the same adapter
// were running or waiting when it arrived. e.mu held.
func (e *Engine) countAdapterArrivalLocked(id int) {
	if id <= 0 {
		return
	}
	e.ctr.adapterArrivals++
	same := func(r *simRequest) bool { return r.loraID == id }
	if slices.ContainsFunc(e.running, same) || slices.ContainsFunc(e.waiting, same) {
		e.ctr.adapterInFlight++
	}
}
