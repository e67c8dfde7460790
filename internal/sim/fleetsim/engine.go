package fleetsim

import "fmt"

// desEngine is one modelled engine: its KV block pool with prefix cache
// and LRU of evictable blocks, and its queues. What the gateway knows of it
// lives in the real fleet: gauges as of the last scrape, and this
// gateway's accounting of the requests it sent.
type desEngine struct {
	idx      int
	name     string
	capacity int

	cache            map[uint64]*desBlock // cached (hashed) blocks, in use or evictable
	lruHead, lruTail *desBlock            // evictable cached blocks, oldest first
	lruLen           int
	freeRaw          int // blocks holding nothing
	used             int // blocks referenced by requests

	running, waiting []*desReq
	busy             bool
	events           []desEvent // this step's KV events
	seq              uint64
	gen              int // restarts so far: a step begun before the last one is void
	preemptions      int
	cpu              *blockLRU // the CPU offload tier: engine block hashes (Params.CPUBlocks); nil: none
	offloaded        int       // blocks the GPU evicted into cpu so far
	// vLLM's counters behind the gateway's prefill rate: prompt tokens
	// and their prefix-cache hits at each first token, and the seconds
	// from scheduling to it. Blocks loaded from the CPU tier are not
	// prefix-cache hits there: vLLM counts a connector's tokens in
	// vllm:external_prefix_cache_hits, which the gateway does not read.
	promptTokens, cachedTokens, prefillSeconds float64
	prefills                                   float64 // first tokens so far: the prefill-time histogram's count
}

type desBlock struct {
	hash       uint64
	hashed     bool
	ref        int
	prev, next *desBlock
	inLRU      bool
}

// desEvent is a BlockStored (tokens set) or BlockRemoved, of the GPU or,
// with cpu, of the CPU tier (a BlockStored of the CPU tier has no tokens:
// the OffloadingConnector's events before vllm#43468).
type desEvent struct {
	stored bool
	cpu    bool
	hashes []uint64
	parent uint64
	hasPar bool
	tokens []uint64
}

func newDESEngine(i, blocks, cpuBlocks int) *desEngine {
	e := &desEngine{idx: i, name: fmt.Sprintf("engine%d.sim.invalid:8000", i), capacity: blocks,
		cache: make(map[uint64]*desBlock), freeRaw: blocks}
	if cpuBlocks > 0 {
		e.cpu = newBlockLRU(cpuBlocks)
	}
	return e
}

func (e *desEngine) lruRemove(b *desBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		e.lruHead = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		e.lruTail = b.prev
	}
	b.prev, b.next, b.inLRU = nil, nil, false
	e.lruLen--
}

func (e *desEngine) lruPush(b *desBlock) {
	b.prev, b.next, b.inLRU = e.lruTail, nil, true
	if e.lruTail != nil {
		e.lruTail.next = b
	} else {
		e.lruHead = b
	}
	e.lruTail = b
	e.lruLen++
}

// ref takes a reference on a cached block (a prefix hit).
func (e *desEngine) ref(b *desBlock) {
	if b.ref == 0 {
		if b.inLRU {
			e.lruRemove(b)
		}
		e.used++
	}
	b.ref++
}

// allocate gives r one more block: a free one, else the least recently
// freed cached block, whose eviction is announced (after its offload to
// the CPU tier, if the engine has one).
func (e *desEngine) allocate(r *desReq) bool {
	var b *desBlock
	switch {
	case e.freeRaw > 0:
		e.freeRaw--
		b = &desBlock{}
	case e.lruHead != nil:
		b = e.lruHead
		e.lruRemove(b)
		delete(e.cache, b.hash)
		e.offload(b.hash)
		e.events = append(e.events, desEvent{hashes: []uint64{b.hash}})
		b.hashed, b.hash = false, 0
	default:
		return false
	}
	b.ref = 1
	e.used++
	r.blocks = append(r.blocks, b)
	return true
}

// release drops r's references, last block first, so a finished request's
// tail is evicted before its prefix.
func (e *desEngine) release(r *desReq) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		b := r.blocks[i]
		b.ref--
		if b.ref > 0 {
			continue
		}
		e.used--
		if b.hashed {
			e.lruPush(b)
		} else {
			e.freeRaw++
		}
	}
	r.blocks = r.blocks[:0]
}

// restart empties the engine as a new process would: nothing cached or in
// use (its CPU tier, in the process's memory, included), no queues, event
// batches numbered from 0 and counters from 0 again.
// The requests it held are the caller's to fail.
func (e *desEngine) restart() {
	e.cache = make(map[uint64]*desBlock)
	e.lruHead, e.lruTail, e.lruLen = nil, nil, 0
	if e.cpu != nil {
		e.cpu = newBlockLRU(e.cpu.capacity)
	}
	e.freeRaw, e.used = e.capacity, 0
	e.running, e.waiting, e.busy = nil, nil, false
	e.events = e.events[:0]
	e.seq = 0
	e.promptTokens, e.cachedTokens, e.prefillSeconds, e.prefills = 0, 0, 0, 0
	e.gen++
}

// stored records a BlockStored event for r's blocks [from, to).
func (e *desEngine) stored(r *desReq, from, to, bs int) {
	ev := desEvent{stored: true, hashes: append([]uint64(nil), r.hashes[from:to]...),
		tokens: append([]uint64(nil), r.tokens[from*bs:to*bs]...)}
	if from > 0 {
		ev.parent, ev.hasPar = r.hashes[from-1], true
	}
	e.events = append(e.events, ev)
}
