package vllmsim

import (
	"bytes"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/vmihailenco/msgpack/v5"
)

// eventKind is the type of a KV-cache event.
type eventKind uint8

const (
	evStored eventKind = iota
	evRemoved
	evCleared
)

// kvEvent is one event of a step, before encoding. Slices may alias request
// state; they are encoded before the state changes again.
type kvEvent struct {
	kind      eventKind
	hashes    []kvindex.Digest
	hasParent bool
	parent    kvindex.Digest
	tokens    []uint64
	blockSize int
	// Extra keys of hashes[0] and of every later hash; nil means none.
	// Two fields, not one per hash, because they only differ on a
	// request's block 0 (the cache salt).
	extraFirst, extraRest []any
	// extras, when not nil, are each hash's extra keys instead (a
	// multimodal prompt's differ block by block).
	extras   [][]any
	loraName string // "" encodes as nil
	loraID   int    // 0 encodes as nil
}

// eventEncoder writes event batches exactly as vLLM's msgspec encoder does:
// smallest integer forms, float64 timestamps, positional arrays (the 12-field
// BlockStored layout of vLLM >= #40984) or maps with omit_defaults (#42892).
type eventEncoder struct {
	buf         bytes.Buffer
	enc         *msgpack.Encoder
	mapEvents   bool
	bytesHashes bool
}

func newEventEncoder(mapEvents, bytesHashes bool) *eventEncoder {
	e := &eventEncoder{mapEvents: mapEvents, bytesHashes: bytesHashes}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// encodeBatch returns the msgpack payload [ts, [events...], dp_rank]. The
// result is a fresh slice owned by the caller.
func (e *eventEncoder) encodeBatch(ts float64, events []kvEvent, rank int) []byte {
	e.buf.Reset()
	// Writes to a bytes.Buffer cannot fail, so errors are not checked.
	enc := e.enc
	_ = enc.EncodeArrayLen(3)
	_ = enc.EncodeFloat64(ts)
	_ = enc.EncodeArrayLen(len(events))
	for i := range events {
		e.encodeEvent(&events[i])
	}
	_ = enc.EncodeUint(uint64(rank))
	return bytes.Clone(e.buf.Bytes())
}

func (e *eventEncoder) hash(d *kvindex.Digest) {
	if e.bytesHashes {
		_ = e.enc.EncodeBytes(d[:])
		return
	}
	_ = e.enc.EncodeUint(d.Uint64())
}

func (e *eventEncoder) hashList(ds []kvindex.Digest) {
	_ = e.enc.EncodeArrayLen(len(ds))
	for i := range ds {
		e.hash(&ds[i])
	}
}

func (e *eventEncoder) encodeEvent(ev *kvEvent) {
	enc := e.enc
	key := func(k string) {
		if e.mapEvents {
			_ = enc.EncodeString(k)
		}
	}
	switch ev.kind {
	case evStored:
		if e.mapEvents {
			// kv_cache_spec_sliding_window is None with a default: omitted.
			_ = enc.EncodeMapLen(11)
		} else {
			_ = enc.EncodeArrayLen(12)
		}
		key("type")
		_ = enc.EncodeString("BlockStored")
		key("block_hashes")
		e.hashList(ev.hashes)
		key("parent_block_hash")
		if ev.hasParent {
			e.hash(&ev.parent)
		} else {
			_ = enc.EncodeNil()
		}
		key("token_ids")
		_ = enc.EncodeArrayLen(len(ev.tokens))
		for _, t := range ev.tokens {
			_ = enc.EncodeUint(t)
		}
		key("block_size")
		_ = enc.EncodeUint(uint64(ev.blockSize))
		key("lora_id")
		if ev.loraID != 0 {
			_ = enc.EncodeInt(int64(ev.loraID))
		} else {
			_ = enc.EncodeNil()
		}
		key("medium")
		_ = enc.EncodeString("GPU")
		key("lora_name")
		if ev.loraName != "" {
			_ = enc.EncodeString(ev.loraName)
		} else {
			_ = enc.EncodeNil()
		}
		key("extra_keys")
		_ = enc.EncodeArrayLen(len(ev.hashes))
		for i := range ev.hashes {
			keys := ev.extraRest
			switch {
			case ev.extras != nil:
				keys = ev.extras[i]
			case i == 0:
				keys = ev.extraFirst
			}
			e.extraKeys(keys)
		}
		key("group_idx")
		_ = enc.EncodeUint(0)
		key("kv_cache_spec_kind")
		_ = enc.EncodeString("full_attention")
		if !e.mapEvents {
			_ = enc.EncodeNil() // kv_cache_spec_sliding_window
		}
	case evRemoved:
		if e.mapEvents {
			_ = enc.EncodeMapLen(4)
		} else {
			_ = enc.EncodeArrayLen(4)
		}
		key("type")
		_ = enc.EncodeString("BlockRemoved")
		key("block_hashes")
		e.hashList(ev.hashes)
		key("medium")
		_ = enc.EncodeString("GPU")
		key("group_idx")
		_ = enc.EncodeUint(0)
	case evCleared:
		if e.mapEvents {
			_ = enc.EncodeMapLen(1)
			key("type")
		} else {
			_ = enc.EncodeArrayLen(1)
		}
		_ = enc.EncodeString("AllBlocksCleared")
	}
}

// extraKeys encodes one block's extra keys: nil, or a tuple (array) of
// strings and integers, as vLLM publishes them.
func (e *eventEncoder) extraKeys(keys []any) {
	enc := e.enc
	if keys == nil {
		_ = enc.EncodeNil()
		return
	}
	_ = enc.EncodeArrayLen(len(keys))
	for _, k := range keys {
		switch v := k.(type) {
		case string:
			_ = enc.EncodeString(v)
		case int:
			_ = enc.EncodeInt(int64(v))
		case int64:
			_ = enc.EncodeInt(v)
		case []byte:
			_ = enc.EncodeBytes(v)
		case []any:
			// A multimodal item's (identifier, offset) tuple.
			e.extraKeys(v)
		default:
			_ = enc.EncodeNil()
		}
	}
}
