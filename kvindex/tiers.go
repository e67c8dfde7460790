package kvindex

import (
	"math/bits"
	"slices"
	"strings"
)

// Tier is where an engine keeps a KV block: its GPU cache, or a tier it
// offloads to. vLLM's events name it in `medium`: "GPU" from the block
// pool, "CPU" from the OffloadingConnector (and "cpu" from Mooncake's),
// "STORAGE" since v0.27 for disk and object stores, "FS" and "OBJ" in
// v0.26.
type Tier uint8

// The tiers, fastest first: a prefix continues from one into the next.
const (
	TierGPU Tier = iota
	TierCPU
	TierStorage
	numTiers
)

// lowerTiers are the tiers below the GPU, which Mirror keeps in lowerTier
// sets (the GPU tier has the index's banks).
const lowerTiers = int(numTiers) - 1

// String names the tier as /llm/engines and the metrics do.
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	case TierStorage:
		return "storage"
	}
	return "unknown"
}

// tierOf maps an event's medium to its tier, case-insensitively; ok is
// false for a medium it does not know (LMCache passes its own names
// through), whose events are counted as OtherTier and not applied.
func tierOf(medium string) (t Tier, ok bool) {
	switch strings.ToUpper(medium) {
	case "", "GPU":
		return TierGPU, true // nil medium: releases before #19737, all GPU
	case "CPU":
		return TierCPU, true
	case "STORAGE", "FS", "OBJ":
		return TierStorage, true
	}
	return 0, false
}

// maxLowerBlocks bounds each lower tier of one engine: a tier at it takes
// no new block (counted in MirrorStats.TierOverflow) until removals make
// room. 262,144 blocks is 4M tokens at block size 16, about 10 MB of map.
const maxLowerBlocks = 1 << 18

// lowerTier is one engine's blocks in one offload tier: by (group, engine
// hash) with the gateway key the block was recognised under, and by
// gateway key for lookups. Guarded like the rest of the mirror (ix.mu,
// written with wmu held too).
type lowerTier struct {
	byHash map[tierHash]lowerEntry
	byKey  map[uint64]uint32 // gateway key → blocks held under it
}

// tierHash is an engine block hash within its KV-cache group: hybrid
// models' groups of one block size hash alike.
type tierHash struct {
	group int
	hash  uint64
}

type lowerEntry struct {
	key  uint64
	refs uint32 // times stored without being removed
}

func (t *lowerTier) len() int { return len(t.byHash) }

// add stores hash under key; false when the tier is full. first is true
// when no other block of the tier had that key.
func (t *lowerTier) add(h tierHash, key uint64) (ok, first bool) {
	if t.byHash == nil {
		t.byHash = make(map[tierHash]lowerEntry)
		t.byKey = make(map[uint64]uint32)
	}
	if e, ok := t.byHash[h]; ok {
		e.refs++
		t.byHash[h] = e
		return true, false
	}
	if len(t.byHash) >= maxLowerBlocks {
		return false, false
	}
	t.byHash[h] = lowerEntry{key: key, refs: 1}
	t.byKey[key]++
	return true, t.byKey[key] == 1
}

// remove drops one reference to hash; ok is false when the tier lacks it,
// gone names the key no block of the tier has any more.
func (t *lowerTier) remove(h tierHash) (ok bool, gone uint64, isGone bool) {
	e, ok := t.byHash[h]
	if !ok {
		return false, 0, false
	}
	if e.refs > 1 {
		e.refs--
		t.byHash[h] = e
		return true, 0, false
	}
	delete(t.byHash, h)
	if c := t.byKey[e.key]; c > 1 {
		t.byKey[e.key] = c - 1
		return true, 0, false
	}
	delete(t.byKey, e.key)
	return true, e.key, true
}

// addLowerLocked adds engine block h under key to tier t, claiming the
// key in the tier's bank when it is new there; false when the tier is
// full. ix.mu held.
func (m *Mirror) addLowerLocked(t Tier, h tierHash, key uint64) bool {
	ok, first := m.lower(t).add(h, key)
	if first {
		m.ix.tierBanks[t-1][m.bank].or(key, m.bit)
	}
	return ok
}

// lower returns the mirror's set of a lower tier.
func (m *Mirror) lower(t Tier) *lowerTier { return &m.tiers[t-1] }

// knownKeyLocked is the gateway key the mirror knows engine block h of
// group by: from its GPU entries, else from a lower tier's. ix.mu held.
func (m *Mirror) knownKeyLocked(group int, h uint64) (uint64, bool) {
	if group < len(m.groups) && m.groups[group] != nil {
		if e, ok := m.groups[group].entries[h]; ok {
			return e.key, true
		}
	}
	for i := range m.tiers {
		if e, ok := m.tiers[i].byHash[tierHash{group, h}]; ok {
			return e.key, true
		}
	}
	return 0, false
}

// storeLowerLocked applies a BlockStored for an offload tier. A
// self-describing event (its tokens and parent, vllm#43468) is keyed as a
// GPU store is, its parent looked up in every tier. An event without
// tokens (block_size 0, token_ids empty: the OffloadingConnector's of
// older releases) can only name blocks the mirror knows already, by their
// engine hash: those are applied, the rest counted in TierUnknown, never
// guessed. ix.mu and wmu held.
func (m *Mirror) storeLowerLocked(t Tier, ev *Event) {
	n := len(ev.BlockHashes)
	if n == 0 {
		return
	}
	if len(ev.TokenIDs) == 0 {
		for _, h := range ev.BlockHashes {
			key, ok := m.knownKeyLocked(ev.GroupIdx, h)
			switch {
			case !ok:
				m.st.TierUnknown++
			case !m.addLowerLocked(t, tierHash{ev.GroupIdx, h}, key):
				m.st.TierOverflow++
			}
		}
		return
	}
	bs := ev.BlockSize
	if bs <= 0 || len(ev.TokenIDs) != n*bs {
		m.st.Malformed++
		return
	}
	key := rootKey(m.learnGroupLocked(ev))
	if ev.HasParent {
		k, ok := m.knownKeyLocked(ev.GroupIdx, ev.Parent)
		if !ok {
			m.st.TierUnknown += uint64(n)
			return
		}
		key = k
	}
	for i, h := range ev.BlockHashes {
		var err error
		if key, err = m.kh.next(key, ev.TokenIDs[i*bs:(i+1)*bs], blockExtra(ev, i)); err != nil {
			m.st.Malformed++
			return
		}
		if !m.addLowerLocked(t, tierHash{ev.GroupIdx, h}, key) {
			m.st.TierOverflow++
		}
	}
}

// blockExtra is the extra keys vLLM hashed block i of ev with (see
// storeLocked): its extra_keys entry, else, before extra_keys existed,
// the adapter's name.
func blockExtra(ev *Event, i int) []any {
	if ev.ExtraKeys != nil {
		if i < len(ev.ExtraKeys) {
			return ev.ExtraKeys[i]
		}
		return nil
	}
	if ev.LoRAName != "" {
		return []any{ev.LoRAName}
	}
	return nil
}

// removeLowerLocked applies a BlockRemoved for an offload tier. ix.mu and
// wmu held.
func (m *Mirror) removeLowerLocked(t Tier, ev *Event) {
	set := m.lower(t)
	for _, h := range ev.BlockHashes {
		ok, key, gone := set.remove(tierHash{ev.GroupIdx, h})
		switch {
		case !ok:
			m.st.RemovedUnknown++
		case gone:
			m.ix.tierBanks[t-1][m.bank].andNot(key, m.bit)
		}
	}
}

// withdrawLower withdraws the claims of offload tiers a clear took from
// the mirror, 4096 keys per hold of the index's lock, as clear does the
// GPU tier's: queries skip the hidden engine meanwhile. Callers hold wmu,
// not ix.mu.
func (m *Mirror) withdrawLower(old *[lowerTiers]lowerTier) {
	const chunk = 4096
	for i := range old {
		bank := m.ix.tierBanks[i][m.bank]
		done := 0
		m.ix.mu.Lock()
		for k := range old[i].byKey {
			bank.andNot(k, m.bit)
			if done++; done%chunk == 0 {
				m.ix.mu.Unlock()
				m.ix.mu.Lock()
			}
		}
		m.ix.mu.Unlock()
	}
}

// TierMatch is how much of a prompt one engine holds in each tier: GPU
// blocks lead, as MatchKeys counts them (speculative entries included),
// then CPU continues that prefix block by block, then storage continues
// the CPU run. Tokens per tier are Blocks[t]*BlockSize.
type TierMatch struct {
	Engine    string
	BlockSize int
	// Blocks is indexed by Tier.
	Blocks [numTiers]int
}

// Total is the prefix length, in blocks, the engine holds in some tier.
func (m TierMatch) Total() int {
	n := 0
	for _, b := range m.Blocks {
		n += b
	}
	return n
}

// MatchTiers returns, for every engine of the given block size that holds
// the prompt's first blocks in some tier, how many leading blocks of keys
// it holds per tier (see TierMatch); keys are as for MatchKeys. Engines
// without offload tiers are as MatchKeys reports them. Sorted as
// MatchKeys sorts, by the GPU blocks, then by the total. Cost: MatchKeys,
// then per offload tier one lookup per block per 64 engines, from the
// first engine's start to the last engine's end.
func (ix *Index) MatchTiers(blockSize, group int, keys []uint64) []TierMatch {
	gpu := ix.MatchKeys(blockSize, group, keys)
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := ix.tiersLocked(keysAt{blockSize, group, keys}, gpu)
	sortTierMatches(out)
	return out
}

// offloadedLocked sets the offload tiers' continuations on out[from:],
// MatchKeys' answer for blockSize and keys, and appends the engines that
// hold the prompt's first blocks only in a lower tier. Without any block
// in a lower tier it costs a look at each bank's counts. ix.mu held.
func (ix *Index) offloadedLocked(k keysAt, out []EngineMatch, from int) []EngineMatch {
	if !ix.anyLowerLocked() {
		return out
	}
	for _, tm := range ix.tiersLocked(k, out[from:]) {
		cpu, storage := tm.Blocks[TierCPU], tm.Blocks[TierStorage]
		if cpu+storage == 0 {
			continue
		}
		i := from + slices.IndexFunc(out[from:], func(m EngineMatch) bool { return m.Engine == tm.Engine })
		if i < from {
			out = append(out, EngineMatch{Engine: tm.Engine, BlockSize: k.blockSize})
			i = len(out) - 1
		}
		out[i].CPUBlocks, out[i].StorageBlocks = cpu, storage
	}
	return out
}

// anyLowerLocked reports whether some engine holds a block in an offload
// tier. ix.mu held.
func (ix *Index) anyLowerLocked() bool {
	for _, banks := range ix.tierBanks {
		for _, t := range banks {
			if t.len() > 0 {
				return true
			}
		}
	}
	return false
}

// keysAt are a prompt's block keys at one block size, in one KV-cache
// group.
type keysAt struct {
	blockSize, group int
	keys             []uint64
}

// tiersLocked is MatchTiers given MatchKeys' answer (gpu), unsorted.
// ix.mu held.
func (ix *Index) tiersLocked(k keysAt, gpu []EngineMatch) []TierMatch {
	blockSize, group, keys := k.blockSize, k.group, k.keys
	gpuOf := make(map[string]int, len(gpu))
	for _, g := range gpu {
		gpuOf[g.Engine] = g.Blocks
	}
	var out []TierMatch
	for b := range ix.banks {
		var start [64]int
		var blocks [64][numTiers]int
		mask := uint64(0)
		for s := range 64 {
			m := ix.mirrorAt(b*64 + s)
			if m == nil || ix.live[b]&m.bit == 0 {
				continue
			}
			if bs := m.groupBlockSize(group); bs != 0 && bs != blockSize {
				continue
			}
			mask |= m.bit
			start[s] = gpuOf[m.id]
			blocks[s][TierGPU] = start[s]
		}
		for t := TierCPU; t < numTiers && mask != 0; t++ {
			n := walkTier(ix.tierBanks[t-1][b], keys, &start, mask)
			for s := range 64 {
				blocks[s][t] = n[s]
				start[s] += n[s]
			}
		}
		for x := mask; x != 0; x &= x - 1 {
			s := bits.TrailingZeros64(x)
			m := ix.slots[b*64+s]
			tm := TierMatch{Engine: m.id, BlockSize: blockSize, Blocks: blocks[s]}
			if _, inGPU := gpuOf[m.id]; inGPU || tm.Total() > 0 {
				out = append(out, tm)
			}
		}
	}
	return out
}

// learnGroupLocked gives the GPU group of a self-describing offload event
// the event's block size and spec kind, if the engine has stored nothing
// in it on its GPU yet, and returns the group's key space: Match looks
// the lower tiers up at the GPU group's block size and in its key space,
// so an engine whose prefix is only offloaded (its GPU cache evicted it,
// or the gateway started after) is still a candidate for it. A GPU group that holds blocks keeps its own: offload
// events never resync the mirror. ix.mu held.
func (m *Mirror) learnGroupLocked(ev *Event) int {
	g, made := m.groupLocked(ev)
	if !made && len(g.entries) == 0 {
		g.blockSize = ev.BlockSize
	}
	g.learnKind(ev.GroupIdx, ev.SpecKind) // refused when it holds blocks of another kind
	return g.space
}

// mirrorAt is the mirror in slot i, nil when free or past the slots.
// ix.mu held.
func (ix *Index) mirrorAt(i int) *Mirror {
	if i >= len(ix.slots) {
		return nil
	}
	return ix.slots[i]
}

// walkTier returns, for the engines of one bank in mask, how many blocks
// of keys their tier (t, one bank of ix.tierBanks) holds in a row from
// their start: engines join the walk at their start block and leave it at
// the first block their tier lacks.
func walkTier(t *keyTable, keys []uint64, start *[64]int, mask uint64) (n [64]int) {
	pending, active := mask, uint64(0)
	next := func() int {
		lo := len(keys)
		for p := pending; p != 0; p &= p - 1 {
			lo = min(lo, start[bits.TrailingZeros64(p)])
		}
		return lo
	}
	join := next()
	for i := join; i < len(keys); i++ {
		if i == join {
			for p := pending; p != 0; p &= p - 1 {
				if s := bits.TrailingZeros64(p); start[s] == i {
					active |= 1 << s
					pending &^= 1 << s
				}
			}
			join = next()
		}
		if active == 0 {
			if pending == 0 {
				break
			}
			i = join - 1 // skip to the next engine's start
			continue
		}
		has := t.get(keys[i])
		for lost := active &^ has; lost != 0; lost &= lost - 1 {
			s := bits.TrailingZeros64(lost)
			n[s] = i - start[s]
		}
		active &= has
	}
	for a := active; a != 0; a &= a - 1 {
		s := bits.TrailingZeros64(a)
		n[s] = len(keys) - start[s]
	}
	return n
}

func sortTierMatches(out []TierMatch) {
	less := func(a, b TierMatch) bool {
		if a.Blocks[TierGPU]*a.BlockSize != b.Blocks[TierGPU]*b.BlockSize {
			return a.Blocks[TierGPU]*a.BlockSize > b.Blocks[TierGPU]*b.BlockSize
		}
		if a.Total()*a.BlockSize != b.Total()*b.BlockSize {
			return a.Total()*a.BlockSize > b.Total()*b.BlockSize
		}
		return a.Engine < b.Engine
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && less(out[j], out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
}

// isGPU reports whether an event's medium is the GPU cache (nil medium
// included).
func isGPU(medium string) bool {
	t, ok := tierOf(medium)
	return ok && t == TierGPU
}
