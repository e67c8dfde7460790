package kvindex

import (
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
	// Now is the clock (default time.Now), injectable for tests.
	Now func() time.Time
}

// ApproxTree is the fallback prefix index for engines without KV events
// or whose events are stale: it records which engines recently served which
// text prefixes, assuming a served prompt stays cached for a while. It is a
// trie over fixed-size chunks of the request text, stored as a map from
// each chunk's chained hash (which stands for the whole path to it) to the
// engines that saw it. It is safe for concurrent use.
type ApproxTree struct {
	cfg ApproxConfig

	mu    sync.RWMutex
	nodes map[uint64]*approxNode
	// lru is a sentinel of the doubly linked list of nodes, most
	// recently inserted first.
	lru     approxNode
	engines map[string]uint16
	names   []string // by engine index; "" is free

	// betweenSteps, when set (by tests), runs between an Insert's steps
	// (see pauseLocked), with the lock released.
	betweenSteps func()
}

type approxNode struct {
	key        uint64
	prev, next *approxNode
	newest     int64 // unix nanos of the latest insert through this node
	seen       []approxSeen
}

type approxSeen struct {
	engine uint16
	at     int64
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &ApproxTree{cfg: cfg, nodes: make(map[uint64]*approxNode), engines: make(map[string]uint16)}
	t.lru.next, t.lru.prev = &t.lru, &t.lru
	return t
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
	key := uint64(0x6b76696e64657821)
	for i := 0; i < n; i++ {
		key = sum64SeedString(key, text[i*t.cfg.ChunkBytes:t.chunkEnd(i, len(text))])
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
	now := t.cfg.Now().UnixNano()
	eng, ok := t.engines[engine]
	if !ok {
		i := slices.Index(t.names, "")
		if i < 0 {
			if len(t.names) > 1<<16-1 {
				return // more engines than anyone runs; ignore
			}
			t.names = append(t.names, "")
			i = len(t.names) - 1
		}
		eng = uint16(i)
		t.names[i] = engine
		t.engines[engine] = eng
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
		nd := t.nodes[k]
		if nd == nil {
			nd = &approxNode{key: k}
			t.nodes[k] = nd
		} else {
			nd.unlink()
		}
		t.lru.pushFront(nd)
		nd.newest = now
		i := slices.IndexFunc(nd.seen, func(s approxSeen) bool { return s.engine == eng })
		if i < 0 {
			nd.seen = append(nd.seen, approxSeen{engine: eng, at: now})
		} else {
			nd.seen[i].at = now
		}
	}
	t.expireLocked(now)
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
		nd := t.nodes[keys[j]]
		if nd == nil {
			return true
		}
		i := slices.IndexFunc(nd.seen, func(s approxSeen) bool { return s.engine == eng })
		return i < 0 || nd.seen[i].at < since
	})
}

// expireLocked drops nodes beyond MaxNodes and nodes nobody inserted
// through for TTL, least recently used first.
func (t *ApproxTree) expireLocked(now int64) {
	ttl := int64(t.cfg.TTL)
	for tail := t.lru.prev; tail != &t.lru; tail = t.lru.prev {
		if len(t.nodes) <= t.cfg.MaxNodes && now-tail.newest <= ttl {
			break
		}
		tail.unlink()
		delete(t.nodes, tail.key)
	}
}

func (n *approxNode) unlink() {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (l *approxNode) pushFront(n *approxNode) {
	n.prev, n.next = l, l.next
	l.next.prev = n
	l.next = n
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
	cutoff := t.cfg.Now().UnixNano() - int64(t.cfg.TTL)
	var active []uint16
	matched := 0 // chunks every engine in active has
	for i, k := range keys {
		nd := t.nodes[k]
		if nd == nil {
			break
		}
		fresh := func(e uint16) bool {
			j := slices.IndexFunc(nd.seen, func(s approxSeen) bool { return s.engine == e })
			return j >= 0 && nd.seen[j].at >= cutoff
		}
		if i == 0 {
			for _, s := range nd.seen {
				if s.at >= cutoff {
					active = append(active, s.engine)
				}
			}
		} else {
			kept := active[:0]
			for _, e := range active {
				if fresh(e) {
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
	for k, nd := range t.nodes {
		nd.seen = slices.DeleteFunc(nd.seen, func(s approxSeen) bool { return s.engine == eng })
		if len(nd.seen) == 0 {
			nd.unlink()
			delete(t.nodes, k)
		}
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
