package tokenizer

import (
	"hash/maphash"
	"iter"
	"math/bits"
	"unsafe"
)

// vocabTable maps a model's tokens to their ids and back. It holds no Go
// pointer per token: the tokens' bytes are in one slice, and an
// open-addressing table of entry numbers finds them. A tokenizer lives as
// long as the gateway, and the garbage collector scans every pointer of
// live memory at each collection: with a Go map and a []string, a 151k
// token vocabulary cost every collection ~6 ms of CPU
// (BenchmarkTokenizerGC). Read-only once built, so safe for concurrent
// use.
type vocabTable struct {
	seed  maphash.Seed
	data  []byte     // the tokens' bytes, one after another
	ents  []vocabEnt // one per token string
	slots []uint32   // entry number + 1, 0 where empty; len is a power of two
	byID  []int32    // entry number per id, -1 where no token has the id
}

// vocabEnt is one token: data[off:off+n] has the id.
type vocabEnt struct {
	off, n uint32
	id     int32
}

// newVocabTable builds the table of vocab, whose ids are in [0,
// maxTokenID) (setVocab checks). Two tokens sharing an id both map to it;
// the id maps back to the smaller string, so that the choice does not
// depend on map order.
func newVocabTable(vocab map[string]int64) *vocabTable {
	t := &vocabTable{seed: maphash.MakeSeed(), ents: make([]vocabEnt, 0, len(vocab))}
	size, maxID := 0, int64(-1)
	for tok, id := range vocab {
		size += len(tok)
		maxID = max(maxID, id)
	}
	t.data = make([]byte, 0, size)
	t.slots = make([]uint32, 1<<bits.Len(uint(2*len(vocab)))) // at most half full
	t.byID = make([]int32, maxID+1)
	for i := range t.byID {
		t.byID[i] = -1
	}
	for tok, id := range vocab {
		e := int32(len(t.ents))
		t.ents = append(t.ents, vocabEnt{off: uint32(len(t.data)), n: uint32(len(tok)), id: int32(id)})
		t.data = append(t.data, tok...)
		t.insert(tok, e)
		if cur := t.byID[id]; cur < 0 || tok < t.token(cur) {
			t.byID[id] = e
		}
	}
	return t
}

// insert adds entry e, whose token is tok, to the slots.
func (t *vocabTable) insert(tok string, e int32) {
	mask := uint64(len(t.slots) - 1)
	for i := maphash.String(t.seed, tok) & mask; ; i = (i + 1) & mask {
		if t.slots[i] == 0 {
			t.slots[i] = uint32(e) + 1
			return
		}
	}
}

// token is entry e's token. The string shares the table's bytes, which
// are never written once built.
func (t *vocabTable) token(e int32) string {
	ent := t.ents[e]
	if ent.n == 0 {
		return ""
	}
	return unsafe.String(&t.data[ent.off], int(ent.n))
}

// get returns the id of tok.
func (t *vocabTable) get(tok string) (int32, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := maphash.String(t.seed, tok) & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return 0, false
		}
		if ent := t.ents[s-1]; int(ent.n) == len(tok) && string(t.data[ent.off:ent.off+ent.n]) == tok {
			return ent.id, true
		}
	}
}

// getBytes is get for a token held in a byte slice, without copying it:
// get reads the bytes through a string view and keeps nothing of it.
func (t *vocabTable) getBytes(tok []byte) (int32, bool) {
	return t.get(unsafe.String(unsafe.SliceData(tok), len(tok)))
}

// idToken returns the token of id, "" when no token has it.
func (t *vocabTable) idToken(id int) string {
	if id < 0 || id >= len(t.byID) || t.byID[id] < 0 {
		return ""
	}
	return t.token(t.byID[id])
}

// ids is one more than the largest id.
func (t *vocabTable) ids() int { return len(t.byID) }

// all yields every token and its id, in no set order.
func (t *vocabTable) all() iter.Seq2[string, int32] {
	return func(yield func(string, int32) bool) {
		for e := range t.ents {
			if !yield(t.token(int32(e)), t.ents[e].id) {
				return
			}
		}
	}
}
