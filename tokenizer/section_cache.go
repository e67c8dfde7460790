package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
)

// The text between two added tokens — in a rendered chat, mostly one
// message's content — is encoded on its own (appendText), so its ids are
// a function of that text alone and of whether it starts the input. A
// chat resends its history with every turn, and many requests share one
// system prompt: the ids of long sections are kept, so a request pays
// only for the sections it has not sent before. A section is kept the
// second time it is encoded: most requests end with a message never seen
// before and never seen again (the newest turn is history only from the
// next request on), and storing each would churn the cache for nothing.
const (
	// minCachedSectionBytes leaves short sections to the word cache:
	// hashing them costs about what encoding them does.
	minCachedSectionBytes = 512
	// sectionCacheBudget bounds the cache: the sections' bytes plus 4
	// per id. Past it the cache is emptied, which keeps the bound
	// without LRU bookkeeping on the read path.
	sectionCacheBudget = 32 << 20
	// maxSeenSections bounds the hashes of sections encoded once (8
	// bytes each); past it they are forgotten.
	maxSeenSections = 1 << 16
)

type sectionKey struct {
	text  string
	first bool // the section starts the input (pre-tokenizers may treat it apart)
}

// sectionCache maps a section to its ids. It is safe for concurrent use.
type sectionCache struct {
	minBytes int
	seed     maphash.Seed
	mu       sync.RWMutex
	m        map[sectionKey][]int32
	seen     map[uint64]struct{} // sections encoded once, by hash
	bytes    int
}

func newSectionCache() *sectionCache {
	return &sectionCache{minBytes: minCachedSectionBytes, seed: maphash.MakeSeed(),
		m: map[sectionKey][]int32{}, seen: map[uint64]struct{}{}}
}

// get returns the cached ids of s. The slice must not be modified.
func (c *sectionCache) get(s string, first bool) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.m[sectionKey{s, first}]
	c.mu.RUnlock()
	return ids, ok
}

// put stores a copy of s and its ids if s was encoded before (see
// above), unless they alone exceed a quarter of the budget.
func (c *sectionCache) put(s string, first bool, ids []int) {
	cost := len(s) + 4*len(ids)
	if cost > sectionCacheBudget/4 {
		return
	}
	h := maphash.String(c.seed, s)
	if first {
		h = ^h
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, again := c.seen[h]; !again {
		if len(c.seen) >= maxSeenSections {
			clear(c.seen)
		}
		c.seen[h] = struct{}{}
		return
	}
	key := sectionKey{strings.Clone(s), first} // do not pin the request's text
	if _, ok := c.m[key]; ok {
		return
	}
	stored := toInt32(ids)
	if c.bytes+cost > sectionCacheBudget {
		clear(c.m)
		c.bytes = 0
	}
	c.m[key] = stored
	c.bytes += cost
}

// toInt32 is a copy of ids as the caches keep them, at half the size
// (token ids fit in 32 bits).
func toInt32(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// appendCachedSection is appendSection through the section cache.
func (t *Tokenizer) appendCachedSection(dst []int, s string, first bool, sc *scratch) []int {
	c := t.sections
	if c == nil || len(s) < c.minBytes {
		return t.appendSection(dst, s, first, sc)
	}
	if ids, ok := c.get(s, first); ok {
		return appendIDs(dst, ids)
	}
	start := len(dst)
	dst = t.appendSection(dst, s, first, sc)
	c.put(s, first, dst[start:])
	return dst
}
