package kvindex

import (
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// ApproxConfig configures an ApproxTree.
type ApproxConfig struct {
	// ChunkBytes is the granularity of prefixes (default 64 bytes).
	ChunkBytes int
	// TTL is how long an engine is assumed to keep a prefix it served
	// (default 5 minutes).
	TTL time.Duration
	// MaxNodes bounds the tree (default 1<<18 chunks, about 16 MiB of
	// distinct prefix text at 64-byte chunks); the least recently used
	// chunks are evicted beyond it.
	MaxNodes int
	// MaxChunks bounds the chunks of one text considered (default 4096);
	// longer texts are matched and recorded up to that prefix.
	MaxChunks int
	// Now is the time source (default time.Now), injectable for tests; it
	// is read as the speculative entries read theirs (see clock).
	Now func() time.Time
}

// ApproxTree is the fallback prefix index for engines without KV events
// or whose events are stale: it records which engines recently served which
// text prefixes, assuming a served prompt stays cached for a while. It is a
// trie over fixed-size chunks of the request text, stored as a map from
// each chunk's chained hash (which stands for the whole path to it) to the
// engines that saw it. It is safe for concurrent use.
//
// Nothing in the tree is a Go pointer: nodes live in one slice and link to
// each other by index, and so do their engine records. The garbage
// collector does not scan memory without pointers, and the tree lives as
// long as the process: with a pointer per node, link and record, a tree
// at its default bound cost every collection ~20 ms of CPU, more than the
// rest of a gateway's heap (BenchmarkApproxTreeGC).
type ApproxTree struct {
	cfg   ApproxConfig
	clock *clock // the index's time policy; its times are the slab's
	hash  chunkHasher

	mu    sync.RWMutex
	nodes map[uint64]int32 // chunk hash → index in slab
	// slab holds the nodes. slab[0] is the sentinel of the doubly linked
	// LRU list, most recently inserted first; freed nodes are chained
	// through next from freeNode (0 when there are none).
	slab     []approxNode
	freeNode int32
	// seen holds the nodes' engine records, each node's chained through
	// next from its seen (0 ends a chain; seen[0] is never used); freed
	// records are chained from freeSeen.
	seen     []approxSeen
	freeSeen int32
	engines  map[string]uint16
	names    []string // by engine index; "" is free

	// betweenSteps, when set (by tests), runs between an Insert's steps
	// (see pauseLocked), with the lock released.
	betweenSteps func()
}

type approxNode struct {
	key        uint64
	newest     int64 // unix nanos of the latest insert through this node
	prev, next int32 // in the LRU list (or next in the free list)
	seen       int32 // the first of the node's engine records, 0 if none
}

// approxSeen records that an engine was sent a prompt through a node.
type approxSeen struct {
	at     int64 // unix nanos
	next   int32 // the node's next record (or the next free one), 0 if none
	engine uint16
}

// ApproxMatch is how much of a text an engine served recently.
type ApproxMatch struct {
	Engine string
	// Bytes is the length of the longest recorded prefix, in whole
	// chunks (or the whole text when it matched to its end).
	Bytes int
}

// NewApproxTree returns an empty tree.
func NewApproxTree(cfg ApproxConfig) *ApproxTree {
	if cfg.ChunkBytes <= 0 {
		cfg.ChunkBytes = 64
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 5 * time.Minute
	}
	if cfg.MaxNodes <= 0 {
		cfg.MaxNodes = 1 << 18
	}
	if cfg.MaxChunks <= 0 {
		cfg.MaxChunks = 4096
	}
	// Nodes are indexed by int32: the bound and the chunks of one insert
	// over it must fit.
	cfg.MaxNodes, cfg.MaxChunks = min(cfg.MaxNodes, 1<<30), min(cfg.MaxChunks, 1<<20)
	t := &ApproxTree{cfg: cfg, clock: newClock(cfg.Now), hash: newChunkHasher(), engines: make(map[string]uint16)}
	t.clearLocked()
	return t
}

// clearLocked empties the tree's nodes: made anew rather than kept, so
// that a tree that held many prompts once does not keep their memory.
func (t *ApproxTree) clearLocked() {
	t.nodes = make(map[uint64]int32)
	t.slab, t.freeNode = make([]approxNode, 1), 0
	t.seen, t.freeSeen = make([]approxSeen, 1), 0
}

// chunkKeys returns the chained hashes of text's chunks, the last possibly
// partial, in a buffer from chunkBufs: give it back with putChunkKeys.
// (At the default bounds a long prompt has 4096 chunks: a fresh 32 KiB
// per Match and per Insert, on every request, before they were pooled.)
func (t *ApproxTree) chunkKeys(text string) *[]uint64 {
	n := (len(text) + t.cfg.ChunkBytes - 1) / t.cfg.ChunkBytes
	n = min(n, t.cfg.MaxChunks)
	p := chunkBufs.Get().(*[]uint64)
	keys := (*p)[:0]
	key := t.hash.start
	for i := 0; i < n; i++ {
		key = t.hash.hash(key, text[i*t.cfg.ChunkBytes:t.chunkEnd(i, len(text))])
		keys = append(keys, key)
	}
	*p = keys
	return p
}

// chunkEnd is the byte length key i of a text of n bytes covers.
func (t *ApproxTree) chunkEnd(i, n int) int { return min((i+1)*t.cfg.ChunkBytes, n) }

// chunkBufs are the chunk-key buffers of Match and Insert; see chunkKeys.
var chunkBufs = sync.Pool{New: func() any { return new([]uint64) }}

func putChunkKeys(p *[]uint64) {
	if cap(*p) <= 1<<16 { // at most 512 KiB kept, for a tree configured larger than the default
		chunkBufs.Put(p)
	}
}

// Insert records that engine served text (its prompt, typically).
func (t *ApproxTree) Insert(text, engine string) {
	if text == "" || engine == "" {
		return
	}
	kp := t.chunkKeys(text)
	defer putChunkKeys(kp)
	keys := *kp
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.monotonic()
	eng, ok := t.engineLocked(engine)
	if !ok {
		return
	}
	// Leaf first, so the root ends up most recently used: eviction
	// takes leaves before the prefixes that lead to them. The leading
	// chunks this engine was recorded through within the last
	// refreshEvery are left as they are: a long prompt behind a shared
	// prefix then costs a few lookups and its new tail, not a lookup
	// and a relink per chunk (an 8k-token prompt has ~700).
	fresh := t.freshPrefix(keys, eng, now-int64(t.refreshEvery()))
	for j, n := len(keys)-1, 0; j >= fresh; j, n = j-1, n+1 {
		if n > 0 && n%lockStep == 0 && !t.pauseLocked(engine, eng) {
			return // the engine was removed meanwhile
		}
		k := keys[j]
		i, ok := t.nodes[k]
		if !ok {
			i = t.newNodeLocked(k)
		} else {
			t.unlinkLocked(i)
		}
		t.pushFrontLocked(i)
		t.slab[i].newest = now
		t.markSeenLocked(i, eng, now)
	}
	t.expireLocked(now)
}

// engineLocked returns engine's index, giving it one if it has none;
// false when every index is taken.
func (t *ApproxTree) engineLocked(engine string) (uint16, bool) {
	if eng, ok := t.engines[engine]; ok {
		return eng, true
	}
	i := slices.Index(t.names, "")
	if i < 0 {
		if len(t.names) > 1<<16-1 {
			return 0, false // more engines than anyone runs; ignore
		}
		t.names = append(t.names, "")
		i = len(t.names) - 1
	}
	t.names[i] = engine
	t.engines[engine] = uint16(i)
	return uint16(i), true
}

// pauseLocked lets the tree's readers in after every lockStep chunks an
// Insert records: a new prompt of the default 4096 chunks held the lock
// ~0.8 ms, and every match on the approximate tier waited. A reader sees
// the prompt's end recorded without its start, which matches nothing, as
// a match needs the first chunk. It reports whether eng still stands for
// engine (RemoveEngine may have freed it meanwhile). t.mu held for
// writing.
func (t *ApproxTree) pauseLocked(engine string, eng uint16) bool {
	t.mu.Unlock()
	if f := t.betweenSteps; f != nil {
		f()
	}
	t.mu.Lock()
	e, ok := t.engines[engine]
	return ok && e == eng
}

// refreshEvery is how stale a node's record of an engine may be before
// Insert records it again: a second, or an eighth of the TTL when that is
// shorter. Match cannot tell the difference (it counts whole TTLs).
func (t *ApproxTree) refreshEvery() time.Duration {
	return min(time.Second, t.cfg.TTL/8)
}

// freshPrefix is how many leading chunks of keys the tree holds as seen by
// engine eng at or after since. Freshness only falls along a path — an
// insert records every node of its path at one instant, and eviction takes
// a prefix's descendants before it — so a binary search finds the end.
// (Nodes Insert skips are not moved up the LRU list, so for at most
// refreshEvery a descendant can be more recent than its prefix; if the
// prefix is evicted meanwhile, Match stops at the gap until the next
// refresh records the path again: it can only undercount.)
func (t *ApproxTree) freshPrefix(keys []uint64, eng uint16, since int64) int {
	return sort.Search(len(keys), func(j int) bool {
		i, ok := t.nodes[keys[j]]
		return !ok || t.seenAt(i, eng) < since
	})
}

// recordOf is the index of node i's record of engine eng, 0 if it has none.
func (t *ApproxTree) recordOf(i int32, eng uint16) int32 {
	for s := t.slab[i].seen; s != 0; s = t.seen[s].next {
		if t.seen[s].engine == eng {
			return s
		}
	}
	return 0
}

// seenAt is when node i last recorded engine eng, math.MinInt64 if it
// never did (before any cutoff, whatever the clock reads).
func (t *ApproxTree) seenAt(i int32, eng uint16) int64 {
	if s := t.recordOf(i, eng); s != 0 {
		return t.seen[s].at
	}
	return math.MinInt64
}

// markSeenLocked records that engine eng was sent a prompt through node i
// at now.
func (t *ApproxTree) markSeenLocked(i int32, eng uint16, now int64) {
	if s := t.recordOf(i, eng); s != 0 {
		t.seen[s].at = now
		return
	}
	rec := approxSeen{at: now, next: t.slab[i].seen, engine: eng}
	s := t.freeSeen
	if s == 0 && len(t.seen) == math.MaxInt32 {
		return // an index more would not fit; the engine goes unrecorded here
	}
	if s != 0 {
		t.freeSeen = t.seen[s].next
		t.seen[s] = rec
	} else {
		t.seen = append(t.seen, rec)
		s = int32(len(t.seen) - 1)
	}
	t.slab[i].seen = s
}

// forgetLocked drops node i's record of engine eng and reports whether
// the node has records left.
func (t *ApproxTree) forgetLocked(i int32, eng uint16) bool {
	for link, s := &t.slab[i].seen, t.slab[i].seen; s != 0; link, s = &t.seen[s].next, t.seen[s].next {
		if t.seen[s].engine == eng {
			*link = t.seen[s].next
			t.seen[s] = approxSeen{next: t.freeSeen}
			t.freeSeen = s
			break
		}
	}
	return t.slab[i].seen != 0
}

// newNodeLocked adds a node for key k, with no records and not linked,
// and returns its index.
func (t *ApproxTree) newNodeLocked(k uint64) int32 {
	i := t.freeNode
	if i != 0 {
		t.freeNode = t.slab[i].next
		t.slab[i] = approxNode{key: k}
	} else {
		t.slab = append(t.slab, approxNode{key: k})
		i = int32(len(t.slab) - 1)
	}
	t.nodes[k] = i
	return i
}

// dropNodeLocked removes node i and its records.
func (t *ApproxTree) dropNodeLocked(i int32) {
	t.unlinkLocked(i)
	delete(t.nodes, t.slab[i].key)
	for s := t.slab[i].seen; s != 0; {
		next := t.seen[s].next
		t.seen[s] = approxSeen{next: t.freeSeen}
		t.freeSeen, s = s, next
	}
	t.slab[i] = approxNode{next: t.freeNode}
	t.freeNode = i
	if len(t.nodes) == 0 {
		t.clearLocked()
	}
}

// expireLocked drops nodes beyond MaxNodes and nodes nobody inserted
// through for TTL, least recently used first.
func (t *ApproxTree) expireLocked(now int64) {
	ttl := int64(t.cfg.TTL)
	for tail := t.slab[0].prev; tail != 0; tail = t.slab[0].prev {
		if len(t.nodes) <= t.cfg.MaxNodes && now-t.slab[tail].newest <= ttl {
			break
		}
		t.dropNodeLocked(tail)
	}
}

func (t *ApproxTree) unlinkLocked(i int32) {
	n := &t.slab[i]
	t.slab[n.prev].next, t.slab[n.next].prev = n.next, n.prev
	n.prev, n.next = 0, 0
}

func (t *ApproxTree) pushFrontLocked(i int32) {
	first := t.slab[0].next
	t.slab[i].prev, t.slab[i].next = 0, first
	t.slab[first].prev = i
	t.slab[0].next = i
}

// Match returns, for every engine that recently served at least the first
// chunk of text, the length in bytes of the longest prefix it served, sorted
// longest first; total is len(text). Entries older than the TTL do not
// count.
func (t *ApproxTree) Match(text string) (matches []ApproxMatch, total int) {
	if text == "" {
		return nil, 0
	}
	kp := t.chunkKeys(text)
	defer putChunkKeys(kp)
	keys := *kp
	t.mu.RLock()
	defer t.mu.RUnlock()
	cutoff := t.clock.read() - int64(t.cfg.TTL)
	var active []uint16
	matched := 0 // chunks every engine in active has
	for i, k := range keys {
		nd, ok := t.nodes[k]
		if !ok {
			break
		}
		if i == 0 {
			for s := t.slab[nd].seen; s != 0; s = t.seen[s].next {
				if t.seen[s].at >= cutoff {
					active = append(active, t.seen[s].engine)
				}
			}
		} else {
			kept := active[:0]
			for _, e := range active {
				if t.seenAt(nd, e) >= cutoff {
					kept = append(kept, e)
				} else {
					matches = append(matches, ApproxMatch{Engine: t.names[e], Bytes: t.chunkEnd(i-1, len(text))})
				}
			}
			active = kept
		}
		if len(active) == 0 {
			break
		}
		matched = i + 1
	}
	for _, e := range active {
		matches = append(matches, ApproxMatch{Engine: t.names[e], Bytes: t.chunkEnd(matched-1, len(text))})
	}
	slices.SortFunc(matches, func(a, b ApproxMatch) int {
		if a.Bytes != b.Bytes {
			return b.Bytes - a.Bytes
		}
		return strings.Compare(a.Engine, b.Engine)
	})
	return matches, len(text)
}

// RemoveEngine forgets everything engine served (it left the fleet or
// restarted with an empty cache).
func (t *ApproxTree) RemoveEngine(engine string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	eng, ok := t.engines[engine]
	if !ok {
		return
	}
	for i := t.slab[0].next; i != 0; {
		next := t.slab[i].next
		if !t.forgetLocked(i, eng) {
			t.dropNodeLocked(i)
		}
		i = next
	}
	delete(t.engines, engine)
	t.names[eng] = ""
}

// Len returns the number of chunks held.
func (t *ApproxTree) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.nodes)
}
