package main

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// desEngine is one modelled engine: its KV block pool with prefix cache
// and LRU of evictable blocks, its queues, and the gateway's view of it
// (gauges as of the last scrape, requests dispatched and in flight).
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
	preemptions      int

	// The gateway's view.
	snapRunning, snapWaiting, snapKV float64
	scrapeT                          float64
	dispatched, inflight             int
	// finished counts requests the last scrape counted that have ended
	// since (upstreams.Load.Finished): their slots are free already.
	finished int
}

type desBlock struct {
	hash       uint64
	hashed     bool
	ref        int
	prev, next *desBlock
	inLRU      bool
}

// desEvent is a BlockStored (tokens set) or BlockRemoved.
type desEvent struct {
	stored bool
	hashes []uint64
	parent uint64
	hasPar bool
	tokens []uint64
}

func newDESEngine(i, blocks int) *desEngine {
	return &desEngine{idx: i, name: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1), capacity: blocks,
		cache: make(map[uint64]*desBlock), freeRaw: blocks}
}

// free is the llm_admission headroom (caddymodule's engineFree with a
// max_inflight): none at the KV limit, else max − (running + waiting +
// dispatched) as the gateway sees them, finished requests' slots freed.
func (e *desEngine) free(maxInflight int, kvLimit float64) int {
	if e.snapKV >= kvLimit {
		return 0
	}
	running, waiting := e.estimated()
	return maxInflight - int(running+waiting) - e.dispatched
}

// estimated is upstreams.Load.Estimated: the scraped running and waiting
// less the requests seen finishing since, off waiting first.
func (e *desEngine) estimated() (running, waiting float64) {
	f := float64(e.finished)
	fromWaiting := min(f, e.snapWaiting)
	return max(e.snapRunning-(f-fromWaiting), 0), e.snapWaiting - fromWaiting
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
// freed cached block, whose eviction is announced.
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

// stored records a BlockStored event for r's blocks [from, to).
func (e *desEngine) stored(r *desReq, from, to, bs int) {
	ev := desEvent{stored: true, hashes: append([]uint64(nil), r.hashes[from:to]...),
		tokens: append([]uint64(nil), r.tokens[from*bs:to*bs]...)}
	if from > 0 {
		ev.parent, ev.hasPar = r.hashes[from-1], true
	}
	e.events = append(e.events, ev)
}

// batchEncoder writes event batches in vLLM's positional msgpack form
// ([ts, [events...], dp_rank], 12-field BlockStored), as vllmsim does.
type batchEncoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

func newBatchEncoder() *batchEncoder {
	b := &batchEncoder{}
	b.enc = msgpack.NewEncoder(&b.buf)
	return b
}

// encode returns the payload; it is valid until the next call. Writes to
// a bytes.Buffer cannot fail, so errors are not checked.
func (b *batchEncoder) encode(ts float64, evs []desEvent, bs int) []byte {
	b.buf.Reset()
	enc := b.enc
	_ = enc.EncodeArrayLen(3)
	_ = enc.EncodeFloat64(ts)
	_ = enc.EncodeArrayLen(len(evs))
	for i := range evs {
		ev := &evs[i]
		if !ev.stored {
			_ = enc.EncodeArrayLen(4)
			_ = enc.EncodeString("BlockRemoved")
			b.hashes(ev.hashes)
			_ = enc.EncodeString("GPU")
			_ = enc.EncodeUint(0)
			continue
		}
		_ = enc.EncodeArrayLen(12)
		_ = enc.EncodeString("BlockStored")
		b.hashes(ev.hashes)
		if ev.hasPar {
			_ = enc.EncodeUint(ev.parent)
		} else {
			_ = enc.EncodeNil()
		}
		_ = enc.EncodeArrayLen(len(ev.tokens))
		for _, t := range ev.tokens {
			_ = enc.EncodeUint(t)
		}
		_ = enc.EncodeUint(uint64(bs))
		_ = enc.EncodeNil() // lora_id
		_ = enc.EncodeString("GPU")
		_ = enc.EncodeNil() // lora_name
		_ = enc.EncodeArrayLen(len(ev.hashes))
		for range ev.hashes {
			_ = enc.EncodeNil() // no extra keys
		}
		_ = enc.EncodeUint(0) // group_idx
		_ = enc.EncodeString("full_attention")
		_ = enc.EncodeNil() // sliding window
	}
	_ = enc.EncodeUint(0) // dp rank
	return b.buf.Bytes()
}

func (b *batchEncoder) hashes(hs []uint64) {
	_ = b.enc.EncodeArrayLen(len(hs))
	for _, h := range hs {
		_ = b.enc.EncodeUint(h)
	}
}
