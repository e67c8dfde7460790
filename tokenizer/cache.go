package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
)

// Most pre-tokens of real text are words that recur, so the ids of recently
// seen pre-tokens are kept in a bounded cache shared by all callers.
const (
	cacheShards = 32
	// cacheShardEntries bounds each shard; a full shard is cleared, which
	// keeps the bound without LRU bookkeeping on the read path.
	cacheShardEntries = 4096
	// maxCachedWordLen leaves long pieces (a whole sentence for
	// tokenizers without pre-tokenizer) out of the cache: they rarely
	// repeat and would crowd out the words.
	maxCachedWordLen = 64
)

// wordCache maps a pre-token to its ids. It is safe for concurrent use.
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int32
	_  [40]byte // keeps shards on separate cache lines
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]int32)
	}
	return c
}

func (c *wordCache) shard(word string) *cacheShard {
	return &c.shards[maphash.String(c.seed, word)%cacheShards]
}

// get returns the cached ids of word. The slice must not be modified.
func (c *wordCache) get(word string) ([]int32, bool) {
	sh := c.shard(word)
	sh.mu.RLock()
	ids, ok := sh.m[word]
	sh.mu.RUnlock()
	return ids, ok
}

// put stores a copy of ids for word.
func (c *wordCache) put(word string, ids []int32) {
	stored := append([]int32(nil), ids...)
	key := strings.Clone(word) // do not pin the caller's (possibly huge) text
	sh := c.shard(word)
	sh.mu.Lock()
	if len(sh.m) >= cacheShardEntries {
		clear(sh.m)
	}
	sh.m[key] = stored
	sh.mu.Unlock()
}
