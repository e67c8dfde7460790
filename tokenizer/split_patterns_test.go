package tokenizer

import (
	"slices"
	"sort"
	"testing"
	"unicode/utf8"
)

// patternCorpus holds inputs that exercise the corners of the known
// patterns: contractions in both cases, runs of whitespace before words
// and line breaks, marks, digits of several scripts, mixed case and emoji.
var patternCorpus = []string{
	"", "a", " ", "  ", "\n", " \n", "\n ", "  \n  \n  x", "\r\n\r\n", "\t\tx", " \u00a0x", "x \u3000 y",
	"Hello world", "hello  world", "I'm you'RE they'LL it'S 'd 'x", "'s's", "don't//stop", "x'", "'",
	"123456 ١٢٣٤ ①②③④ ⅫⅫ", "3.14 1,000", "a1b22c333d4444",
	"CamelCase XMLHttpRequest iPhone ABCdef abcDEF", "ǅemal ǈ ǋ", "Straße ŉ", "e\u0301 \u0301a \u0301\u0301 a\u0301\u0301b",
	"日本語テキスト ひらがな カタカナ 한국어", "中文，标点。", "مرحبا بالعالم", "ـــ", "ʰʱ xʰ",
	"emoji 😀 👨\u200d👩\u200d👧 🏳\ufe0f\u200d🌈", "!!! ... ??? ///", " !a", " ?\n\n", "a\n\n\nb", "x  ", "x \n",
	"def f(x):\n    return x\n", "{\"a\": [1, 2]}", ".append(x) _id -x +y", "<|im_start|>", "\x00\x01\x1f", "\u200b\u200c\u200d",
	"\u0085x\u2028y\u2029", "ｆｕｌｌ　ｗｉｄｔｈ", "𝔘𝔫𝔦 𝟙𝟚", "ΑΒΓ αβγ Ωmega",
}

// scannerSpans returns the matches the scanner finds in s.
func scannerSpans(m matchFunc, s string) []span {
	return matchFinder{m}.spans(nil, s)
}

func checkPattern(t *testing.T, pattern string, s string) {
	t.Helper()
	re, err := compileRegex(pattern)
	if err != nil {
		t.Fatal(err)
	}
	want := re.spans(nil, s)
	got := scannerSpans(knownPatterns[pattern], s)
	if !slices.Equal(got, want) {
		t.Errorf("pattern %.40q on %q:\nscanner %v\nregexp2 %v", pattern, s, pieces(s, got), pieces(s, want))
	}
}

func pieces(s string, spans []span) []string {
	var out []string
	for _, sp := range spans {
		out = append(out, s[sp.start:sp.end])
	}
	return out
}

func sortedPatterns() []string {
	var ps []string
	for p := range knownPatterns {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// TestScannersMatchRegexp2 checks each hand-written scanner against the
// general engine on the corpus and on every pair of corpus strings.
func TestScannersMatchRegexp2(t *testing.T) {
	initClasses()
	for _, p := range sortedPatterns() {
		for _, a := range patternCorpus {
			checkPattern(t, p, a)
			for _, b := range patternCorpus[:20] {
				checkPattern(t, p, a+b)
			}
		}
	}
}

// FuzzSplitPatterns compares every scanner with regexp2 on arbitrary text.
func FuzzSplitPatterns(f *testing.F) {
	initClasses()
	for _, s := range patternCorpus {
		f.Add(s)
	}
	patterns := sortedPatterns()
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			s = validUTF8(s)
		}
		for _, p := range patterns {
			checkPattern(t, p, s)
		}
	})
}
