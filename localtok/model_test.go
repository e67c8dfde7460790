package localtok

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/llmgw/caddy-llmgw/openai"
)

// The fixtures in testdata are tiny byte-level BPE tokenizers with a
// ChatML template: chatml, and chatml-other with fewer merges (another
// model's files, for the mismatch tests). The expected ids are what Hugging
// Face's JS tokenizer (@huggingface/tokenizers 0.2.0 with
// @huggingface/jinja 0.5.11) gives for the same files and inputs.
var (
	// "hello the world" as a user message, with the generation prompt.
	chatmlHelloIDs = []uint64{268, 117, 115, 262, 10, 267, 259, 256, 266, 108, 100, 269, 10, 268, 97, 115, 115, 105, 115, 116, 97, 110, 116, 10}
	otherHelloIDs  = []uint64{259, 117, 115, 101, 114, 10, 258, 111, 32, 116, 256, 32, 119, 111, 114, 108, 100, 260, 10, 259, 97, 115, 115, 105, 115, 116, 97, 110, 116, 10}
	// "hello world" as a completions prompt.
	chatmlPromptIDs = []uint64{267, 266, 108, 100}
)

func loadFixture(t testing.TB, name string) *Model {
	t.Helper()
	m, err := Load("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func parse(t testing.TB, body string) *openai.Request {
	t.Helper()
	req, err := openai.ParseRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestModelTokenize(t *testing.T) {
	m := loadFixture(t, "chatml")
	hello := `[{"role":"user","content":"hello the world"}]`
	for _, tc := range []struct {
		name, body string
		want       []uint64
		wantErr    error // ErrRemote, or nil
		anyErr     bool  // some other error
	}{
		{name: "chat", body: `{"messages":` + hello + `}`, want: chatmlHelloIDs},
		{name: "chat, text parts", body: `{"messages":[{"role":"user","content":[{"type":"text","text":"hello the world"}]}]}`, want: chatmlHelloIDs},
		{name: "chat, no generation prompt", body: `{"add_generation_prompt":false,"messages":` + hello + `}`, want: chatmlHelloIDs[:13]},
		{name: "chat, own template", body: `{"chat_template":"{{ messages }}","messages":` + hello + `}`, wantErr: ErrRemote},
		{name: "chat, image", body: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, wantErr: ErrRemote},
		{name: "prompt", body: `{"prompt":"hello world"}`, want: chatmlPromptIDs},
		{name: "prompt in a list", body: `{"prompt":["hello world"]}`, want: chatmlPromptIDs},
		{name: "batch of prompts", body: `{"prompt":["a","b"]}`, wantErr: ErrRemote},
		{name: "prompt ids", body: `{"prompt":[1,2,3]}`, wantErr: ErrRemote},
		{name: "nothing to tokenize", body: `{"model":"m"}`, wantErr: ErrRemote},
		{name: "messages not a list of objects", body: `{"messages":[1]}`, anyErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.Tokenize(parse(t, tc.body))
			switch {
			case tc.anyErr:
				if err == nil || errors.Is(err, ErrRemote) {
					t.Fatalf("err %v, want a rendering error", err)
				}
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case !slices.Equal(got, tc.want):
				t.Fatalf("ids %v\nwant %v", got, tc.want)
			}
		})
	}
}

// TestModelAppendTokenize: ids are appended after what dst holds, and an
// error leaves dst as it was.
func TestModelAppendTokenize(t *testing.T) {
	m := loadFixture(t, "chatml")
	dst := append(make([]uint64, 0, 4), 7, 8)
	got, err := m.AppendTokenize(dst, parse(t, `{"prompt":"hello world"}`))
	if err != nil || !slices.Equal(got, append([]uint64{7, 8}, chatmlPromptIDs...)) {
		t.Fatalf("AppendTokenize = %v, %v; want 7 8 then %v", got, err, chatmlPromptIDs)
	}
	got, err = m.AppendTokenize(dst, parse(t, `{"prompt":[1,2]}`))
	if !errors.Is(err, ErrRemote) || !slices.Equal(got, []uint64{7, 8}) {
		t.Fatalf("AppendTokenize of ids = %v, %v; want dst and ErrRemote", got, err)
	}
}

func TestModelSpecialTokensRule(t *testing.T) {
	// vLLM: chat is encoded without special tokens unless asked, a
	// completions prompt with them unless asked not to. The fixture's
	// post-processor adds none, so both give the same ids: what is checked
	// is that the flag is read, through a tokenizer that adds BOS.
	m := loadFixture(t, "chatml")
	for _, body := range []string{`{"prompt":"hello world","add_special_tokens":false}`, `{"prompt":"hello world"}`} {
		got, err := m.Tokenize(parse(t, body))
		if err != nil || !slices.Equal(got, chatmlPromptIDs) {
			t.Fatalf("%s: %v %v", body, got, err)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	for _, dir := range []string{"testdata/missing", "testdata"} {
		if _, err := Load(dir); err == nil {
			t.Errorf("Load(%s): no error", dir)
		}
	}
}

func TestChatInputDecodesKwargsAndTools(t *testing.T) {
	req := parse(t, `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},"continue_final_message":true,"add_generation_prompt":false}`)
	in, err := chatInput(req, new([]byte))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"tools": in.Tools, "kwargs": in.Kwargs})
	if string(b) != `{"kwargs":{"enable_thinking":false},"tools":[{"Keys":["type","function"],"Values":{"function":{"Keys":["name"],"Values":{"name":"f"}},"type":"function"}}]}` ||
		!in.ContinueFinalMessage || in.AddGenerationPrompt {
		t.Fatalf("input %s, continue %v, generation prompt %v", b, in.ContinueFinalMessage, in.AddGenerationPrompt)
	}
}

// TestModelWithoutChatTemplate: a directory without tokenizer_config.json,
// or whose config has no chat_template, tokenizes completions prompts and
// sends chat requests to the engine.
func TestModelWithoutChatTemplate(t *testing.T) {
	tok, err := os.ReadFile("testdata/chatml/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	for name, config := range map[string]string{"no config": "", "no template": `{"chat_template": null, "eos_token": "<|im_end|>"}`} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644); err != nil {
				t.Fatal(err)
			}
			if config != "" {
				if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := m.Tokenize(parse(t, `{"prompt":"hello world"}`)); err != nil || !slices.Equal(got, chatmlPromptIDs) {
				t.Fatalf("prompt: %v %v", got, err)
			}
			if _, err := m.Tokenize(parse(t, `{"messages":[{"role":"user","content":"x"}]}`)); !errors.Is(err, ErrRemote) {
				t.Fatalf("chat: err %v, want ErrRemote", err)
			}
		})
	}
}
