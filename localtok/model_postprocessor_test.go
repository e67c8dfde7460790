package localtok

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// withConfig copies the chatml fixture's tokenizer.json into a temporary
// directory beside the given tokenizer_config.json fields.
func withConfig(t *testing.T, fields map[string]any) string {
	t.Helper()
	dir := t.TempDir()
	tj, err := os.ReadFile("testdata/chatml/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tokenizer.json": tj, "tokenizer_config.json": cfg} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestClassPostProcessor: for tokenizer classes whose transformers
// constructor rebuilds the post-processor (LlamaTokenizerFast,
// GemmaTokenizerFast), a completions prompt gets bos/eos from
// add_bos_token (default true) and add_eos_token (default false), though
// the fixture's tokenizer.json post-processor (ByteLevel) adds nothing;
// other classes keep tokenizer.json's. Chat requests (add_special_tokens
// false) never get them.
func TestClassPostProcessor(t *testing.T) {
	const bos, eos = 268, 269 // the fixture's <|im_start|>, <|im_end|>
	tmpl := "{% for m in messages %}{{ m['content'] }}{% endfor %}"
	for _, tc := range []struct {
		name    string
		fields  map[string]any
		want    []uint64 // completions prompt "hello world"
		wantErr string
	}{
		{"other class", map[string]any{"tokenizer_class": "Qwen2TokenizerFast", "bos_token": "<|im_start|>"}, chatmlPromptIDs, ""},
		{"no class", map[string]any{"bos_token": "<|im_start|>"}, chatmlPromptIDs, ""},
		{"llama, bos by default", map[string]any{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<|im_start|>"}, append([]uint64{bos}, chatmlPromptIDs...), ""},
		{"llama slow name", map[string]any{"tokenizer_class": "LlamaTokenizer", "bos_token": map[string]any{"content": "<|im_start|>"}}, append([]uint64{bos}, chatmlPromptIDs...), ""},
		{"gemma, bos and eos", map[string]any{"tokenizer_class": "GemmaTokenizer", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_eos_token": true},
			append(append([]uint64{bos}, chatmlPromptIDs...), eos), ""},
		{"llama, add_bos_token false", map[string]any{"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": false}, chatmlPromptIDs, ""},
		{"llama without bos_token", map[string]any{"tokenizer_class": "LlamaTokenizerFast"}, nil, "needs a bos_token"},
		{"bos not in the vocabulary", map[string]any{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>"}, nil, "not in the vocabulary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fields["chat_template"] = tmpl
			m, err := Load(withConfig(t, tc.fields))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Load: %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.Tokenize(parse(t, `{"prompt":"hello world"}`))
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("prompt: %v, %v; want %v", got, err, tc.want)
			}
			chat, err := m.Tokenize(parse(t, `{"messages":[{"role":"user","content":"hello world"}]}`))
			if err != nil || !slices.Equal(chat, chatmlPromptIDs) {
				t.Fatalf("chat: %v, %v; want %v (no special tokens)", chat, err, chatmlPromptIDs)
			}
		})
	}
}

// TestDeepSeekV3CompletionsBOS: DeepSeek V3's tokenizer.json has a
// ByteLevel post-processor, and its tokenizer_config.json names
// LlamaTokenizerFast with add_bos_token, so transformers (and vLLM)
// prefix completions prompts with <｜begin▁of▁sentence｜> (id 0).
func TestDeepSeekV3CompletionsBOS(t *testing.T) {
	m := loadRealModel(t, "deepseek_v3")
	ids, err := m.Tokenize(parse(t, `{"prompt":"Hello world"}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) < 2 || ids[0] != 0 {
		t.Fatalf("ids %v: want BOS (0) first", ids)
	}
	noSpecial, err := m.Tokenize(parse(t, `{"prompt":"Hello world","add_special_tokens":false}`))
	if err != nil || !slices.Equal(noSpecial, ids[1:]) {
		t.Fatalf("without special tokens: %v, %v; want %v", noSpecial, err, ids[1:])
	}
}
