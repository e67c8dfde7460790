package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         int32
	content    string
	special    bool
	lstrip     bool
	rstrip     bool
	singleWord bool
	normalized bool
}

// section is a stretch of text between added tokens, or an added token
// itself (token >= 0, an index into addedVocab.tokens).
type section struct {
	start, end int
	token      int32
}

// addedVocab finds added tokens in text the way HF's AddedVocabulary does:
// tokens with normalized=false are found in the raw text, the others in the
// normalized text of what lies between, leftmost first and longest on ties.
type addedVocab struct {
	tokens []addedToken
	// byContent maps content to the token's index.
	byContent map[string]int32
	byID      map[int32]int32
	raw       *tokenTrie // normalized=false tokens
	norm      *tokenTrie // normalized=true tokens, by normalized content
}

// tokenTrie is a byte trie over token contents.
type tokenTrie struct {
	first  [256]bool        // bytes some token starts with
	nfirst int              // how many distinct bytes first holds
	lead   byte             // the one byte first holds, when nfirst is 1
	edges  map[uint32]int32 // node<<8|byte -> child node
	term   []int32          // per node: token index ending here, or -1
}

func newTokenTrie() *tokenTrie {
	return &tokenTrie{edges: make(map[uint32]int32), term: []int32{-1}}
}

func (t *tokenTrie) add(content string, token int32) {
	if content == "" {
		return
	}
	if !t.first[content[0]] {
		t.first[content[0]] = true
		t.nfirst++
		t.lead = content[0]
	}
	node := int32(0)
	for i := 0; i < len(content); i++ {
		key := uint32(node)<<8 | uint32(content[i])
		child, ok := t.edges[key]
		if !ok {
			child = int32(len(t.term))
			t.term = append(t.term, -1)
			t.edges[key] = child
		}
		node = child
	}
	if t.term[node] < 0 {
		t.term[node] = token
	}
}

// find returns the leftmost-longest token occurrence in s at or after from,
// or token -1 when there is none.
func (t *tokenTrie) find(s string, from int) (start, end int, token int32) {
	if t == nil || len(t.term) == 1 {
		return 0, 0, -1
	}
	for i := from; i < len(s); i++ {
		if t.nfirst == 1 {
			// Most vocabularies' added tokens all start with '<':
			// IndexByte's vectorized search skips to the next one, where
			// the table test below costs a load and a branch per byte
			// of a long prompt.
			j := strings.IndexByte(s[i:], t.lead)
			if j < 0 {
				break
			}
			i += j
		} else if !t.first[s[i]] {
			continue
		}
		node, best, bestTok := int32(0), -1, int32(-1)
		for j := i; j < len(s); j++ {
			child, ok := t.edges[uint32(node)<<8|uint32(s[j])]
			if !ok {
				break
			}
			node = child
			if tok := t.term[node]; tok >= 0 {
				best, bestTok = j+1, tok
			}
		}
		if bestTok >= 0 {
			return i, best, bestTok
		}
	}
	return 0, 0, -1
}

// split appends the sections of s[base:base+len(s)] to dst; offsets in the
// result are relative to s. It honours single_word, lstrip and rstrip.
func (av *addedVocab) split(dst []section, s string, trie *tokenTrie) []section {
	start := 0
	for i := 0; i < len(s); {
		ms, me, tok := trie.find(s, i)
		if tok < 0 {
			break
		}
		t := &av.tokens[tok]
		if t.singleWord && !isSingleWord(s, ms, me) {
			i = me
			continue
		}
		if t.lstrip {
			ms = max(start, trimSpaceLeft(s, ms))
		}
		if t.rstrip {
			me = trimSpaceRight(s, me)
		}
		if start < ms {
			dst = append(dst, section{start, ms, -1})
		}
		dst = append(dst, section{ms, me, tok})
		start, i = me, me
	}
	if start < len(s) {
		dst = append(dst, section{start, len(s), -1})
	}
	return dst
}

// isSingleWord reports that s[start:end] is not glued to a word character
// on either side, HF's test for single_word tokens.
func isSingleWord(s string, start, end int) bool {
	if start > 0 {
		r, _ := utf8.DecodeLastRuneInString(s[:start])
		if isAlnum(r) {
			return false
		}
	}
	if end < len(s) {
		r, _ := utf8.DecodeRuneInString(s[end:])
		if isAlnum(r) {
			return false
		}
	}
	return true
}

// isAlnum is Rust's char::is_alphanumeric.
func isAlnum(r rune) bool { return classOf(r)&(clsL|clsN) != 0 }

// trimSpaceLeft moves i left over whitespace.
func trimSpaceLeft(s string, i int) int {
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !isSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// trimSpaceRight moves i right over whitespace.
func trimSpaceRight(s string, i int) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !isSpace(r) {
			break
		}
		i += n
	}
	return i
}
