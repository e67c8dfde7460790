package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// maxConfigBytes bounds tokenizer_config.json and template files. Configs
// that list every added token run to a few megabytes; 64 MiB leaves room
// while keeping a stray huge file from being read whole.
const maxConfigBytes = 64 << 20

// specialTokenNames are transformers' SPECIAL_TOKENS_ATTRIBUTES that hold
// one token; with extra_special_tokens they make special_tokens_map,
// which apply_chat_template spreads into the template's context.
var specialTokenNames = [...]string{
	"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
}

// Config is a model directory's templating configuration.
type Config struct {
	// Templates holds the chat templates by name. A single template is
	// named "default"; a list in tokenizer_config.json keeps its names
	// (often "default" and "tool_use").
	Templates map[string]*Template
	// Special holds the named special tokens, such as bos_token.
	Special map[string]string
	// TokenizerClass, AddBOSToken and AddEOSToken are the file's
	// tokenizer_class, add_bos_token and add_eos_token (nil when absent):
	// some transformers tokenizer classes rebuild their post-processor
	// from them (see localtok).
	TokenizerClass           string
	AddBOSToken, AddEOSToken *bool
}

// LoadDir reads dir/tokenizer_config.json as transformers does for the
// chat template: its chat_template may be a string or a list of
// {name, template}; a chat_template.jinja file in dir replaces the
// default template, and additional_chat_templates/NAME.jinja files add
// named ones. Special tokens may be strings or AddedToken objects.
func LoadDir(dir string) (*Config, error) {
	raw, err := readLimited(filepath.Join(dir, "tokenizer_config.json"), maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: load %s: %w", dir, err)
	}
	var tc struct {
		ChatTemplate   json.RawMessage            `json:"chat_template"`
		Extra          map[string]json.RawMessage `json:"extra_special_tokens"`
		TokenizerClass string                     `json:"tokenizer_class"`
		AddBOS         *bool                      `json:"add_bos_token"`
		AddEOS         *bool                      `json:"add_eos_token"`
	}
	if err := json.Unmarshal(raw, &tc); err != nil {
		return nil, fmt.Errorf("chattemplate: load %s: tokenizer_config.json: %w", dir, err)
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(raw, &fields) // same document, already known to be valid
	cfg := &Config{Templates: map[string]*Template{}, Special: specialTokens(fields, tc.Extra),
		TokenizerClass: tc.TokenizerClass, AddBOSToken: tc.AddBOS, AddEOSToken: tc.AddEOS}
	sources, err := templateSources(tc.ChatTemplate)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: load %s: %w", dir, err)
	}
	if err := fileTemplates(dir, sources); err != nil {
		return nil, fmt.Errorf("chattemplate: load %s: %w", dir, err)
	}
	for name, src := range sources {
		t, err := Parse(src)
		if err != nil {
			return nil, fmt.Errorf("chattemplate: load %s: template %q: %w", dir, name, err)
		}
		cfg.Templates[name] = t
	}
	return cfg, nil
}

// Template picks the template transformers would use: "tool_use" when
// the request has tools and the model has one, else "default"; with a
// single unnamed template that is the default.
func (c *Config) Template(hasTools bool) (*Template, error) {
	if t, ok := c.Templates["tool_use"]; ok && hasTools {
		return t, nil
	}
	if t, ok := c.Templates["default"]; ok {
		return t, nil
	}
	if len(c.Templates) == 0 {
		return nil, fmt.Errorf("chattemplate: %w", ErrNoTemplate)
	}
	return nil, fmt.Errorf("chattemplate: %w: the model has named templates but none is called \"default\"", ErrNoTemplate)
}

// Render renders in with the template chosen for it (see Template),
// filling in the model's special tokens when in.Special is nil.
func (c *Config) Render(in Input) (string, error) {
	t, err := c.Template(in.Tools != nil)
	if err != nil {
		return "", err
	}
	if in.Special == nil {
		in.Special = c.Special
	}
	return t.Render(in)
}

// templateSources decodes the chat_template field.
func templateSources(raw json.RawMessage) (map[string]string, error) {
	out := map[string]string{}
	if len(raw) == 0 || string(raw) == "null" {
		return out, nil
	}
	var single string
	if err := json.Unmarshal(raw, &single); err == nil {
		out["default"] = single
		return out, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return nil, errors.New("chat_template must be a string or a list of {name, template}")
	}
	for _, n := range named {
		out[n.Name] = n.Template
	}
	return out, nil
}

// fileTemplates overlays the template files transformers reads beside
// tokenizer_config.json.
func fileTemplates(dir string, sources map[string]string) error {
	src, err := readLimited(filepath.Join(dir, "chat_template.jinja"), maxConfigBytes)
	switch {
	case err == nil:
		sources["default"] = string(src)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	extra := filepath.Join(dir, "additional_chat_templates")
	entries, err := os.ReadDir(extra)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".jinja")
		if !ok || e.IsDir() {
			continue
		}
		src, err := readLimited(filepath.Join(extra, e.Name()), maxConfigBytes)
		if err != nil {
			return err
		}
		sources[name] = string(src)
	}
	return nil
}

// specialTokens collects the named special tokens that are set.
func specialTokens(fields, extra map[string]json.RawMessage) map[string]string {
	out := map[string]string{}
	for _, name := range specialTokenNames {
		if tok := tokenContent(fields[name]); tok != "" {
			out[name] = tok
		}
	}
	for name, raw := range extra {
		if tok := tokenContent(raw); tok != "" {
			out[name] = tok
		}
	}
	return out
}

// tokenContent reads a token written as a string or as an AddedToken
// object ({"__type": "AddedToken", "content": ...}); anything else is
// treated as unset.
func tokenContent(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.Content
	}
	return ""
}

// readLimited reads a file of at most limit bytes.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", filepath.Base(path), limit)
	}
	return data, nil
}
