package tokenizer

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// bpeModel is HF's BPE model without dropout.
type bpeModel struct {
	vocab *vocabTable
	// merges maps an adjacent pair of ids (pairKey) to the merge's rank in
	// the high 32 bits and the merged token's id in the low 32 bits.
	merges       map[uint64]uint64
	unkID        int32 // -1 when the model has no usable unk token
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	// byteFallbackIDs holds the ids of the <0xXX> tokens, -1 where absent.
	byteFallbackIDs [256]int32
	// byteIDs holds the id of each byte's byte-level rune, -1 where absent,
	// for pieces that reach the model as raw bytes.
	byteIDs [256]int32
	// asciiIDs holds the ids of single ASCII characters, -1 where absent.
	asciiIDs [128]int32
	cache    *wordCache
	// boundarySplit and crossers let long words be cut before ▁ (see
	// bpe_split.go).
	boundarySplit bool
	crossers      []crosser
}

// pairKey packs two ids into a merges key.
func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// symbol is one part of a word being merged. id is -1 for a rune the
// vocabulary lacks; start and end locate the part in the word.
type symbol struct {
	id         int32
	start, end int32
}

// lookupTables fills the per-byte and per-character id tables from vocab.
func (m *bpeModel) lookupTables() {
	for b := 0; b < 256; b++ {
		m.byteFallbackIDs[b] = m.idOr(fmt.Sprintf("<0x%02X>", b))
		m.byteIDs[b] = m.idOr(byteToUTF8[b])
		if b < 128 {
			m.asciiIDs[b] = m.idOr(string(rune(b)))
		}
	}
}

// idOrBytes is idOr for a token held in a byte slice, without copying it.
func (m *bpeModel) idOrBytes(tok []byte) int32 {
	if id, ok := m.vocab.getBytes(tok); ok {
		return id
	}
	return -1
}

func (m *bpeModel) idOr(tok string) int32 {
	if id, ok := m.vocab.get(tok); ok {
		return id
	}
	return -1
}

// appendWord appends the ids of one pre-token. raw says the piece is still
// plain text that stands for its byte-level form.
func (m *bpeModel) appendWord(dst []int, word string, raw bool, sc *scratch) []int {
	if m.boundarySplit && !raw && len(word) > maxCachedWordLen {
		return m.appendSplitWord(dst, word, sc)
	}
	return m.appendPart(dst, word, raw, sc)
}

// appendPart encodes one word, through the cache when it is short.
func (m *bpeModel) appendPart(dst []int, word string, raw bool, sc *scratch) []int {
	if word == "" {
		return dst
	}
	cacheable := m.cache != nil && len(word) <= maxCachedWordLen
	if cacheable {
		if ids, ok := m.cache.get(word); ok {
			return appendIDs(dst, ids)
		}
	}
	ids := m.encodeWord(sc, word, raw)
	if cacheable {
		m.cache.put(word, ids)
	}
	return appendIDs(dst, ids)
}

func appendIDs(dst []int, ids []int32) []int {
	n := len(dst)
	dst = slices.Grow(dst, len(ids))[:n+len(ids)]
	for i, id := range ids {
		dst[n+i] = int(id)
	}
	return dst
}

// encodeWord runs BPE on one pre-token and returns its ids in sc.ids.
func (m *bpeModel) encodeWord(sc *scratch, word string, raw bool) []int32 {
	out := sc.ids[:0]
	if m.ignoreMerges {
		var id int32
		var ok bool
		if raw {
			sc.buf = appendByteLevel(sc.buf[:0], word)
			id, ok = m.vocab.getBytes(sc.buf)
		} else {
			id, ok = m.vocab.get(word)
		}
		if ok {
			sc.ids = append(out, id)
			return sc.ids
		}
	}
	syms := m.initialSymbols(sc.syms[:0], word, raw, sc)
	if len(syms) > 64 {
		syms = m.mergeHeap(syms, sc)
	} else {
		syms = m.mergeSmall(syms, sc)
	}
	out = m.finish(out, syms, word, raw, sc)
	sc.syms, sc.ids = syms, out
	return out
}

// initialSymbols splits word into one symbol per character: a byte for raw
// pieces, a rune otherwise, with continuing_subword_prefix on all but the
// first and end_of_word_suffix on the last.
func (m *bpeModel) initialSymbols(syms []symbol, word string, raw bool, sc *scratch) []symbol {
	if raw {
		for i := 0; i < len(word); i++ {
			syms = append(syms, symbol{m.byteIDs[word[i]], int32(i), int32(i + 1)})
		}
		return syms
	}
	for i := 0; i < len(word); {
		n := runeLen(word, i)
		var id int32
		if m.prefix == "" && m.suffix == "" {
			if word[i] < utf8.RuneSelf {
				id = m.asciiIDs[word[i]]
			} else {
				id = m.idOr(word[i : i+n])
			}
		} else {
			sc.buf = m.symbolText(sc.buf[:0], word, i, i+n)
			id = m.idOrBytes(sc.buf)
		}
		syms = append(syms, symbol{id, int32(i), int32(i + n)})
		i += n
	}
	return syms
}

// symbolText appends the text of the initial symbol word[start:end],
// with the prefix and suffix it carries.
func (m *bpeModel) symbolText(dst []byte, word string, start, end int) []byte {
	if start > 0 {
		dst = append(dst, m.prefix...)
	}
	dst = append(dst, word[start:end]...)
	if end == len(word) {
		dst = append(dst, m.suffix...)
	}
	return dst
}

// rankOf returns the rank and result of merging a and b; ok is false when
// no merge applies.
func (m *bpeModel) rankOf(a, b int32) (rank uint32, id int32, ok bool) {
	if a < 0 || b < 0 {
		return 0, 0, false
	}
	v, ok := m.merges[pairKey(a, b)]
	return uint32(v >> 32), int32(uint32(v)), ok
}

const noRank = ^uint64(0)

// mergeSmall merges a short word by repeatedly taking the lowest-ranked
// adjacent pair, leftmost on ties. For short words a linear scan beats a
// heap.
func (m *bpeModel) mergeSmall(syms []symbol, sc *scratch) []symbol {
	if len(syms) < 2 {
		return syms
	}
	ranks := sc.ranks[:0]
	for j := 0; j+1 < len(syms); j++ {
		ranks = append(ranks, m.pairRank(syms[j].id, syms[j+1].id))
	}
	for {
		best := 0
		for j := 1; j < len(ranks); j++ {
			if ranks[j]>>32 < ranks[best]>>32 {
				best = j
			}
		}
		if len(ranks) == 0 || ranks[best] == noRank {
			break
		}
		syms[best] = symbol{int32(uint32(ranks[best])), syms[best].start, syms[best+1].end}
		syms = append(syms[:best+1], syms[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		if best > 0 {
			ranks[best-1] = m.pairRank(syms[best-1].id, syms[best].id)
		}
		if best < len(ranks) {
			ranks[best] = m.pairRank(syms[best].id, syms[best+1].id)
		}
	}
	sc.ranks = ranks
	return syms
}

// pairRank returns rank<<32|newID for a mergeable pair and noRank otherwise.
func (m *bpeModel) pairRank(a, b int32) uint64 {
	if a < 0 || b < 0 {
		return noRank
	}
	if v, ok := m.merges[pairKey(a, b)]; ok {
		return v
	}
	return noRank
}

// finish turns merged symbols into ids: vocabulary symbols as they are,
// unknown runes as <0xXX> byte tokens when byte_fallback has them all, else
// as the unk token (one per run of unknowns with fuse_unk), else dropped.
func (m *bpeModel) finish(out []int32, syms []symbol, word string, raw bool, sc *scratch) []int32 {
	prevUnk := false
	for _, s := range syms {
		if s.id >= 0 {
			out = append(out, s.id)
			prevUnk = false
			continue
		}
		if m.byteFallback {
			if raw {
				sc.buf = append(sc.buf[:0], byteToUTF8[word[s.start]]...)
			} else {
				sc.buf = m.symbolText(sc.buf[:0], word, int(s.start), int(s.end))
			}
			if ids, ok := m.fallbackIDs(out, sc.buf); ok {
				out = ids
				prevUnk = false
				continue
			}
		}
		if m.unkID < 0 || m.fuseUnk && prevUnk {
			continue
		}
		out = append(out, m.unkID)
		prevUnk = true
	}
	return out
}

// fallbackIDs appends the <0xXX> ids of text's bytes, or reports false when
// the vocabulary lacks any of them.
func (m *bpeModel) fallbackIDs(out []int32, text []byte) ([]int32, bool) {
	for _, b := range text {
		if m.byteFallbackIDs[b] < 0 {
			return out, false
		}
	}
	for _, b := range text {
		out = append(out, m.byteFallbackIDs[b])
	}
	return out, true
}
