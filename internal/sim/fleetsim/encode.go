package fleetsim

import (
	"bytes"
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// batchEncoder writes event batches in vLLM's positional msgpack form
// ([ts, [events...], dp_rank], 12-field BlockStored), as vllmsim does.
// The CPU tier's events are the OffloadingConnector's before vllm#43468:
// hashes as the raw 32-byte digest, no parent, no tokens, block_size 0,
// medium "CPU", and None for extra_keys, group_idx and the spec fields,
// which that connector left unset.
type batchEncoder struct {
	buf    bytes.Buffer
	enc    *msgpack.Encoder
	digest [32]byte
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
		switch {
		case ev.cpu:
			b.cpuEvent(ev)
			continue
		case !ev.stored:
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

// cpuEvent writes a CPU tier event (see batchEncoder).
func (b *batchEncoder) cpuEvent(ev *desEvent) {
	enc := b.enc
	if !ev.stored {
		_ = enc.EncodeArrayLen(4)
		_ = enc.EncodeString("BlockRemoved")
		b.digests(ev.hashes)
		_ = enc.EncodeString("CPU")
		_ = enc.EncodeNil() // group_idx
		return
	}
	_ = enc.EncodeArrayLen(12)
	_ = enc.EncodeString("BlockStored")
	b.digests(ev.hashes)
	_ = enc.EncodeNil()       // parent
	_ = enc.EncodeArrayLen(0) // token_ids
	_ = enc.EncodeUint(0)     // block_size
	_ = enc.EncodeNil()       // lora_id
	_ = enc.EncodeString("CPU")
	for range 5 { // lora_name, extra_keys, group_idx, spec kind, sliding window
		_ = enc.EncodeNil()
	}
}

// digests writes hashes as vLLM's raw digests: 32 bytes whose last 8,
// read big-endian, are the hash (the int form of vLLM's GPU events), the
// rest filler derived from it.
func (b *batchEncoder) digests(hs []uint64) {
	_ = b.enc.EncodeArrayLen(len(hs))
	for _, h := range hs {
		x := h
		for i := 0; i < 24; i += 8 {
			x = x*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
			binary.BigEndian.PutUint64(b.digest[i:], x)
		}
		binary.BigEndian.PutUint64(b.digest[24:], h)
		_ = b.enc.EncodeBytes(b.digest[:])
	}
}
