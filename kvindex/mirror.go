package kvindex

import (
	"errors"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Mirror is the index's copy of one engine's prefix cache: the engine's
// block hashes with their gateway keys and reference counts, for its GPU
// cache and the tiers it offloads to. It is written by one Feed; its
// claims are visible to queries through the Index.
//
// Scope, by design:
//   - The GPU tier is what MatchKeys and Match count. The offload tiers
//     (CPU, storage: see Tier) are kept apart and counted by MatchTiers,
//     continuing the GPU prefix. Their events without token ids apply
//     only to blocks the mirror knows by engine hash (MirrorStats.
//     TierUnknown counts the rest). Events of a medium it does not know
//     are counted in MirrorStats.OtherTier and ignored.
//   - A BlockStored whose parent is unknown (its request began before the
//     subscription or the last resync) cannot be chained to a gateway key.
//     With the engines' hashing known (MirrorConfig.Hash) its blocks are
//     kept by engine hash until a prompt recognises them (see orphans.go);
//     otherwise they are counted in Unchainable and UnknownParent and
//     skipped.
//   - Every KV-cache group is mirrored, by (group, engine hash). What a
//     prefix is credited from is the engine's full-attention group: see
//     keySpace.
//   - A block whose event says it lies in storage REMOTE to the engine
//     (locality, vLLM #48281) is not the engine's: see isRemote.
type Mirror struct {
	ix   *Index
	id   string
	slot int
	bank int
	bit  uint64
	now  func() time.Time

	// wmu serialises writers: the Feed, Reset, SetCapacity, RemoveEngine.
	wmu     sync.Mutex
	removed atomic.Bool
	kh      keyHasher // used with wmu held

	// Guarded by ix.mu, written with wmu held as well.
	groups  []*group              // by group index; nil for groups not seen
	multi   map[uint64]uint32     // keys claimed by more than one engine hash: extra claims
	multiHi int                   // most entries multi held since it was made
	hash    EngineHash            // the engines' hashing, for orphans
	orphans orphanSet             // orphan blocks by engine hash (group 0)
	tiers   [lowerTiers]lowerTier // the offload tiers' blocks, CPU first
	health  eventHealth           // recent BlockStored outcomes, for Trusted
	blocks  int
	userCap int
	stamp   uint32
	st      MirrorStats

	verify verifier
	rank   int // MirrorConfig.Rank; checked when hasRank
	// hasRank: batches must carry rank (MirrorConfig.HasRank).
	hasRank bool
}

// group is one KV-cache group of an engine.
type group struct {
	blockSize int
	// kind is the group's kv_cache_spec_kind as its events name it, ""
	// until one does; space is the key space its chains root at
	// (keySpace): 0 for the group a prefix is credited from.
	kind    string
	space   int
	entries map[uint64]blockEntry // engine block hash → entry
	// entriesHi is the most entries held since the map was made: Go maps
	// never give memory back, so one that has shrunk well below it is
	// rebuilt (see shrinkMap).
	entriesHi int
	// fifo holds (hash, stamp) in insertion order for oldest-first
	// eviction; items whose entry is gone or re-stored are stale and
	// skipped. Struct-of-arrays to keep it at 12 bytes per block.
	fifoH []uint64
	fifoS []uint32
	head  int
}

type blockEntry struct {
	key   uint64 // gateway key
	refs  uint32 // times stored without being removed
	stamp uint32 // insertion stamp, matches its fifo item
}

func newGroup(idx, blockSize int) *group {
	return &group{blockSize: blockSize, space: idx, entries: make(map[uint64]blockEntry)}
}

// nonPrefixSpace offsets the key spaces of groups whose kind is known not
// to hold a prefix on its own, past every group index.
const nonPrefixSpace = maxGroupIdx

// keySpace is the key space (the root of its chained gateway keys, see
// rootKey) of group idx whose layers are of the given kv_cache_spec_kind.
// Queries match space 0 (Query.Group), so it decides what a prefix is
// credited from.
//
// The rule follows what vLLM itself needs for a prefix hit on a hybrid
// model (vllm/v1/core/kv_cache_coordinator.py, HybridKVCacheCoordinator.
// find_longest_cache_hit, read at vLLM commit 00b08dc4; the per-kind rules
// in single_type_kv_cache_manager.py): the hit is the longest prefix the
// full-attention groups hold (groups of one spec are looked up together),
// cut back further to where the sliding-window group also holds the last
// window of blocks before it (a Mamba group, its state block there). A
// sliding-window or Mamba group holding a prefix is never a hit without
// the full-attention group, and vLLM does not keep it beyond its window
// anyway. So:
//   - full_attention, mla_attention and sink_full_attention groups (vLLM's
//     KVCacheSpecKind for attention over the whole prefix) are space 0:
//     they are what is credited. Several such groups are credited where
//     any holds the block (vLLM needs all; they are allocated and freed
//     together, so they part only by eviction order).
//   - A model whose only group is sliding-window (vLLM's
//     UnitaryKVCacheCoordinator) is not credited either: its hits depend
//     on the window alone, which the index does not model.
//   - Every other known kind (sliding_window, sliding_window_mla, mamba,
//     chunked_local_attention, cross_attention...) gets a space of its
//     own, past every group index: mirrored, never matched.
//   - A group whose events name no kind (vLLM before #40984) or
//     "unknown" keeps space = its index, as before: group 0 is what is
//     credited, so engines of older releases route as they did.
//
// The credit is thus an upper bound of vLLM's hit on hybrid models: the
// sliding-window group's last window is not checked (it would take the
// prompt's keys a second time per request, in that group's space).
func keySpace(idx int, kind string) int {
	switch strings.ToLower(kind) {
	case "full_attention", "mla_attention", "sink_full_attention":
		return 0
	case "", "unknown":
		return idx
	}
	return nonPrefixSpace + idx
}

// learnKind records the spec kind of group idx from an event naming one.
// It reports false, changing nothing, when the group holds blocks keyed in
// another space or under another kind: the engine was reconfigured.
func (g *group) learnKind(idx int, kind string) bool {
	if kind == "" || strings.EqualFold(kind, g.kind) {
		return true
	}
	sp := keySpace(idx, kind)
	if len(g.entries) > 0 && (g.kind != "" || sp != g.space) {
		return false
	}
	g.kind, g.space = kind, sp
	return true
}

// isRemote reports whether ev's blocks lie in storage remote to the
// publishing engine. vLLM #48281 (vllm/v1/kv_offload/base.py, Locality)
// adds locality to the events of its storage tiers: LOCAL, the storage is
// local to that instance; REMOTE, it is not; absent, unspecified. The
// field says nothing of who can reach the block or how fast, so the
// conservative reading is taken: a REMOTE block is not a hit on the engine
// that published it. Such events change nothing and are counted
// (MirrorStats.Remote); a REMOTE BlockRemoved in particular never removes
// the engine's own (LOCAL or unspecified) copy of the same hash.
func isRemote(ev *Event) bool { return strings.EqualFold(ev.Locality, "REMOTE") }

// MirrorStats describes one engine's mirror.
type MirrorStats struct {
	Engine string
	// Connected is true between the Feed's Connected and Disconnected.
	Connected bool
	LastError string
	// LastSeq is the last applied message sequence number (HasSeq false
	// before the first message since Connected).
	LastSeq     uint64
	HasSeq      bool
	LastMessage time.Time
	// LastLag is how late the last batch was applied: the time it was
	// applied minus its ts, the engine's clock when it published it (so
	// it includes any clock skew between the hosts); 0 for a batch
	// without a ts.
	LastLag time.Duration
	// Blocks is the number of distinct blocks held; Capacity the bound
	// they are evicted at; BlockSize the block size of the group prefixes
	// are credited from (see keySpace; else of the lowest group seen), 0
	// until a BlockStored arrives.
	Blocks    int
	Capacity  int
	BlockSize int
	// Events applied, by type, and events skipped for unknown tags.
	Stored, Removed, Cleared, Unknown uint64
	DecodeErrors                      uint64
	LastDecodeError                   string
	// Unchainable counts blocks skipped because their parent was unknown
	// and the engines' hashing is not (UnknownParent counts their
	// events); Malformed, events skipped because len(token_ids) was not
	// len(block_hashes)*block_size; OtherTier, events for a non-GPU medium;
	// RemovedUnknown, removals of blocks not mirrored; Evicted, blocks
	// dropped for capacity. Unapplied sums them up by reason.
	Unchainable, UnknownParent, Malformed, OtherTier, RemovedUnknown, Evicted uint64
	// TierBlocks is how many blocks each offload tier holds, indexed by
	// Tier (TierGPU's is Blocks). TierUnknown counts offload-tier blocks
	// not applied because neither their engine hash (an event without
	// token ids) nor their parent was known; TierOverflow, those refused
	// because their tier of this engine was full (maxLowerBlocks).
	TierBlocks                [numTiers]int
	TierUnknown, TierOverflow uint64
	// OrphanEvents counts BlockStored events whose parent was unknown,
	// kept by engine hash for recognition (see MirrorConfig.Hash); Orphans
	// is how many engine hashes are kept now, OrphansEvicted how many were
	// dropped for capacity, and Recognized how many blocks prompts have
	// recognised and adopted into the mirror.
	OrphanEvents, OrphansEvicted, Recognized uint64
	Orphans                                  int
	// WrongRank counts batches skipped because their data_parallel_rank
	// was not the mirror's (MirrorConfig.Rank).
	WrongRank uint64
	// Remote counts BlockStored and BlockRemoved events skipped because
	// their locality was REMOTE (see isRemote).
	Remote uint64
	// Trusted is false while most recent BlockStored events could not be
	// applied: routing then treats the engine as one without events.
	Trusted bool
	// GapsFilled counts sequence gaps the replay endpoint filled, with
	// Replayed messages; a gap it could not fill is Resyncs["gap"].
	GapsFilled, Replayed uint64
	// Backfills counts subscriptions that asked the replay endpoint for
	// what the engine buffered before them (FeedConfig.Backfill);
	// Backfilled counts the messages applied.
	Backfills, Backfilled uint64
	LastReplayError       string
	// Resyncs counts full resets by reason: "subscribe", "gap",
	// "restart", "cleared", "decode", "disconnect", "block_size",
	// "spec_kind" (a group's kv_cache_spec_kind changed),
	// "backfill" (a hole in the replay buffer at subscription),
	// "manual".
	Resyncs          map[string]uint64
	LastResync       time.Time
	LastResyncReason string
	Verify           VerifyStats
}

func newMirror(ix *Index, id string, slot int, cfg MirrorConfig) *Mirror {
	m := &Mirror{
		ix: ix, id: id, slot: slot, bank: slot / 64, bit: 1 << (slot % 64),
		now:     time.Now,
		userCap: cfg.Capacity,
	}
	m.st.Engine = id
	m.st.Resyncs = make(map[string]uint64)
	m.hash = cfg.Hash
	m.rank, m.hasRank = cfg.Rank, cfg.HasRank
	m.verify.now = time.Now
	m.verify.setConfig(cfg.Verify)
	return m
}

// ID returns the engine id.
func (m *Mirror) ID() string { return m.id }

// Stats returns a snapshot of the mirror's statistics.
func (m *Mirror) Stats() MirrorStats {
	m.ix.mu.RLock()
	st := m.st
	st.Resyncs = maps.Clone(m.st.Resyncs)
	st.Blocks = m.blocks
	st.Capacity = m.capacityLocked()
	st.BlockSize = m.blockSizeLocked()
	st.Orphans = m.orphans.len()
	st.Trusted = m.health.trusted()
	for i := range m.tiers {
		st.TierBlocks[i+1] = m.tiers[i].len()
	}
	m.ix.mu.RUnlock()
	st.Verify = m.verify.stats()
	return st
}

// Connected reports whether the engine's events are live: the Feed is
// between Connected and Disconnected, so the mirror follows the engine
// and its blocks can be trusted for routing.
func (m *Mirror) Connected() bool {
	m.ix.mu.RLock()
	defer m.ix.mu.RUnlock()
	return m.st.Connected
}

// Trusted reports whether the mirror's recent BlockStored events were
// mostly applied (or kept for recognition). A subscription whose events
// arrive but cannot be used — their parents unknown and the engines'
// hashing not configured, or malformed — leaves the mirror blind to what
// the engine holds while it looks live; routing treats such an engine as
// one without events until its events apply again.
func (m *Mirror) Trusted() bool {
	m.ix.mu.RLock()
	defer m.ix.mu.RUnlock()
	return m.health.trusted()
}

// State is Connected and Trusted read together, under one lock: what
// routing asks of every candidate of every request.
func (m *Mirror) State() (connected, trusted bool) {
	m.ix.mu.RLock()
	defer m.ix.mu.RUnlock()
	return m.st.Connected, m.health.trusted()
}

// BlockSize returns the engine's block size as announced by its events
// (of the group prefixes are credited from, see keySpace; else of the
// lowest group seen), or 0 before the first BlockStored.
func (m *Mirror) BlockSize() int {
	m.ix.mu.RLock()
	defer m.ix.mu.RUnlock()
	return m.blockSizeLocked()
}

// Fill reports how many blocks the mirror holds and the most it may hold
// (the engine's num_gpu_blocks once known, else the index's bound): a
// full engine evicts a cached block for every new one it stores.
func (m *Mirror) Fill() (blocks, capacity int) {
	m.ix.mu.RLock()
	defer m.ix.mu.RUnlock()
	return m.blocks, m.capacityLocked()
}

func (m *Mirror) blockSizeLocked() int {
	if bs := m.groupBlockSize(0); bs != 0 {
		return bs
	}
	for _, g := range m.groups {
		if g != nil {
			return g.blockSize
		}
	}
	return 0
}

// groupBlockSize is the block size of the lowest group keyed in the given
// key space (keySpace; a query's Group), 0 when none is. ix.mu held.
func (m *Mirror) groupBlockSize(space int) int {
	for _, g := range m.groups {
		if g != nil && g.space == space {
			return g.blockSize
		}
	}
	return 0
}

// SetCapacity sets the most blocks the engine can hold (num_gpu_blocks);
// n <= 0 means unknown. The index's MaxBlocksPerEngine applies either way.
// Blocks beyond the new capacity are evicted oldest first.
func (m *Mirror) SetCapacity(n int) {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.ix.mu.Lock()
	defer m.ix.mu.Unlock()
	m.userCap = n
	for m.blocks > m.capacityLocked() && m.evictOldestLocked() {
	}
}

func (m *Mirror) capacityLocked() int {
	c := m.ix.cfg.MaxBlocksPerEngine
	if m.userCap > 0 && m.userCap < c {
		c = m.userCap
	}
	return c
}

// SetVerify replaces the hash verification settings and resets its
// counters.
func (m *Mirror) SetVerify(cfg VerifyConfig) { m.verify.setConfig(cfg) }

// Reset drops every block of the mirror, counted as a resync with the given
// reason; the groups' spec kinds are forgotten. The Feed resets on its
// own; this is for callers that learn of an engine restart some other way.
func (m *Mirror) Reset(reason string) {
	if reason == "" {
		reason = "manual"
	}
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.clear(reason)
}

// clear empties the mirror and withdraws its claims from the index. The
// engine is hidden from queries first, so no query sees a half-cleared
// mirror, then its claims are withdrawn in chunks so a large mirror does
// not stall queries. Callers hold wmu, not ix.mu.
func (m *Mirror) clear(reason string) {
	ix := m.ix
	ix.mu.Lock()
	if m.removed.Load() {
		// Empty already, and its slot may belong to another engine now.
		ix.mu.Unlock()
		return
	}
	old := m.groups
	m.groups = make([]*group, len(old))
	for i, g := range old {
		if g != nil {
			// The block size is kept, the spec kind learnt anew: the
			// engine may come back as another model or release.
			m.groups[i] = newGroup(i, g.blockSize)
		}
	}
	m.multi, m.multiHi = nil, 0
	m.blocks = 0
	m.dropOrphansLocked()
	oldTiers := m.tiers
	m.tiers = [lowerTiers]lowerTier{}
	m.health = eventHealth{}
	wasLive := ix.live[m.bank]&m.bit != 0
	ix.live[m.bank] &^= m.bit
	if reason != "removed" {
		m.st.Resyncs[reason]++
		m.st.LastResync = m.now()
		m.st.LastResyncReason = reason
	}
	ix.mu.Unlock()
	// A reset engine will not store what it was predicted to. Hidden, it
	// has no predictions a Match counts, so they go in steps, after the
	// lock; the engine is shown again only once they are gone.
	ix.spec.dropSteps(m.slot, nil)

	const chunk = 4096
	buf := make([]uint64, 0, chunk)
	flush := func() {
		ix.mu.Lock()
		bank := ix.banks[m.bank]
		for _, k := range buf {
			bank.andNot(k, m.bit)
		}
		ix.mu.Unlock()
		buf = buf[:0]
	}
	for _, g := range old {
		if g == nil {
			continue
		}
		for _, e := range g.entries {
			buf = append(buf, e.key)
			if len(buf) == chunk {
				flush()
			}
		}
	}
	flush()
	m.withdrawLower(&oldTiers)
	if wasLive {
		ix.mu.Lock()
		if !m.removed.Load() {
			ix.live[m.bank] |= m.bit
		}
		ix.mu.Unlock()
	}
}

// eventHealth is the share of recent BlockStored events a mirror could not
// use, counted with a decay: halved every 128 events past 256, so it
// speaks of the last few hundred.
type eventHealth struct{ all, bad uint32 }

func (h *eventHealth) note(ok bool) {
	h.all++
	if !ok {
		h.bad++
	}
	if h.all >= 256 {
		h.all, h.bad = h.all/2, h.bad/2
	}
}

// trusted is false once at least 16 recent events were seen and more than
// half of them were unusable.
func (h eventHealth) trusted() bool { return h.all < 16 || 2*h.bad <= h.all }

// Unapplied is the mirror's events that changed nothing, by reason:
// "unknown_parent" (BlockStored whose parent it never saw, the engines'
// hashing unknown), "malformed", "other_tier" (a medium it does not
// know), "tier_unknown_block" and "tier_overflow" (offload-tier blocks,
// counted per block: see MirrorStats.TierUnknown), "unknown_type" (event
// tags it does not know) and "decode_error" (payloads, each of one or
// more events, that failed to decode), "wrong_rank" (batches, each of
// one or more events, of another data-parallel rank) and "remote" (events
// whose blocks lie in storage remote to the engine).
func (s MirrorStats) Unapplied() map[string]uint64 {
	return map[string]uint64{
		"unknown_parent":     s.UnknownParent,
		"malformed":          s.Malformed,
		"other_tier":         s.OtherTier,
		"tier_unknown_block": s.TierUnknown,
		"tier_overflow":      s.TierOverflow,
		"unknown_type":       s.Unknown,
		"decode_error":       s.DecodeErrors,
		"wrong_rank":         s.WrongRank,
		"remote":             s.Remote,
	}
}

// SetHash replaces the engines' hashing used to recognise orphan blocks;
// orphans kept under the old one are dropped.
func (m *Mirror) SetHash(h EngineHash) {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.ix.mu.Lock()
	defer m.ix.mu.Unlock()
	if m.hash == h {
		return
	}
	m.hash = h
	m.dropOrphansLocked()
}

// apply applies one decoded batch received with sequence number seq.
// Callers hold wmu.
func (m *Mirror) apply(seq uint64, b *Batch) {
	if m.removed.Load() {
		return
	}
	ix := m.ix
	ix.mu.Lock()
	m.st.LastSeq, m.st.HasSeq, m.st.LastMessage = seq, true, m.now()
	m.st.LastLag = 0
	if b.TS > 0 && b.TS < 1e11 { // seconds since 1970, before the year 5138
		m.st.LastLag = m.st.LastMessage.Sub(time.Unix(0, int64(b.TS*1e9)))
	}
	if m.hasRank && b.HasDPRank && b.DPRank != m.rank {
		m.st.WrongRank++
		ix.mu.Unlock()
		return
	}
	m.st.Unknown += uint64(b.Unknown)
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case EventAllBlocksCleared:
			m.st.Cleared++
			ix.mu.Unlock()
			m.clear("cleared")
			ix.mu.Lock()
		case EventBlockStored:
			m.st.Stored++
			if isRemote(ev) {
				m.st.Remote++
				continue
			}
			if reason := m.storeLocked(ev); reason != "" {
				// The group's block size or spec kind changed: the
				// engine was reconfigured under us. Start over.
				ix.mu.Unlock()
				m.clear(reason)
				ix.mu.Lock()
				m.storeLocked(ev)
			}
		case EventBlockRemoved:
			m.st.Removed++
			if isRemote(ev) {
				m.st.Remote++
				continue
			}
			m.removeLocked(ev)
		}
	}
	ix.mu.Unlock()
}

// storeLocked applies a BlockStored. It returns the reason to resync,
// changing nothing, if the event's block size or spec kind differs from
// the one its group holds blocks of ("block_size", "spec_kind"), else "".
func (m *Mirror) storeLocked(ev *Event) string {
	switch t, ok := tierOf(ev.Medium); {
	case !ok:
		m.st.OtherTier++
		return ""
	case t != TierGPU:
		m.storeLowerLocked(t, ev)
		return ""
	}
	n, bs := len(ev.BlockHashes), ev.BlockSize
	if n == 0 {
		return ""
	}
	// Checked before slicing: masked blocks (vLLM #44451) can make
	// token_ids span blocks that have no hash.
	if bs <= 0 || len(ev.TokenIDs) != n*bs {
		m.st.Malformed++
		m.health.note(false)
		return ""
	}
	g, reason := m.groupForLocked(ev)
	if reason != "" {
		return reason
	}
	key := rootKey(g.space)
	if ev.HasParent {
		e, ok := g.entries[ev.Parent]
		if !ok {
			m.keepOrphanLocked(ev)
			return ""
		}
		key = e.key
	}
	m.ix.noteLoRALocked(ev.LoRAName)
	for i := 0; i < n; i++ {
		var err error
		// Before extra_keys existed (vLLM < #33304) the LoRA name was
		// still hashed on every block (blockExtra); salt and multimodal
		// keys are unknowable then.
		if key, err = m.kh.next(key, ev.TokenIDs[i*bs:(i+1)*bs], blockExtra(ev, i)); err != nil {
			m.st.Malformed++
			m.health.note(false)
			return ""
		}
		m.pauseLocked(i)
		m.addLocked(g, ev.BlockHashes[i], key)
		if ev.GroupIdx == 0 && m.orphans.len() > 0 {
			// Stored again with a known parent: no longer an orphan.
			m.removeOrphanLocked(ev.BlockHashes[i])
		}
	}
	m.health.note(true)
	return ""
}

// groupLocked returns the GPU group of ev's group index, made with the
// event's block size if new (made true).
func (m *Mirror) groupLocked(ev *Event) (g *group, made bool) {
	for len(m.groups) <= ev.GroupIdx {
		m.groups = append(m.groups, nil)
	}
	if g = m.groups[ev.GroupIdx]; g == nil {
		g, made = newGroup(ev.GroupIdx, ev.BlockSize), true
		m.groups[ev.GroupIdx] = g
	}
	return g, made
}

// groupForLocked returns the GPU group of a BlockStored of block size
// ev.BlockSize > 0, made if new, its block size and spec kind learnt; or
// the reason to resync when they differ from those of the blocks it holds.
func (m *Mirror) groupForLocked(ev *Event) (*group, string) {
	g, _ := m.groupLocked(ev)
	if g.blockSize != ev.BlockSize {
		if len(g.entries) > 0 {
			return nil, "block_size"
		}
		g.blockSize = ev.BlockSize
	}
	if !g.learnKind(ev.GroupIdx, ev.SpecKind) {
		return nil, "spec_kind"
	}
	return g, ""
}

// pauseLocked lets the index's readers in after every lockStep blocks of
// an event: an event of 512 blocks (a prefill chunk of 8192 tokens) held
// the write lock for 0.2-0.5 ms, and every other request's Match waited
// (in a test beside a steady stream of them, Match's p50 went from 7 to
// 222 us). done is how many blocks of the event are applied; there is no
// pause before the first. Callers hold
// wmu and ix.mu for writing. The mirror's own state changes only under
// wmu, which stays held; readers see the event half applied, as they
// would had the engine sent it in two.
func (m *Mirror) pauseLocked(done int) {
	if done == 0 || done%lockStep != 0 {
		return
	}
	m.ix.mu.Unlock()
	if f := m.ix.betweenSteps; f != nil {
		f()
	}
	m.ix.mu.Lock()
}

func (m *Mirror) addLocked(g *group, h, key uint64) {
	if e, ok := g.entries[h]; ok {
		e.refs++
		g.entries[h] = e
		return
	}
	if m.blocks >= m.capacityLocked() {
		m.evictOldestLocked()
	}
	m.stamp++
	g.entries[h] = blockEntry{key: key, refs: 1, stamp: m.stamp}
	g.entriesHi = max(g.entriesHi, len(g.entries))
	g.fifoH = append(g.fifoH, h)
	g.fifoS = append(g.fifoS, m.stamp)
	m.blocks++
	if old := m.ix.banks[m.bank].or(key, m.bit); old&m.bit != 0 {
		// Another engine hash of this engine already claims the key
		// (extra keys the events do not show): count it so the claim
		// outlives either of them.
		if m.multi == nil {
			m.multi = make(map[uint64]uint32)
		}
		m.multi[key]++
		m.multiHi = max(m.multiHi, len(m.multi))
	}
	m.ix.spec.end(m.slot, key, outConfirmed) // a prediction come true
	if len(g.fifoH) >= fifoLimit(len(g.entries)) {
		g.compact()
	}
}

// fifoLimit is the fifo length at which a group of n entries compacts its
// fifo: when consumed and stale items are half as many as the live ones.
// Inserts make the fifo reach it, deletes bring it down; either way, at
// least a third of the items a compaction scans died since the last one,
// each by an insert, a delete or an eviction: amortised O(1) per
// operation. A limit of 2n scanned less but held up to 2.25 items per
// block at 12 bytes each; this one holds at most 1.7.
func fifoLimit(n int) int { return n + n/2 + 1024 }

func (m *Mirror) dropLocked(g *group, h uint64, e blockEntry) {
	delete(g.entries, h)
	g.entries, g.entriesHi = shrinkMap(g.entries, g.entriesHi)
	if len(g.fifoH) >= fifoLimit(len(g.entries)) {
		// A group that gives way to another may see no insert again.
		g.compact()
	}
	m.blocks--
	if c := m.multi[e.key]; c > 0 {
		if c == 1 {
			delete(m.multi, e.key)
			m.multi, m.multiHi = shrinkMap(m.multi, m.multiHi)
		} else {
			m.multi[e.key] = c - 1
		}
		return
	}
	// No speculative entry to end: the key is in the engine's bank from
	// its store (which confirmed any) until here, and Predict leaves out
	// keys the engine holds.
	m.ix.banks[m.bank].andNot(e.key, m.bit)
}

// shrinkMap returns mp rebuilt at its size if it holds a quarter or less
// of hi, the most it held since it was made, and hi updated. A Go map
// keeps the memory of its largest size; a mirror's maps shrink when a
// KV-cache group gives way to another or the engine's capacity drops.
// Amortised O(1) per delete: the rebuild copies at most a third of the
// deletes since hi.
func shrinkMap[V any](mp map[uint64]V, hi int) (map[uint64]V, int) {
	const minHi = 1024 // small maps are not worth rebuilding
	n := len(mp)
	if hi < minHi || 4*n > hi {
		return mp, hi
	}
	out := make(map[uint64]V, n) // maps.Clone would keep mp's size
	maps.Copy(out, mp)
	return out, n
}

func (m *Mirror) removeLocked(ev *Event) {
	switch t, ok := tierOf(ev.Medium); {
	case !ok:
		m.st.OtherTier++
		return
	case t != TierGPU:
		m.removeLowerLocked(t, ev)
		return
	}
	var g *group
	if ev.GroupIdx < len(m.groups) {
		g = m.groups[ev.GroupIdx]
	}
	for i, h := range ev.BlockHashes {
		m.pauseLocked(i)
		var e blockEntry
		ok := false
		if g != nil {
			e, ok = g.entries[h]
		}
		if !ok {
			if ev.GroupIdx != 0 || !m.removeOrphanLocked(h) {
				m.st.RemovedUnknown++
			}
			continue
		}
		if e.refs > 1 {
			e.refs--
			g.entries[h] = e
			continue
		}
		m.dropLocked(g, h, e)
	}
}

// evictOldestLocked drops the block stored longest ago, across groups. It
// reports whether there was one.
func (m *Mirror) evictOldestLocked() bool {
	var oldest *group
	for _, g := range m.groups {
		if g == nil || !g.skipStale() {
			continue
		}
		if oldest == nil || int32(g.fifoS[g.head]-oldest.fifoS[oldest.head]) < 0 {
			oldest = g
		}
	}
	if oldest == nil {
		return false
	}
	h := oldest.fifoH[oldest.head]
	oldest.head++
	m.dropLocked(oldest, h, oldest.entries[h])
	m.st.Evicted++
	return true
}

// skipStale advances the fifo head to the oldest live item and reports
// whether there is one.
func (g *group) skipStale() bool {
	for g.head < len(g.fifoH) {
		if e, ok := g.entries[g.fifoH[g.head]]; ok && e.stamp == g.fifoS[g.head] {
			return true
		}
		g.head++
	}
	return false
}

// compact drops consumed and stale fifo items (see fifoLimit). It leaves
// the fifo room to grow to its next compaction and not much more: append's
// growth would overshoot that by up to a quarter, and a group that shrank
// would keep the fifo of its largest size.
func (g *group) compact() {
	j := 0
	for i := g.head; i < len(g.fifoH); i++ {
		h, s := g.fifoH[i], g.fifoS[i]
		if e, ok := g.entries[h]; ok && e.stamp == s {
			g.fifoH[j], g.fifoS[j] = h, s
			j++
		}
	}
	g.fifoH, g.fifoS, g.head = g.fifoH[:j], g.fifoS[:j], 0
	// Sized for the next compaction at the current size with some slack,
	// so that a group whose size wavers is not reallocated every time.
	lo := fifoLimit(len(g.entries)) + 1
	if c := cap(g.fifoH); c < lo || c > lo+lo/4 {
		want := lo + lo/8
		g.fifoH = append(make([]uint64, 0, want), g.fifoH...)
		g.fifoS = append(make([]uint32, 0, want), g.fifoS...)
	}
}

// noteDecodeError counts a payload that failed to decode.
func (m *Mirror) noteDecodeError(seq uint64, err error) {
	m.ix.mu.Lock()
	m.st.DecodeErrors++
	m.st.LastDecodeError = err.Error()
	m.st.LastSeq, m.st.HasSeq, m.st.LastMessage = seq, true, m.now()
	m.ix.mu.Unlock()
}

func (m *Mirror) noteReplay(filled bool, replayed uint64, err error) {
	m.ix.mu.Lock()
	if filled {
		m.st.GapsFilled++
	}
	m.st.Replayed += replayed
	if err != nil && !filled {
		m.st.LastReplayError = err.Error()
	}
	m.ix.mu.Unlock()
}

// noteBackfill records a subscription's backfill (Feed.backfill): how many
// messages it applied and how the replay ended.
func (m *Mirror) noteBackfill(applied uint64, err error) {
	m.ix.mu.Lock()
	defer m.ix.mu.Unlock()
	m.st.Backfills++
	m.st.Backfilled += applied
	if err != nil && !errors.Is(err, errReplayDone) {
		m.st.LastReplayError = "backfill: " + err.Error()
	}
}

func (m *Mirror) setConnected(c bool, err error) {
	m.ix.mu.Lock()
	m.st.Connected = c
	if c {
		m.st.HasSeq = false
	}
	if err != nil {
		m.st.LastError = err.Error()
	}
	m.ix.mu.Unlock()
}
