package tokenizer

import (
	"hash/maphash"
	"math"
	"sync"
)

// Most pre-tokens of real text are words that recur, so the ids of recently
// seen pre-tokens are kept in a bounded cache shared by all callers.
const (
	cacheShards = 32
	// cacheShardEntries bounds each shard; a full shard is cleared, which
	// keeps the bound without LRU bookkeeping on the read path.
	cacheShardEntries = 2048
	// maxCachedWordLen leaves long pieces (a whole sentence for
	// tokenizers without pre-tokenizer) out of the cache: they rarely
	// repeat and would crowd out the words.
	maxCachedWordLen = 256
)

// wordCache maps a pre-token to its ids. It is safe for concurrent use.
//
// It holds no Go pointer per entry: each shard keeps its words and ids in
// two slices and finds them through its own open-addressing table of the
// words' hashes. The cache lives as long as the tokenizer, and the
// garbage collector scans every pointer of live memory at each
// collection: with a string and a slice per entry, a cache three quarters
// full cost every collection 2-3 ms of CPU (BenchmarkWordCacheGC).
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	// slots is an open-addressing table of the shard's words by hash,
	// linear probing from the hash's bits above those that chose the
	// shard; len is a power of two, at least twice the words held.
	slots []wordSlot
	n     int
	// words and ids hold the shard's words and ids, appended and never
	// written over: a shard that fills up starts new slices, and ids
	// handed out of the old ones stay valid.
	words []byte
	ids   []int32
	_     [40]byte // keeps shards on separate cache lines
}

// wordSlot is a word's hash (0 where the slot is empty) and where its
// bytes and ids are in the shard's slices.
type wordSlot struct {
	h              uint64
	wordOff, idOff uint32
	wordLen, idLen uint16
}

const minWordSlots = 64

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].reset()
	}
	return c
}

// wordHash is word's hash, never 0 (which marks an empty slot).
func (c *wordCache) wordHash(word string) uint64 { return max(maphash.String(c.seed, word), 1) }

// reset empties the shard. (Its lock held, or the shard not yet shared.)
func (sh *cacheShard) reset() {
	sh.slots, sh.n = make([]wordSlot, minWordSlots), 0
	sh.words, sh.ids = nil, nil
}

// slotOf returns the index of h's slot in slots, or of the empty slot where
// it would go.
func slotOf(slots []wordSlot, h uint64) int {
	mask := uint64(len(slots) - 1)
	i := (h >> 8) & mask // the low bits chose the shard
	for slots[i].h != h && slots[i].h != 0 {
		i = (i + 1) & mask
	}
	return int(i)
}

// get returns the cached ids of word. The slice must not be modified.
func (c *wordCache) get(word string) ([]int32, bool) {
	h := c.wordHash(word)
	sh := &c.shards[h%cacheShards]
	sh.mu.RLock()
	e := sh.slots[slotOf(sh.slots, h)]
	words, ids := sh.words, sh.ids
	sh.mu.RUnlock()
	// The slot's bytes were written before it was published under the
	// lock, and written bytes never change: a put appends past them.
	if e.h == 0 || int(e.wordLen) != len(word) || string(words[e.wordOff:int(e.wordOff)+len(word)]) != word {
		return nil, false // absent, or another word with the same hash
	}
	end := e.idOff + uint32(e.idLen)
	return ids[e.idOff:end:end], true
}

// grow doubles the shard's table.
func (sh *cacheShard) grow() {
	old := sh.slots
	sh.slots = make([]wordSlot, 2*len(old))
	for _, s := range old {
		if s.h != 0 {
			sh.slots[slotOf(sh.slots, s.h)] = s
		}
	}
}

// put stores a copy of word and its ids. Words longer than
// maxCachedWordLen are not stored (nor are more ids than an entry
// counts).
func (c *wordCache) put(word string, ids []int32) {
	if len(word) > maxCachedWordLen || len(ids) > math.MaxUint16 {
		return
	}
	h := c.wordHash(word)
	sh := &c.shards[h%cacheShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.n >= cacheShardEntries {
		sh.reset()
	}
	if 2*(sh.n+1) > len(sh.slots) {
		sh.grow()
	}
	i := slotOf(sh.slots, h)
	if sh.slots[i].h == 0 {
		sh.n++
	}
	sh.slots[i] = wordSlot{h: h, wordOff: uint32(len(sh.words)), idOff: uint32(len(sh.ids)), wordLen: uint16(len(word)), idLen: uint16(len(ids))}
	sh.words = append(sh.words, word...)
	sh.ids = append(sh.ids, ids...)
}
