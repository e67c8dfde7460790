package chattemplate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDirSpecialTokens(t *testing.T) {
	cfg, err := LoadDir(filepath.Join("testdata", "models", "deepseek_v3"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>", "pad_token": "<｜end▁of▁sentence｜>"}
	if len(cfg.Special) != len(want) {
		t.Errorf("special tokens %v, want %v", cfg.Special, want)
	}
	for k, v := range want {
		if cfg.Special[k] != v {
			t.Errorf("%s = %q, want %q", k, cfg.Special[k], v)
		}
	}
	gemma, err := LoadDir(filepath.Join("testdata", "models", "gemma3"))
	if err != nil {
		t.Fatal(err)
	}
	// extra_special_tokens join special_tokens_map.
	if gemma.Special["image_token"] != "<image_soft_token>" || gemma.Special["unk_token"] != "<unk>" {
		t.Errorf("gemma3 special tokens %v", gemma.Special)
	}
}

func TestLoadDirNamedTemplates(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tokenizer_config.json"), `{
		"bos_token": {"__type": "AddedToken", "content": "<B>", "lstrip": false},
		"eos_token": null, "unk_token": "",
		"chat_template": [
			{"name": "default", "template": "D{{ bos_token }}{{ eos_token is defined }}"},
			{"name": "tool_use", "template": "T{{ tools|length }}"}
		]}`)
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cfg.Render(Input{}); err != nil || out != "D<B>False" {
		t.Errorf("default: %q, %v", out, err)
	}
	if out, err := cfg.Render(Input{Tools: []any{}}); err != nil || out != "T0" {
		t.Errorf("tool_use: %q, %v", out, err)
	}
	// The caller's special tokens win over the directory's.
	if out, err := cfg.Render(Input{Special: map[string]string{}}); err != nil || out != "DFalse" {
		t.Errorf("own special tokens: %q, %v", out, err)
	}
}

func TestLoadDirTemplateFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "tokenizer_config.json"), `{"chat_template": "from config"}`)
	writeFile(t, filepath.Join(dir, "chat_template.jinja"), "from file\n")
	writeFile(t, filepath.Join(dir, "additional_chat_templates", "tool_use.jinja"), "tools file")
	writeFile(t, filepath.Join(dir, "additional_chat_templates", "notes.txt"), "ignored")
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := cfg.Render(Input{}); out != "from file" {
		t.Errorf("default = %q, want the chat_template.jinja file", out)
	}
	if out, _ := cfg.Render(Input{Tools: []any{}}); out != "tools file" {
		t.Errorf("tool_use = %q", out)
	}
	if len(cfg.Templates) != 2 {
		t.Errorf("templates %v", cfg.Templates)
	}
}

func TestLoadDirErrors(t *testing.T) {
	noTemplate := t.TempDir()
	writeFile(t, filepath.Join(noTemplate, "tokenizer_config.json"), `{"bos_token": "<s>"}`)
	cfg, err := LoadDir(noTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Render(Input{}); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no template: %v", err)
	}
	noDefault := t.TempDir()
	writeFile(t, filepath.Join(noDefault, "tokenizer_config.json"), `{"chat_template": [{"name": "rag", "template": "x"}]}`)
	if cfg, err := LoadDir(noDefault); err != nil {
		t.Fatal(err)
	} else if _, err := cfg.Render(Input{}); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no default: %v", err)
	}

	bad := map[string]string{
		"not json":     `{`,
		"bad template": `{"chat_template": "{% if %}"}`,
		"bad list":     `{"chat_template": 5}`,
	}
	for name, body := range bad {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "tokenizer_config.json"), body)
		if _, err := LoadDir(dir); err == nil || !strings.HasPrefix(err.Error(), "chattemplate: load ") {
			t.Errorf("%s: error %v", name, err)
		}
	}
	if _, err := LoadDir(t.TempDir()); err == nil {
		t.Error("missing tokenizer_config.json loaded")
	}
	big := filepath.Join(t.TempDir(), "tokenizer_config.json")
	writeFile(t, big, `{"chat_template": "0123456789"}`)
	if _, err := readLimited(big, 10); err == nil || !strings.Contains(err.Error(), "larger than 10 bytes") {
		t.Errorf("oversized file: %v", err)
	}
	if data, err := readLimited(big, 31); err != nil || len(data) != 31 {
		t.Errorf("file at the limit: %d bytes, %v", len(data), err)
	}
}
