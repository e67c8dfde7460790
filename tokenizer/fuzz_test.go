package tokenizer

import (
	"sync"
	"testing"
	"unicode/utf8"
)

var fuzzFixtures = []string{"bytelevel.json", "sentencepiece.json", "metaspace.json"}

// FuzzEncode feeds arbitrary bytes to every fixture: nothing may panic,
// every id must decode, the section and prefix caches must not change
// them, and on the byte-level fixture (which has no
// normalizer and no stripping added tokens) decoding must give back the
// text exactly.
func FuzzEncode(f *testing.F) {
	tks := make(map[string]*Tokenizer)
	for _, name := range fuzzFixtures {
		tks[name] = loadFixture(f, name, nil)
	}
	for _, c := range byteLevelCases {
		f.Add(c.text)
	}
	for _, s := range patternCorpus {
		f.Add(s)
	}
	f.Add("\xff\xfe<|im_start|>\xc3")
	f.Fuzz(func(t *testing.T, s string) {
		for name, tk := range tks {
			ids := tk.Encode(s, true)
			for _, id := range ids {
				if _, ok := tk.IDToToken(id); !ok {
					t.Fatalf("%s: Encode(%q) gave id %d, which has no token", name, s, id)
				}
			}
			tk.Decode(ids, true)
			checkSectionCache(t, name, tk, s)
		}
		checkPrefixFuzz(t, tks["bytelevel.json"], s)
		if !utf8.ValidString(s) {
			return
		}
		tk := tks["bytelevel.json"]
		if got := tk.Decode(tk.Encode(s, false), false); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
	})
}

// TestConcurrentEncode runs encoders in parallel (meaningful under -race)
// and checks they all agree with a sequential run.
func TestConcurrentEncode(t *testing.T) {
	tk := loadFixture(t, "bytelevel.json", nil)
	texts := append([]string(nil), patternCorpus...)
	want := make([][]int, len(texts))
	for i, s := range texts {
		want[i] = tk.Encode(s, true)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 50 {
				i := (g*7 + k) % len(texts)
				got := tk.Encode(texts[i], true)
				if len(got) != len(want[i]) {
					t.Errorf("goroutine %d: %q gave %v, want %v", g, texts[i], got, want[i])
					return
				}
			}
		}()
	}
	wg.Wait()
}
