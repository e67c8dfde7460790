package kvindex

// Orphan blocks. A BlockStored event whose parent the mirror never saw —
// the gateway subscribed after the engine stored that prefix, or after a
// resync — cannot be chained to a gateway key: keys hash the whole prefix,
// and the gateway never saw it. When the engines' hashing is known
// (MirrorConfig.Hash), the mirror keeps such an event's parent and blocks
// by the engine's own hashes instead: a vLLM engine that stores a block
// computed its whole prefix, and a chained hash names that prefix. A
// prompt whose blocks hash (the engine's way) to a kept one is then known
// to be held up to that block: Match adopts those blocks into the mirror
// under the prompt's gateway keys (Mirror.adopt), from where the engine's
// later events chain to them and its removals remove them, as if the
// mirror had seen them stored.

// orphanSet is a bounded set of engine block hashes, evicted oldest first.
// It keeps them in a group of its own, whose fifo, staleness and
// compaction are the mirror's; the entries' gateway keys are unknown and
// left 0.
type orphanSet struct {
	g     group
	stamp uint32
}

func (o *orphanSet) len() int { return len(o.g.entries) }

func (o *orphanSet) has(h uint64) bool {
	_, ok := o.g.entries[h]
	return ok
}

// add keeps h, evicting the oldest entries beyond limit. It returns how
// many entries the set gained (1 or 0) and how many it evicted.
func (o *orphanSet) add(h uint64, limit int) (added, evicted int) {
	g := &o.g
	if _, ok := g.entries[h]; ok {
		return 0, 0
	}
	for len(g.entries) >= max(limit, 1) && g.skipStale() {
		delete(g.entries, g.fifoH[g.head])
		g.head++
		evicted++
	}
	if g.entries == nil {
		g.entries = make(map[uint64]blockEntry)
	}
	o.stamp++
	g.entries[h] = blockEntry{refs: 1, stamp: o.stamp}
	g.entriesHi = max(g.entriesHi, len(g.entries))
	g.fifoH = append(g.fifoH, h)
	g.fifoS = append(g.fifoS, o.stamp)
	if len(g.fifoH) >= fifoLimit(len(g.entries)) {
		g.compact()
	}
	return 1, evicted
}

// remove drops h and reports whether it was there.
func (o *orphanSet) remove(h uint64) bool {
	g := &o.g
	if _, ok := g.entries[h]; !ok {
		return false
	}
	delete(g.entries, h)
	g.entries, g.entriesHi = shrinkMap(g.entries, g.entriesHi)
	if len(g.fifoH) >= fifoLimit(len(g.entries)) {
		g.compact()
	}
	return true
}

// keepOrphanLocked handles a BlockStored of n blocks whose parent the
// mirror does not hold: kept by engine hash when the engines' hashing is
// known (group 0 only, and only when prefixes are credited from it, see
// keySpace: recognised blocks are adopted into group 0 under the prompt's
// keys, and a hybrid model's sliding-window or Mamba group must never be
// credited), else counted as unapplied. Callers hold wmu and ix.mu; the
// event's group exists.
func (m *Mirror) keepOrphanLocked(ev *Event) {
	n := len(ev.BlockHashes)
	if !m.hash.Enabled() || ev.GroupIdx != 0 || m.groups[0].space != 0 {
		m.st.Unchainable += uint64(n)
		m.st.UnknownParent++
		m.health.note(false)
		return
	}
	m.st.OrphanEvents++
	m.health.note(true)
	// Requests for its adapter are then matched under it, as for a
	// chained event.
	m.ix.noteLoRALocked(ev.LoRAName)
	limit := m.capacityLocked()
	m.addOrphanLocked(ev.Parent, limit)
	for _, h := range ev.BlockHashes {
		m.addOrphanLocked(h, limit)
	}
}

func (m *Mirror) addOrphanLocked(h uint64, limit int) {
	added, evicted := m.orphans.add(h, limit)
	m.ix.orphaned.Add(int64(added - evicted))
	m.st.OrphansEvicted += uint64(evicted)
}

// removeOrphanLocked drops h from the kept orphans, reporting whether it
// was one.
func (m *Mirror) removeOrphanLocked(h uint64) bool {
	if !m.orphans.remove(h) {
		return false
	}
	m.ix.orphaned.Add(-1)
	return true
}

// dropOrphansLocked forgets every kept orphan (a resync or removal).
func (m *Mirror) dropOrphansLocked() {
	m.ix.orphaned.Add(-int64(m.orphans.len()))
	m.orphans = orphanSet{}
}

// adopt takes into the mirror the prompt's leading blocks up to the
// deepest one whose engine hash (hashes[i], the engine's hash of block i)
// the mirror keeps as an orphan, under the prompt's gateway keys (keys[i]),
// and reports how many blocks it added. Blocks before it that the engine
// announced before the gateway subscribed are inferred held too: vLLM
// looks a prompt up from its first block and evicts a freed request's
// blocks last to first, so a block outlives none of its ancestors but by
// a direct eviction (whose BlockRemoved then finds and drops it here).
func (m *Mirror) adopt(blockSize int, hashes, keys []uint64) int {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	if m.removed.Load() {
		return 0
	}
	ix := m.ix
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if len(m.groups) == 0 || m.groups[0] == nil || m.groups[0].blockSize != blockSize || m.groups[0].space != 0 {
		return 0
	}
	g := m.groups[0]
	deepest := -1
	for i := min(len(hashes), len(keys)) - 1; i >= 0; i-- {
		if m.orphans.has(hashes[i]) {
			deepest = i
			break
		}
	}
	added := 0
	for i := 0; i <= deepest; i++ {
		m.pauseLocked(i)
		m.removeOrphanLocked(hashes[i])
		if _, ok := g.entries[hashes[i]]; ok {
			continue
		}
		m.addLocked(g, hashes[i], keys[i])
		added++
	}
	m.st.Recognized += uint64(added)
	return added
}

// recognize adopts, for every live engine of block size bs that keeps
// orphans, the prompt's blocks up to the deepest one it holds (see
// Mirror.adopt). The engines' hashes of the prompt are computed once per
// hashing configuration, and only while some mirror keeps orphans: a
// fleet whose events all chain pays nothing. Prompts of group 0 only; a
// multimodal prompt's blocks are recognised when its items are known
// (Query.MM), for vLLM's hashing.
func (ix *Index) recognize(q Query, bs int, keys []uint64) {
	if q.Group != 0 || len(keys) == 0 || ix.orphaned.Load() <= 0 {
		return
	}
	type want struct {
		m    *Mirror
		hash EngineHash
	}
	var ws []want
	ix.mu.RLock()
	for _, m := range ix.slots {
		if m != nil && m.orphans.len() > 0 && m.hash.Enabled() && m.groupBlockSize(0) == bs &&
			ix.live[m.bank]&m.bit != 0 {
			ws = append(ws, want{m, m.hash})
		}
	}
	ix.mu.RUnlock()
	computed := make(map[EngineHash][]uint64, 1)
	for _, w := range ws {
		hs, ok := computed[w.hash]
		if !ok {
			var err error
			hs, err = w.hash.BlockHashes(make([]uint64, 0, len(keys)), HashedPrompt{
				Tokens: q.Tokens[:min(len(q.Tokens), len(keys)*bs)], BlockSize: bs,
				Model: q.Model, LoRAName: q.LoRAName, CacheSalt: q.CacheSalt, MM: q.MM,
			})
			if err != nil {
				hs = nil
			}
			computed[w.hash] = hs
		}
		if len(hs) > 0 {
			w.m.adopt(bs, hs, keys)
		}
	}
}
