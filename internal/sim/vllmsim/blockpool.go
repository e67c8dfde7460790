package vllmsim

import "github.com/llmgw/caddy-llmgw/kvindex"

// blockPool is vLLM's BlockPool with prefix caching: physical blocks with
// reference counts, a hash -> blocks map of cached full blocks, and a free
// queue in LRU order whose head is reused (and evicted) first. Block 0 is
// the null block and is never handed out, so usage is measured over
// NumGPUBlocks-1 blocks, as in vLLM. Not safe for concurrent use.
type blockPool struct {
	blocks   []poolBlock
	head     int32 // free queue head (next to reuse), -1 if empty
	tail     int32
	numFree  int
	cached   map[kvindex.Digest][]int32
	onEvict  func(kvindex.Digest) // called for each evicted cached block
	numCache int
}

type poolBlock struct {
	hash       kvindex.Digest
	hashed     bool
	ref        int32
	prev, next int32
	free       bool
}

func newBlockPool(n int, onEvict func(kvindex.Digest)) *blockPool {
	p := &blockPool{blocks: make([]poolBlock, n), cached: make(map[kvindex.Digest][]int32), onEvict: onEvict}
	p.reset()
	return p
}

// reset empties the pool: every block free and uncached, no events. It is
// the state of a freshly started process.
func (p *blockPool) reset() {
	clear(p.cached)
	p.numCache = 0
	p.head, p.tail, p.numFree = -1, -1, 0
	for i := range p.blocks {
		p.blocks[i] = poolBlock{prev: -1, next: -1}
	}
	for i := 1; i < len(p.blocks); i++ {
		p.pushTail(int32(i))
	}
}

func (p *blockPool) usable() int { return len(p.blocks) - 1 }

// usage is vLLM's kv_cache_usage_perc: the fraction of usable blocks not free.
func (p *blockPool) usage() float64 {
	return 1 - float64(p.numFree)/float64(p.usable())
}

func (p *blockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.free, b.prev, b.next = true, p.tail, -1
	if p.tail >= 0 {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.numFree++
}

func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev >= 0 {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next >= 0 {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.free, b.prev, b.next = false, -1, -1
	p.numFree--
}

// lookup returns the blocks of the longest prefix of hashes that is cached,
// appended to dst.
func (p *blockPool) lookup(dst []int32, hashes []kvindex.Digest) []int32 {
	for i := range hashes {
		ids := p.cached[hashes[i]]
		if len(ids) == 0 {
			break
		}
		dst = append(dst, ids[0])
	}
	return dst
}

// freeAmong counts how many of ids are in the free queue (cache hits that
// touching will take out of it).
func (p *blockPool) freeAmong(ids []int32) int {
	n := 0
	for _, id := range ids {
		if p.blocks[id].free {
			n++
		}
	}
	return n
}

// touch takes a reference on cached blocks (prefix hits).
func (p *blockPool) touch(ids []int32) {
	for _, id := range ids {
		if p.blocks[id].free {
			p.unlink(id)
		}
		p.blocks[id].ref++
	}
}

// allocate takes n blocks from the head of the free queue, evicting their
// cached hashes, and appends them to dst. It fails without side effects when
// fewer than n blocks are free.
func (p *blockPool) allocate(dst []int32, n int) ([]int32, bool) {
	if n > p.numFree {
		return dst, false
	}
	for range n {
		id := p.head
		p.unlink(id)
		b := &p.blocks[id]
		if b.hashed {
			p.uncache(id)
			if p.onEvict != nil {
				p.onEvict(b.hash)
			}
		}
		b.ref = 1
		dst = append(dst, id)
	}
	return dst, true
}

func (p *blockPool) uncache(id int32) {
	b := &p.blocks[id]
	ids := p.cached[b.hash]
	for i, x := range ids {
		if x == id {
			ids = append(ids[:i], ids[i+1:]...)
			break
		}
	}
	if len(ids) == 0 {
		delete(p.cached, b.hash)
	} else {
		p.cached[b.hash] = ids
	}
	b.hashed = false
	p.numCache--
}

// cache records a full block's hash. A hash may map to several physical
// blocks (vLLM allows duplicates).
func (p *blockPool) cache(id int32, h kvindex.Digest) {
	b := &p.blocks[id]
	if b.hashed {
		return
	}
	b.hash, b.hashed = h, true
	p.cached[h] = append(p.cached[h], id)
	p.numCache++
}

// free drops one reference on each block, last block first, so that a
// request's tail blocks are evicted before its head blocks.
func (p *blockPool) free(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushTail(id)
		}
	}
}

// resetPrefixCache drops every cached hash, only when no block is in use
// (vLLM's reset_prefix_cache). It reports whether it did.
func (p *blockPool) resetPrefixCache() bool {
	if p.numFree != p.usable() {
		return false
	}
	for i := range p.blocks {
		p.blocks[i].hashed = false
	}
	clear(p.cached)
	p.numCache = 0
	return true
}
