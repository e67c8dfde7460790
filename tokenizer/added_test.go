package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// naiveFind is find's specification: the leftmost start at or after from
// where some token begins, and there the longest token.
func naiveFind(tokens []string, s string, from int) (start, end int, token int32) {
	for i := from; i < len(s); i++ {
		best, bestTok := -1, int32(-1)
		for k, tok := range tokens {
			if strings.HasPrefix(s[i:], tok) && i+len(tok) > best {
				best, bestTok = i+len(tok), int32(k)
			}
		}
		if bestTok >= 0 {
			return i, best, bestTok
		}
	}
	return 0, 0, -1
}

// TestTokenTrieFind holds both of find's scans (IndexByte when every token
// starts with one byte, the table otherwise) to the naive search, on text
// dense with near misses.
func TestTokenTrieFind(t *testing.T) {
	vocabs := map[string][]string{
		"one lead":   {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<"},
		"one lead 2": {"<|im_start|>", "<|im_end|>"},
		"many leads": {"<|im_end|>", "[INST]", "\n\n", "\t", "<b>"},
	}
	alphabet := []string{"<", "|", "im_", "start", "end", "|>", ">", "</", "think", "[INST", "]", "\n", "\t", "b", "x ", "é"}
	rng := rand.New(rand.NewPCG(1, 2))
	for name, tokens := range vocabs {
		trie := newTokenTrie()
		for i, tok := range tokens {
			trie.add(tok, int32(i))
		}
		if want := name != "many leads"; (trie.nfirst == 1) != want {
			t.Fatalf("%s: nfirst %d", name, trie.nfirst)
		}
		for n := 0; n < 2000; n++ {
			var b strings.Builder
			for k := rng.IntN(24); k > 0; k-- {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			s := b.String()
			from := rng.IntN(len(s) + 1)
			gs, ge, gt := trie.find(s, from)
			ws, we, wt := naiveFind(tokens, s, from)
			if gs != ws || ge != we || gt != wt {
				t.Fatalf("%s: find(%q, %d) = %d,%d,%d; want %d,%d,%d", name, s, from, gs, ge, gt, ws, we, wt)
			}
		}
	}
}
