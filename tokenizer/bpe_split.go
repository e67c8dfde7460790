package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Tokenizers converted from SentencePiece (Llama 2, Gemma) have no
// pre-tokenizer: BPE runs over a whole stretch of text at once, with spaces
// turned into "▁". That is slow and defeats the word cache. But a merge can
// only join two symbols into a token of the vocabulary, so if no token
// contains a non-▁ rune followed by ▁, no merge ever crosses such a place in
// the text, and cutting the text there before BPE changes nothing. The few
// tokens that do contain one are kept in crossers, and we do not cut where
// one of them occurs in the text across the cut.

const wordBoundary = "\u2581"

// maxCrossers bounds how many boundary-crossing tokens we check at each cut;
// a vocabulary with more gets no cutting.
const maxCrossers = 64

// crosser is a vocabulary token with a non-▁ rune at off-1 and ▁ at off.
type crosser struct {
	token string
	off   int
}

// setupBoundarySplit enables cutting when it is exact: the model must have
// ▁ as a token and no prefix, suffix or ignore_merges (each of which
// depends on where a word starts or ends).
func (m *bpeModel) setupBoundarySplit() {
	if _, ok := m.vocab.get(wordBoundary); !ok || m.prefix != "" || m.suffix != "" || m.ignoreMerges {
		return
	}
	var cs []crosser
	for tok := range m.vocab.all() {
		for off := 1; off < len(tok); off++ {
			if strings.HasPrefix(tok[off:], wordBoundary) && !strings.HasSuffix(tok[:off], wordBoundary) && utf8.RuneStart(tok[off]) {
				cs = append(cs, crosser{tok, off})
			}
		}
		if len(cs) > maxCrossers {
			return
		}
	}
	m.boundarySplit, m.crossers = true, cs
}

// appendSplitWord encodes a long word cut before each ▁ that follows another
// rune, wherever the cut is safe.
func (m *bpeModel) appendSplitWord(dst []int, word string, sc *scratch) []int {
	start := 0
	for i := 1; i < len(word); {
		k := strings.Index(word[i:], wordBoundary)
		if k < 0 {
			break
		}
		p := i + k
		if !strings.HasSuffix(word[:p], wordBoundary) && !m.crossed(word, p) {
			dst = m.appendPart(dst, word[start:p], false, sc)
			start = p
		}
		i = p + len(wordBoundary)
	}
	return m.appendPart(dst, word[start:], false, sc)
}

// crossed reports whether a boundary-crossing token occurs in word across
// the cut at p.
func (m *bpeModel) crossed(word string, p int) bool {
	for _, c := range m.crossers {
		if s := p - c.off; s >= 0 && strings.HasPrefix(word[s:], c.token) {
			return true
		}
	}
	return false
}
