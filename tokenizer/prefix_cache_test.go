package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// withPrefixes is tk with a fresh prefix cache and no section cache, so
// that only the prefix cache can change what it encodes.
func withPrefixes(tk *Tokenizer) *Tokenizer {
	c := *tk
	c.sections, c.prefixes = nil, newPrefixCache()
	return &c
}

// longDoc joins corpus texts with varied separators until the result has
// at least n bytes: letters, digits, CJK, emoji, code and whitespace runs
// next to the fences and the checkpoints.
func longDoc(rng *rand.Rand, corpus []string, n int) string {
	seps := []string{" then ", "\n", "  ", "", " ", "\n\n", ". ", " 42 ", "\t"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(corpus[rng.IntN(len(corpus))])
		b.WriteString(seps[rng.IntN(len(seps))])
	}
	return b.String()
}

// checkPrefixCache encodes variants of doc — a prefix of it cut anywhere,
// then one of suffixes — through a prefix cache and without one, in an
// order that stores and then reads checkpoints, and requires equal ids.
// It returns how many encodings resumed from a stored checkpoint.
func checkPrefixCache(t *testing.T, name string, tk *Tokenizer, rng *rand.Rand, doc string, suffixes []string) int {
	t.Helper()
	plain, cached := withoutSections(tk), withPrefixes(tk)
	for i := range 60 {
		cut := minPrefixBytes + rng.IntN(len(doc)-minPrefixBytes+1)
		if i%3 == 0 {
			// Cut near a checkpoint, where fences are chosen.
			k := cut / prefixStride
			cut = min(len(doc), k*prefixStride+rng.IntN(2*fenceMargin+2)-fenceMargin)
		}
		s := doc[:cut] + suffixes[rng.IntN(len(suffixes))]
		for _, special := range []bool{false, true} {
			want := plain.Encode(s, special)
			if got := cached.Encode(s, special); !slices.Equal(got, want) {
				t.Fatalf("%s: variant %d (cut %d, special %v): ids differ at %d of %d\ntext %q",
					name, i, cut, special, firstDiff(got, want), len(want), s)
			}
		}
	}
	return int(cached.prefixes.hits.Load())
}

func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestPrefixCacheSameIDs: on the byte-level fixture and on every real
// tokenizer whose pre-tokenizer can resume, ids through the prefix cache
// are the ids, and the cache is used.
func TestPrefixCacheSameIDs(t *testing.T) {
	// Texts that name added tokens would cut the document into sections
	// too short for the cache; they end some variants instead.
	var corpus, special []string
	for _, s := range append(append([]string{}, patternCorpus...), realTexts...) {
		if strings.ContainsAny(s, "<｜") {
			special = append(special, s)
		} else {
			corpus = append(corpus, s)
		}
	}
	suffixes := append([]string{"", " u123", "x", " question 7?", "\n\n", "日本"}, special...)
	run := func(t *testing.T, name string, tk *Tokenizer) {
		if tk.prefixes == nil {
			t.Fatalf("%s: no prefix cache", name)
		}
		rng := rand.New(rand.NewPCG(7, uint64(len(name))))
		hits := 0
		for d := range 3 {
			hits += checkPrefixCache(t, fmt.Sprintf("%s doc %d", name, d), tk, rng, longDoc(rng, corpus, 12<<10), suffixes)
		}
		if hits == 0 {
			t.Errorf("%s: no encoding resumed from a checkpoint", name)
		}
		t.Logf("%s: %d of 360 encodings resumed", name, hits)
	}
	t.Run("bytelevel.json", func(t *testing.T) { run(t, "bytelevel.json", loadFixture(t, "bytelevel.json", nil)) })
	for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3", "gptoss"} {
		t.Run(name, func(t *testing.T) { run(t, name, loadReal(t, name)) })
	}
}

// TestPrefixCacheCJKFences: on Chinese and Japanese text, whose only
// fences are CJK punctuation after an ideograph, ids through the prefix
// cache are the ids on every real tokenizer that can resume, and encodings
// do resume. The pieces put next to the marks what could break a fence:
// kana and their punctuation (・ is in DeepSeek's CJK ranges), digits,
// Latin words and apostrophes, other and repeated marks, newlines,
// spaces, fullwidth letters and a combining mark.
func TestPrefixCacheCJKFences(t *testing.T) {
	pieces := []string{"模型的输出取决于上下文", "我们在网关中计算令牌", "缓存", "中", "。", "，", "、", "：", "；", "！", "？",
		"。。", "？！", "カタカナ・ひらがな", "ー", "123", "４５", "abc", "'s", "'", "\n", " ", "\n\n", "Ａｂ", "e\u0301", "「引用」", "（注）", "…", "🙂"}
	run := func(t *testing.T, name string, tk *Tokenizer) {
		rng := rand.New(rand.NewPCG(21, uint64(len(name))))
		for d := range 3 {
			// Doc 0 is Chinese sentences only: no space fence, so
			// resuming there is the CJK fences' doing.
			var b strings.Builder
			for b.Len() < 12<<10 {
				if d == 0 || rng.IntN(3) > 0 {
					b.WriteString(pieces[rng.IntN(2)] + pieces[4+rng.IntN(7)])
				} else {
					b.WriteString(pieces[rng.IntN(len(pieces))])
				}
			}
			hits := checkPrefixCache(t, fmt.Sprintf("%s doc %d", name, d), tk, rng, b.String(), []string{"", "。问题", "3", "？", "x", "・"})
			if d == 0 && hits == 0 {
				t.Errorf("%s: no encoding of Chinese text resumed", name)
			}
			t.Logf("%s doc %d: %d of 120 encodings resumed", name, d, hits)
		}
	}
	for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3", "gptoss"} {
		t.Run(name, func(t *testing.T) { run(t, name, loadReal(t, name)) })
	}
}

// TestPrefixCacheFencesAtCheckpoints puts fences and the long runs that
// examine past them (whitespace, all-caps words, digits, punctuation) at
// every offset around the first checkpoints.
func TestPrefixCacheFencesAtCheckpoints(t *testing.T) {
	tk := withPrefixes(loadFixture(t, "bytelevel.json", nil))
	plain := withoutSections(tk)
	fill := strings.Repeat("word ", 1000)
	for _, probe := range []string{"a b", "ab  cd", "A\n\n b", "ABCD EFGH", "12345 x", "x!!! y", "x's y", " \t \n x"} {
		for off := prefixStride - 2*fenceMargin; off <= prefixStride+fenceMargin; off++ {
			base := fill[:off] + probe + fill
			for _, tail := range []string{"", " new", "Z"} {
				s := base[:5000] + tail
				want := plain.Encode(s, false)
				for pass := range 3 {
					if got := tk.Encode(s, false); !slices.Equal(got, want) {
						t.Fatalf("probe %q at %d, tail %q, pass %d: ids differ at %d", probe, off, tail, pass, firstDiff(got, want))
					}
				}
			}
		}
	}
}

// TestPrefixCacheResumable: the cache is on exactly for the pre-tokenizers
// the fence argument holds for.
func TestPrefixCacheResumable(t *testing.T) {
	for name, want := range map[string]bool{"bytelevel.json": true, "sentencepiece.json": false, "metaspace.json": false} {
		if got := loadFixture(t, name, nil).prefixes != nil; got != want {
			t.Errorf("%s: prefix cache %v, want %v", name, got, want)
		}
	}
	unknown := loadFixture(t, "bytelevel.json", func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\w+|\s+`}, "behavior": "Isolated", "invert": false}
	})
	if unknown.prefixes != nil {
		t.Error("a regex the fence argument does not cover has a prefix cache")
	}
}

// TestPrefixCacheStores: a section is stored once a prefix of it was seen,
// a stored prefix is found for a text that extends it, and the budget
// holds.
func TestPrefixCacheStores(t *testing.T) {
	tk := withPrefixes(loadFixture(t, "bytelevel.json", nil))
	c := tk.prefixes
	doc := strings.Repeat("alpha beta gamma ", 600) // 10,200 bytes
	tk.Encode(doc+" one", false)
	if len(c.m) != 0 || len(c.seen) == 0 {
		t.Fatalf("after one sighting: %d entries, %d seen; want 0 and some", len(c.m), len(c.seen))
	}
	tk.Encode(doc+" two", false)
	if len(c.m) == 0 {
		t.Fatal("a section sharing a seen prefix was not stored")
	}
	e, ok := c.longest(c.hashes(nil, doc+" three", true), doc+" three")
	// Found by the document's last checkpoint, resumed from a recorded
	// fence near where " two" and " three" differ: fenceMargin bytes or
	// more before it, no more than fenceSpacing and a word further back.
	same := len(doc) + len(" t")
	if !ok || e.n != len(doc)/prefixStride*prefixStride || !isFence(doc, e.fence) ||
		e.fence+fenceMargin > same || e.fence < same-fenceMargin-fenceSpacing-len("gamma ") {
		t.Fatalf("longest: n %d, fence %d, ok %v; want the last checkpoint of the document, resuming on a fence in [%d, %d]",
			e.n, e.fence, ok, same-fenceMargin-fenceSpacing-len("gamma "), same-fenceMargin)
	}
	if want := tk.Encode(doc[:e.fence], false); e.nids != len(want) || !slices.Equal(toInt32(want), e.ids[:e.nids]) {
		t.Fatalf("the %d ids before the fence are not the encoding of the text before it (%d ids)", e.nids, len(want))
	}
	if _, ok := c.longest(c.hashes(nil, doc, false), doc); ok {
		t.Error("a checkpoint stored for the first section is found for a later one")
	}
	for i := range 200 {
		s := fmt.Sprintf("doc %d ", i) + doc
		tk.Encode(s, false)
		tk.Encode(s, false)
		if c.bytes > prefixCacheBudget {
			t.Fatalf("cache holds %d bytes, budget %d", c.bytes, prefixCacheBudget)
		}
	}
}

// checkPrefixFuzz makes a document long enough for the prefix cache out of
// the fuzzer's text (with fences between the copies) and requires the
// same ids through the cache as without, for two endings of two cuts.
func checkPrefixFuzz(t *testing.T, tk *Tokenizer, s string) {
	t.Helper()
	if s == "" || len(s) > 2048 {
		return
	}
	var b strings.Builder
	for b.Len() < minPrefixBytes+prefixStride {
		b.WriteString(s)
		b.WriteString(" ab ")
	}
	doc := b.String()
	plain, cached := withoutSections(tk), withPrefixes(tk)
	for _, cut := range []int{len(doc), len(doc) - len(s)/2 - 2} {
		for _, tail := range []string{" x", s, ""} {
			text := doc[:cut] + tail
			want := plain.Encode(text, false)
			for pass := range 3 {
				if got := cached.Encode(text, false); !slices.Equal(got, want) {
					t.Fatalf("document of %q cut at %d, tail %q, pass %d: ids differ at %d", s, cut, tail, pass, firstDiff(got, want))
				}
			}
		}
	}
}
