package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// withoutSections is tk with the section and prefix caches off;
// withSections has a section cache that caches every section, however
// short.
func withoutSections(tk *Tokenizer) *Tokenizer {
	c := *tk
	c.sections, c.prefixes = nil, nil
	return &c
}

func withSections(tk *Tokenizer) *Tokenizer {
	c := *tk
	c.sections = newSectionCache()
	c.sections.minBytes = 1
	return &c
}

// checkSectionCache holds the section cache to encoding without it: the
// ids of s are the same on a miss and on a hit.
func checkSectionCache(t *testing.T, name string, tk *Tokenizer, s string) {
	t.Helper()
	plain, cached := withoutSections(tk), withSections(tk)
	for _, special := range []bool{false, true} {
		want := plain.Encode(s, special)
		for pass := range 3 { // the second stores the ids, the third reads them
			if got := cached.Encode(s, special); !slices.Equal(got, want) {
				t.Fatalf("%s: Encode(%q, %v) pass %d = %v, want %v", name, s, special, pass, got, want)
			}
		}
	}
}

// TestSectionCacheSameIDs: on every fixture, with sections at the start
// of the text and after added tokens, cached ids are the ids.
func TestSectionCacheSameIDs(t *testing.T) {
	texts := append([]string{
		"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n  hello   world<|im_end|>",
		" leading space<|im_start|> after the token ",
		strings.Repeat("The quick brown fox. ", 60) + "<|im_end|>" + strings.Repeat("jumps over ", 80),
	}, patternCorpus...)
	for _, name := range fuzzFixtures {
		tk := loadFixture(t, name, nil)
		for _, s := range texts {
			checkSectionCache(t, name, tk, s)
		}
	}
}

// TestSectionCacheBudget: a section is stored the second time it is put,
// the cache never holds more than its budget, and a section beyond a
// quarter of it is not stored.
func TestSectionCacheBudget(t *testing.T) {
	c := newSectionCache()
	c.put("once", false, []int{1})
	if _, ok := c.get("once", false); ok {
		t.Fatalf("a section put once was stored")
	}
	c.put("once", true, []int{1})
	if _, ok := c.get("once", true); ok {
		t.Fatalf("a section put once at the start was stored (first is part of the key)")
	}
	c.put("once", false, []int{1})
	if ids, ok := c.get("once", false); !ok || !slices.Equal(ids, []int32{1}) {
		t.Fatalf("a section put twice is not stored: %v %v", ids, ok)
	}
	big := strings.Repeat("x", sectionCacheBudget/4+1)
	c.put(big, true, []int{1})
	c.put(big, true, []int{1})
	if _, ok := c.get(big, true); ok {
		t.Fatalf("a section beyond a quarter of the budget was stored")
	}
	part := strings.Repeat("y", sectionCacheBudget/8)
	for i := range 20 {
		c.put(part+string(rune('a'+i)), false, []int{i})
		c.put(part+string(rune('a'+i)), false, []int{i})
		if c.bytes > sectionCacheBudget {
			t.Fatalf("after %d puts the cache holds %d bytes, over its budget %d", i+1, c.bytes, sectionCacheBudget)
		}
	}
	if ids, ok := c.get(part+"t", false); !ok || !slices.Equal(ids, []int32{19}) {
		t.Fatalf("the last section put is not there: %v %v", ids, ok)
	}
}

// TestSectionCacheKeepsLongSections: a long section is cached even when
// the tokenizer has a prefix cache. The prefix cache can resume only at a
// fence (prefix_cache.go), which text in Cyrillic, Greek or Arabic script,
// or dense punctuation, does not have: leaving long sections to it alone
// made a repeated 35 KB Russian section 8 times slower to encode.
func TestSectionCacheKeepsLongSections(t *testing.T) {
	tk := withSections(loadFixture(t, "bytelevel.json", nil))
	tk.prefixes = newPrefixCache()
	for _, doc := range []string{
		strings.Repeat("Привет, как дела? ", 1200),
		strings.Repeat("a1,b2;c3|", 2000),
	} {
		want := withoutSections(tk).Encode(doc, false)
		for pass := range 3 {
			if got := tk.Encode(doc, false); !slices.Equal(got, want) {
				t.Fatalf("pass %d: ids differ at %d of %d", pass, firstDiff(got, want), len(want))
			}
		}
		if _, ok := tk.sections.get(doc, true); !ok {
			t.Errorf("a %d-byte section encoded three times is not in the section cache", len(doc))
		}
	}
}
