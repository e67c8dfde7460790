package fleetsim

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

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
