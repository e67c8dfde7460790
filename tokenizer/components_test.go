package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

func TestNormalizers(t *testing.T) {
	initClasses()
	tests := []struct {
		config, in, want string
	}{
		{`{"type":"NFC"}`, "e\u0301", "é"},
		{`{"type":"NFC"}`, strings.Repeat("plain ASCII text ", 3) + "e\u0301", strings.Repeat("plain ASCII text ", 3) + "é"},
		{`{"type":"NFKC"}`, strings.Repeat("ascii only, 32 bytes or more... ", 2), strings.Repeat("ascii only, 32 bytes or more... ", 2)},
		{`{"type":"NFD"}`, "é", "e\u0301"},
		{`{"type":"NFKC"}`, "ﬁ①", "fi1"},
		{`{"type":"NFKD"}`, "ﬁé", "fie\u0301"},
		{`{"type":"Lowercase"}`, "HeLLo ΣΑΣ İ", "hello σασ i\u0307"},
		{`{"type":"Strip","strip_left":true,"strip_right":false}`, " \u3000a b ", "a b "},
		{`{"type":"Strip","strip_left":true,"strip_right":true}`, "\t a b \n", "a b"},
		{`{"type":"StripAccents"}`, "e\u0301a\u0308", "ea"},
		{`{"type":"Prepend","prepend":"▁"}`, "a", "▁a"},
		{`{"type":"Prepend","prepend":"▁"}`, "", ""},
		{`{"type":"Replace","pattern":{"String":" "},"content":"▁"}`, "a b  c", "a▁b▁▁c"},
		{`{"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "}`, "a \t\n b", "a b"},
		{`{"type":"Replace","pattern":{"Regex":"x"},"content":"$0"}`, "axb", "a$0b"},
		{`{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Lowercase"}]}`, "ＡＢ", "ab"},
		{`{"type":"Sequence","normalizers":[]}`, "Ab", "Ab"},
	}
	for _, tt := range tests {
		n, err := buildNormalizer([]byte(tt.config))
		if err != nil {
			t.Fatalf("%s: %v", tt.config, err)
		}
		if got := n.normalize(tt.in); got != tt.want {
			t.Errorf("%s: %q -> %q, want %q", tt.config, tt.in, got, tt.want)
		}
	}
}

func TestDecoders(t *testing.T) {
	tests := []struct {
		config string
		tokens []string
		want   string
	}{
		{`{"type":"ByteLevel"}`, []string{"Hello", "Ġworld", "Ċ"}, "Hello world\n"},
		{`{"type":"ByteLevel"}`, []string{"ä½", "ł"}, "你"},
		{`{"type":"ByteLevel"}`, []string{"a", "<｜User｜>", "b"}, "a<｜User｜>b"},
		{`{"type":"ByteFallback"}`, []string{"a", "<0xE4>", "<0xBD>", "<0xA0>", "b"}, "a你b"},
		{`{"type":"ByteFallback"}`, []string{"<0xE4>", "<0xBD>", "x", "<0xZZ>"}, "\uFFFD\uFFFDx<0xZZ>"},
		{`{"type":"Fuse"}`, []string{"a", "b"}, "ab"},
		{`{"type":"Sequence","decoders":[{"type":"Strip","content":" ","start":1,"stop":1}]}`, []string{"  a  ", " b"}, " a b"},
		{`{"type":"Replace","pattern":{"String":"▁"},"content":" "}`, []string{"▁a", "▁▁b"}, " a  b"},
		{`{"type":"Replace","pattern":{"Regex":"_+"},"content":"-"}`, []string{"a__b"}, "a-b"},
		{`{"type":"Metaspace","replacement":"▁","prepend_scheme":"always"}`, []string{"▁Hey", "▁friend"}, "Hey friend"},
		{`{"type":"Metaspace","replacement":"▁","prepend_scheme":"never"}`, []string{"▁Hey", "▁friend"}, " Hey friend"},
		{`{"type":"BPEDecoder","suffix":"</w>"}`, []string{"hel", "lo</w>", "you</w>"}, "hello you"},
		{`{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]}`,
			[]string{"▁Hi", "<0x21>", "▁", "▁there"}, "Hi!  there"},
	}
	av, _ := buildAdded([]addedTokenJSON{{ID: 9, Content: "<｜User｜>", Special: true}}, nil)
	for _, tt := range tests {
		d, err := buildDecoder([]byte(tt.config), av)
		if err != nil {
			t.Fatalf("%s: %v", tt.config, err)
		}
		if got := strings.Join(d.decodeChain(tt.tokens), ""); got != tt.want {
			t.Errorf("%s: %q -> %q, want %q", tt.config, tt.tokens, got, tt.want)
		}
	}
}

func TestDecodeWithoutDecoder(t *testing.T) {
	tk, err := Parse([]byte(miniJSON(miniModel, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got := tk.Decode([]int{2, 0, 1}, false); got != "ab a b" {
		t.Errorf("Decode = %q, want tokens joined by spaces", got)
	}
}

// TestBPEOptions covers the model settings the real files do not all use.
func TestBPEOptions(t *testing.T) {
	tests := []struct {
		name, model, text string
		want              []int
	}{
		{"merges as pairs", `{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]}`, "ab ba", []int{2, 1, 0}},
		{"rank order", `{"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4},"merges":["b c","a b"]}`, "abc", []int{0, 4}},
		{"leftmost on ties", `{"type":"BPE","vocab":{"a":0,"aa":1},"merges":["a a"]}`, "aaa", []int{1, 0}},
		{"ignore merges", `{"type":"BPE","ignore_merges":true,"vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4,"abc":5},"merges":["b c","a b","a bc"]}`, "abc", []int{5}},
		{"unknown dropped", `{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]}`, "axb", []int{0, 1}},
		{"unk", `{"type":"BPE","unk_token":"<unk>","vocab":{"<unk>":0,"a":1},"merges":[]}`, "axya", []int{1, 0, 0, 1}},
		{"fuse unk", `{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"vocab":{"<unk>":0,"a":1},"merges":[]}`, "axya z", []int{1, 0, 1, 0}},
		{"unk not in vocab", `{"type":"BPE","unk_token":"<unk>","vocab":{"a":1},"merges":[]}`, "axa", []int{1, 1}},
		{"byte fallback", `{"type":"BPE","byte_fallback":true,"unk_token":"<unk>","vocab":{"<unk>":0,"a":1,"<0xC3>":2,"<0xA9>":3},"merges":[]}`, "aé", []int{1, 2, 3}},
		{"byte fallback missing byte", `{"type":"BPE","byte_fallback":true,"unk_token":"<unk>","vocab":{"<unk>":0,"a":1,"<0xC3>":2},"merges":[]}`, "aé", []int{1, 0}},
		{"continuing subword prefix", `{"type":"BPE","continuing_subword_prefix":"##","vocab":{"a":0,"##b":1,"##c":2,"ab":3},"merges":["a ##b"]}`, "abc", []int{3, 2}},
		{"end of word suffix", `{"type":"BPE","end_of_word_suffix":"</w>","vocab":{"a":0,"b</w>":1,"ab</w>":2,"a</w>":3},"merges":["a b</w>"]}`, "ab a", []int{2, 3}},
		{"dropout zero", `{"type":"BPE","dropout":0.0,"vocab":{"a":0},"merges":[]}`, "a", []int{0}},
		{"untyped model", `{"vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}`, "ab", []int{2}},
	}
	for _, tt := range tests {
		tk, err := Parse([]byte(miniJSON(tt.model, nil)))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got := tk.Encode(tt.text, false); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Encode(%q) = %v, want %v", tt.name, tt.text, got, tt.want)
		}
	}
}

// TestLongWordMerge checks that the heap merge used for long words agrees
// with the linear one used for short words.
func TestLongWordMerge(t *testing.T) {
	tk := loadFixture(t, "bytelevel.json", func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}
	})
	for _, unit := range []string{"Hello world the thing ", "  \n\n", "aaaa", "你好 123"} {
		long := strings.Repeat(unit, 40)
		sc := new(scratch)
		syms := tk.model.initialSymbols(nil, long, true, sc)
		short := tk.model.mergeSmall(slices.Clone(syms), sc)
		heap := tk.model.mergeHeap(slices.Clone(syms), sc)
		if !slices.Equal(short, heap) {
			t.Errorf("%q: heap merge differs from linear merge", unit)
		}
	}
}

func TestAddedTokenFlags(t *testing.T) {
	base := loadFixture(t, "bytelevel.json", func(m map[string]any) { m["added_tokens"] = []any{} })
	added := []any{
		map[string]any{"id": 500, "content": "<mask>", "lstrip": true, "rstrip": true, "special": true, "normalized": false},
		map[string]any{"id": 501, "content": "ab", "single_word": true, "special": false, "normalized": false},
		map[string]any{"id": 502, "content": "HeLLo", "special": false, "normalized": true},
		map[string]any{"id": 503, "content": "<|im_start|>", "special": true, "normalized": false},
		map[string]any{"id": 504, "content": "<|im_start|>x", "special": true, "normalized": false},
	}
	tk := loadFixture(t, "bytelevel.json", func(m map[string]any) {
		m["added_tokens"] = added
		m["normalizer"] = map[string]any{"type": "Lowercase"}
		m["post_processor"] = nil
	})
	enc := func(parts ...any) []int {
		var ids []int
		for _, p := range parts {
			if s, ok := p.(string); ok {
				ids = append(ids, base.Encode(s, false)...)
			} else {
				ids = append(ids, p.(int))
			}
		}
		return ids
	}
	tests := []struct {
		text string
		want []int
	}{
		{"a <mask> b", enc("a", 500, "b")},
		{"a\n<mask>\t\tb", enc("a", 500, "b")},
		{"ab cab ab.", enc(501, " cab ", 501, ".")},
		{"xab", enc("xab")},
		{"say HELLO hello", enc("say ", 502, " ", 502)},          // matched after lowercasing
		{"<|im_start|>x <|im_start|>y", enc(504, " ", 503, "y")}, // longest match wins
		{"<|IM_START|>", enc("<|im_start|>")},                    // raw tokens are matched before lowercasing only
		{"<|im_start|>", enc(503)},
		{"", nil},
	}
	for _, tt := range tests {
		if got := tk.Encode(tt.text, false); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// TestUnicodeNormEveryBMPRune: isNormal's table of inert characters
// (skipped without norm's check) holds up for every character of the
// Basic Multilingual Plane in every form, between a letter and a mark that
// may compose with it, and before a voicing mark and a trailing jamo.
func TestUnicodeNormEveryBMPRune(t *testing.T) {
	for _, form := range []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD} {
		n := unicodeNorm{form: form}
		for r := rune(0x80); r < 0x10000; r++ {
			if !utf8.ValidRune(r) {
				continue
			}
			c := string(r)
			for _, s := range []string{c, "a" + c + "\u0301", c + "\u3099", c + "\u11a8x", "\u4e2d" + c + "\u0308"} {
				if got, want := n.normalize(s), form.String(s); got != want {
					t.Fatalf("form %v, %q: %q, want %q", form, s, got, want)
				}
			}
		}
	}
}

// TestUnicodeNormSkipsASCII: the forms, which check only the non-ASCII
// stretches of a text (with the ASCII byte before each), give exactly
// what norm gives for the whole text, on texts that mix ASCII with marks
// that compose with the letter before them, Hangul jamo, compatibility
// characters, invalid UTF-8 and runs around the sizes read at once.
func TestUnicodeNormSkipsASCII(t *testing.T) {
	pieces := []string{"a", "e", " ", "plain ascii text of some length, ", "\u0301", "\u0308\u0301", "é", "e\u0301",
		"\u1100", "\u1161", "\u11a8", "가", "ﬁ", "①", "Ａ", "Å", "\u212b", "你好", "\xff", "\xe4\xbd", "\u0345", "ᾳ", "ṩ", "s\u0323\u0307", "🙂", "\u200d", "x",
		// Scripts whose letters are mostly inert (isNormal skips them by
		// table), next to the marks and jamo that compose with them.
		"模型的输出取决于上下文，", "。", "か", "\u3099", "カ\u309a", "が", "ｶﾞ", "\uf900", "\u2126", "и", "\u0306", "й",
		"\u0958", "क\u093c", "ب\u0651\u064e", "각", "가\u11a8", "\u3000", "﹏", "ㄱ",
		"\xe0\x80\xaf", "\xed\xa0\x80"} // an overlong '/' and an encoded surrogate: invalid
	rng := rand.New(rand.NewPCG(11, 12))
	for _, form := range []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD} {
		n := unicodeNorm{form: form}
		for range 3000 {
			var b strings.Builder
			for range rng.IntN(24) {
				b.WriteString(pieces[rng.IntN(len(pieces))])
				if rng.IntN(4) == 0 {
					b.WriteString(strings.Repeat("z", rng.IntN(70)))
				}
			}
			s := b.String()
			if got, want := n.normalize(s), form.String(s); got != want {
				t.Fatalf("form %v, %q: %q, want %q", form, s, got, want)
			}
		}
	}
}
