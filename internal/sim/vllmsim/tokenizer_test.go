package vllmsim

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTokenize(t *testing.T) {
	cases := []struct {
		text   string
		pieces []string // expected pieces; specials as their text
	}{
		{"hello world", []string{"hello", " world"}},
		{"Hello, world!", []string{"Hello", ",", " world", "!"}},
		{"a  b", []string{"a", " ", " b"}},
		{"line\n\nnext", []string{"line", "\n\n", "next"}},
		{"<|im_start|>user\nhi<|im_end|>", []string{"<|im_start|>", "user", "\n", "hi", "<|im_end|>"}},
		{"<|not special|>", []string{"<", "|", "not", " special", "|", ">"}},
		{"supercalifragilistic", []string{"supercalifra", "gilistic"}},
		{"naïve café", []string{"naïve", " café"}},
		{"", nil},
	}
	for _, tc := range cases {
		got := tokenize(nil, tc.text, false)
		var want []uint64
		for _, p := range tc.pieces {
			if id, n := matchSpecial(p); n == len(p) {
				want = append(want, id)
			} else {
				want = append(want, pieceID(p))
			}
		}
		if len(got) != len(want) {
			t.Errorf("tokenize(%q) = %v, want %v", tc.text, got, want)
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("tokenize(%q)[%d] = %d, want %d (%q)", tc.text, i, got[i], want[i], tc.pieces[i])
			}
		}
	}
	if got := tokenize(nil, "x", true); len(got) != 2 || got[0] != tokBOS {
		t.Errorf("add_special_tokens: %v", got)
	}
}

// TestGeneratedTextRetokenizes: the text of generated tokens tokenizes back
// to the same ids, so a gateway tokenizing a conversation sees them.
func TestGeneratedTextRetokenizes(t *testing.T) {
	seed := promptSeed([]uint64{1, 2, 3})
	var text strings.Builder
	var ids []uint64
	for k := range 50 {
		id, s := outputToken(seed, k)
		ids = append(ids, id)
		text.WriteString(s)
	}
	got := tokenize(nil, text.String(), false)
	if len(got) != len(ids) {
		t.Fatalf("%d tokens, want %d", len(got), len(ids))
	}
	for i := range got {
		if got[i] != ids[i] {
			t.Fatalf("token %d: %d vs %d", i, got[i], ids[i])
		}
	}
	other := promptSeed([]uint64{1, 2, 4})
	same := 0
	for k := range 20 {
		a, _ := outputToken(seed, k)
		b, _ := outputToken(seed, k)
		c, _ := outputToken(other, k)
		if a != b {
			t.Fatal("outputToken is not deterministic")
		}
		if a == c {
			same++
		}
	}
	if same == 20 {
		t.Error("different prompts generate the same text")
	}
}

func TestRenderChat(t *testing.T) {
	msgs := []chatMessage{
		{Role: "system", Content: json.RawMessage(`"be brief"`)},
		{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"a"},{"type":"text","text":"b"}]`)},
		{Role: "assistant", Content: json.RawMessage(`null`), ToolCalls: json.RawMessage(`[ {"id": "1"} ]`)},
	}
	got, err := renderChat(msgs, json.RawMessage(`[{"type": "function"}]`), true, false)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\n# Tools\n[{\"type\":\"function\"}]<|im_end|>\n" +
		"<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n[{\"id\":\"1\"}]<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("render:\n%q\nwant\n%q", got, want)
	}
	cont, err := renderChat(msgs[:2], nil, false, true)
	if err != nil || !strings.HasSuffix(cont, "a\nb") {
		t.Errorf("continue_final_message: %q %v", cont, err)
	}
	for _, bad := range [][]chatMessage{
		nil,
		{{Role: "", Content: json.RawMessage(`"x"`)}},
		{{Role: "user", Content: json.RawMessage(`42`)}},
		{{Role: "user", Content: json.RawMessage(`[{"type":"image_url"}]`)}},
	} {
		if _, err := renderChat(bad, nil, true, false); err == nil {
			t.Errorf("renderChat(%v) accepted", bad)
		}
	}
	if _, err := renderChat(msgs, nil, true, true); err == nil {
		t.Error("continue_final_message with add_generation_prompt accepted")
	}
}

// wordBoundaryPrefixHolds checks the tokenizer's prefix property at every
// word boundary (a space between two word runes) of s.
func wordBoundaryPrefixHolds(t *testing.T, s string) {
	full := tokenize(nil, s, true)
	for i := 1; i+1 < len(s); i++ {
		if s[i] != ' ' {
			continue
		}
		prev, _ := utf8.DecodeLastRuneInString(s[:i])
		next, _ := utf8.DecodeRuneInString(s[i+1:])
		if !isWordRune(prev) || !isWordRune(next) {
			continue
		}
		if p := tokenize(nil, s[:i], true); !equalPrefix(p, full) {
			t.Fatalf("tokens of %q are not a prefix of those of %q", s[:i], s)
		}
	}
}

func TestTokenizePrefixProperty(t *testing.T) {
	for _, s := range []string{
		"The quick brown fox, jumps over the lazy dog.\n\nAnd then   some more words here",
		"<|im_start|>user\nhello there friend<|im_end|>\n<|im_start|>assistant\n",
		"üñí çødé wörds mixed with ASCII words and 12345 numbers",
	} {
		wordBoundaryPrefixHolds(t, s)
	}
}

func FuzzTokenize(f *testing.F) {
	for _, s := range []string{"", "hello world", "<|im_start|>x<|im_end|>", "a  b\n\tc", "ÿ\xff\xfe broken utf8", strings.Repeat("long", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a := tokenize(nil, s, false)
		b := tokenize(nil, s, false)
		if len(a) != len(b) {
			t.Fatal("not deterministic")
		}
		for i := range a {
			if a[i] != b[i] || a[i] > tokBOS {
				t.Fatalf("token %d: %d vs %d", i, a[i], b[i])
			}
		}
		if len(a) > len(s) {
			t.Fatalf("%d tokens for %d bytes", len(a), len(s))
		}
		wordBoundaryPrefixHolds(t, s)
	})
}
