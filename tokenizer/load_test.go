package tokenizer

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// miniJSON assembles a tokenizer.json around a model, with the other
// components given as JSON (empty means null).
func miniJSON(model string, parts map[string]string) string {
	get := func(k, def string) string {
		if v, ok := parts[k]; ok {
			return v
		}
		return def
	}
	return `{"added_tokens":` + get("added_tokens", "[]") +
		`,"normalizer":` + get("normalizer", "null") +
		`,"pre_tokenizer":` + get("pre_tokenizer", `{"type":"WhitespaceSplit"}`) +
		`,"post_processor":` + get("post_processor", "null") +
		`,"decoder":` + get("decoder", "null") +
		`,"model":` + model + `}`
}

const miniModel = `{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}`

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"not json", `{"model":`, "parsing tokenizer.json"},
		{"no model", `{}`, "has no model"},
		{"wordpiece", miniJSON(`{"type":"WordPiece","vocab":{"a":0}}`, nil), `model "WordPiece" is not supported`},
		{"unigram", miniJSON(`{"type":"Unigram","vocab":[["a",0.0]]}`, nil), `model "Unigram" is not supported`},
		{"normalizer", miniJSON(miniModel, map[string]string{"normalizer": `{"type":"BertNormalizer"}`}), `normalizer "BertNormalizer" is not supported`},
		{"nested normalizer", miniJSON(miniModel, map[string]string{"normalizer": `{"type":"Sequence","normalizers":[{"type":"Precompiled"}]}`}), `normalizer "Precompiled" is not supported`},
		{"pre_tokenizer", miniJSON(miniModel, map[string]string{"pre_tokenizer": `{"type":"UnicodeScripts"}`}), `pre_tokenizer "UnicodeScripts" is not supported`},
		{"post_processor", miniJSON(miniModel, map[string]string{"post_processor": `{"type":"Fancy"}`}), `post_processor "Fancy" is not supported`},
		{"decoder", miniJSON(miniModel, map[string]string{"decoder": `{"type":"WordPiece"}`}), `decoder "WordPiece" is not supported`},
		{"component not an object", miniJSON(miniModel, map[string]string{"decoder": `[1]`}), "decoder"},
		{"dropout", miniJSON(`{"type":"BPE","dropout":0.1,"vocab":{"a":0},"merges":[]}`, nil), "dropout"},
		{"merge unknown token", miniJSON(`{"type":"BPE","vocab":{"a":0,"ab":1},"merges":["a b"]}`, nil), "not in the vocab"},
		{"merge result unknown", miniJSON(`{"type":"BPE","vocab":{"a":0,"b":1},"merges":[["a","b"]]}`, nil), "makes a token"},
		{"merge string format", miniJSON(`{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b c"]}`, nil), "one space"},
		{"merge pair format", miniJSON(`{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b","c"]]}`, nil), "3 parts"},
		{"merges not a list", miniJSON(`{"type":"BPE","vocab":{"a":0},"merges":{"a":1}}`, nil), "merges"},
		{"negative id", miniJSON(`{"type":"BPE","vocab":{"a":-1},"merges":[]}`, nil), "outside"},
		{"huge id", miniJSON(`{"type":"BPE","vocab":{"a":1099511627776},"merges":[]}`, nil), "outside"},
		{"added id", miniJSON(miniModel, map[string]string{"added_tokens": `[{"id":-3,"content":"x"}]`}), "outside"},
		{"added empty", miniJSON(miniModel, map[string]string{"added_tokens": `[{"id":3,"content":""}]`}), "empty content"},
		{"template token", miniJSON(miniModel, map[string]string{"post_processor": `{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}}],"special_tokens":{}}`}), `uses "<s>"`},
		{"template item", miniJSON(miniModel, map[string]string{"post_processor": `{"type":"TemplateProcessing","single":[{}],"special_tokens":{}}`}), "neither"},
		{"bert pair", miniJSON(miniModel, map[string]string{"post_processor": `{"type":"BertProcessing","cls":["[CLS]"],"sep":["[SEP]",1]}`}), "cls"},
		{"split pattern", miniJSON(miniModel, map[string]string{"pre_tokenizer": `{"type":"Split","behavior":"Isolated"}`}), "no pattern"},
		{"split regex", miniJSON(miniModel, map[string]string{"pre_tokenizer": `{"type":"Split","pattern":{"Regex":"(a"}}`}), "regex"},
		{"split behavior", miniJSON(miniModel, map[string]string{"pre_tokenizer": `{"type":"Split","pattern":{"String":"a"},"behavior":"Sideways"}`}), "behavior"},
		{"replace pattern", miniJSON(miniModel, map[string]string{"normalizer": `{"type":"Replace","pattern":{},"content":"x"}`}), "neither"},
		{"metaspace scheme", miniJSON(miniModel, map[string]string{"pre_tokenizer": `{"type":"Metaspace","prepend_scheme":"sometimes"}`}), "prepend_scheme"},
		{"char delimiter", miniJSON(miniModel, map[string]string{"pre_tokenizer": `{"type":"CharDelimiterSplit","delimiter":"ab"}`}), "one character"},
		{"strip decoder", miniJSON(miniModel, map[string]string{"decoder": `{"type":"Strip","content":"ab","start":1}`}), "Strip"},
	}
	for _, tt := range tests {
		_, err := Parse([]byte(tt.json))
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "tokenizer: ") {
			t.Errorf("%s: error %v, want one starting \"tokenizer: \" and mentioning %q", tt.name, err, tt.want)
		}
	}
}

func TestLoadFile(t *testing.T) {
	if _, err := LoadFile("testdata/bytelevel.json"); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("LoadFile of a missing file succeeded")
	}
	path := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(path, []byte(miniJSON(miniModel, nil)+strings.Repeat(" ", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadFile(path, 1024); err != nil {
		t.Errorf("file under the limit: %v", err)
	}
	if _, err := loadFile(path, 64); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("file over the limit: %v", err)
	}
	if _, err := LoadFile("testdata/prompt_8k.txt"); err == nil || !strings.Contains(err.Error(), "prompt_8k.txt") {
		t.Errorf("non-JSON file: %v", err)
	}
}

// TestFastMerges checks the hand-written merges reader against
// encoding/json on both formats and on the escapes it handles itself.
func TestFastMerges(t *testing.T) {
	tests := []struct {
		raw    string
		fastOK bool
	}{
		{`[]`, true},
		{` [ "a b" , "c d" ] `, true},
		{`[["a","b"],["Ġ","Ġ"]]`, true},
		{`["a\nb c", "\"q\" \\", "x\/ y\t"]`, true},
		{`[["a\r","\b\f"]]`, true},
		{`["\u00e9 b", "\u0000 \uD83D\uDE00"]`, true},
		{`["\uD83D b"]`, false}, // a lone surrogate goes to encoding/json
		{`["\u00G0 b"]`, false},
		{`["a b c"]`, false},
		{`[["a"]]`, false},
		{`["a b",]`, false},
		{`["a b"] x`, false},
		{"[\"a\tb c\"]", false}, // raw control characters are not JSON
	}
	for _, tt := range tests {
		fast, ok := fastMerges([]byte(tt.raw))
		if ok != tt.fastOK {
			t.Errorf("fastMerges(%s) ok = %v, want %v", tt.raw, ok, tt.fastOK)
			continue
		}
		slow, err := slowMerges([]byte(tt.raw))
		if ok && (err != nil || !slices.Equal(fast, slow)) {
			t.Errorf("fastMerges(%s) = %q, encoding/json gives %q, %v", tt.raw, fast, slow, err)
		}
	}
	if pairs, err := parseMerges([]byte(`["\uDE00 b"]`)); err != nil || pairs[0] != [2]string{"\uFFFD", "b"} {
		t.Errorf("fallback: %q, %v", pairs, err)
	}
}

// TestFastVocab checks the hand-written vocab reader against encoding/json.
func TestFastVocab(t *testing.T) {
	tests := []struct {
		raw    string
		fastOK bool
	}{
		{`{}`, true},
		{` { "a" : 0 , "Ġb\n" : 17 } `, true},
		{`{"a": -1}`, false},
		{`{"a": 1.5}`, false},
		{`{"a": 01}`, false},
		{`{"a": 1e3}`, false},
		{`{"a": 1,}`, false},
		{`{"a" 1}`, false},
	}
	for _, tt := range tests {
		fast, ok := fastVocab([]byte(tt.raw))
		if ok != tt.fastOK {
			t.Errorf("fastVocab(%s) ok = %v, want %v", tt.raw, ok, tt.fastOK)
			continue
		}
		var slow map[string]int64
		err := json.Unmarshal([]byte(tt.raw), &slow)
		if ok && (err != nil || !maps.Equal(fast, slow)) {
			t.Errorf("fastVocab(%s) = %v, encoding/json gives %v, %v", tt.raw, fast, slow, err)
		}
	}
}

// FuzzFastJSON checks that whenever the hand-written readers accept their
// input, encoding/json reads the same thing.
func FuzzFastJSON(f *testing.F) {
	for _, s := range []string{`["a b"]`, `[["a","b"]]`, `{"a":1}`, `["\u00e9 \n"]`, `{"\uD83D\uDE00":0}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if fast, ok := fastMerges([]byte(s)); ok {
			slow, err := slowMerges([]byte(s))
			if err != nil || !slices.Equal(fast, slow) {
				t.Fatalf("merges %q: fast %q, encoding/json %q, %v", s, fast, slow, err)
			}
		}
		if fast, ok := fastVocab([]byte(s)); ok {
			var slow map[string]int64
			if err := json.Unmarshal([]byte(s), &slow); err != nil || !maps.Equal(fast, slow) {
				t.Fatalf("vocab %q: fast %v, encoding/json %v, %v", s, fast, slow, err)
			}
		}
	})
}
