package chattemplate

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzRender renders arbitrary JSON as the messages (and, when the
// document is an object, the tools and kwargs) of a request through the
// qwen3 fixture's template. Whatever the input, Render must return
// output or an error, and never panic, not even inside the engine.
func FuzzRender(f *testing.F) {
	cfg, err := LoadDir(filepath.Join("testdata", "models", "qwen3"))
	if err != nil {
		f.Fatal(err)
	}
	_, cases := loadFixtureCases(f)
	for _, c := range cases {
		raw, err := json.Marshal(plain(c.input.Messages))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, c.input.AddGenerationPrompt, c.input.ContinueFinalMessage)
	}
	f.Add([]byte(`{"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}], "kwargs": {"enable_thinking": false}}`), true, false)
	f.Add([]byte(`[{"role": "assistant", "content": "<think>a</think>b", "tool_calls": [{"function": {"name": 1, "arguments": "[1, {\"a\": 1e400}]"}}]}]`), false, true)
	f.Fuzz(func(t *testing.T, doc []byte, addPrompt, continueFinal bool) {
		v, err := DecodeJSON(doc)
		if err != nil {
			return
		}
		in := Input{AddGenerationPrompt: addPrompt, ContinueFinalMessage: continueFinal, MaxOutputBytes: 1 << 20}
		switch d := v.(type) {
		case []any:
			in.Messages = d
		case Object:
			in.Messages, _ = d.Values["messages"].([]any)
			in.Tools, _ = d.Values["tools"].([]any)
			if kw, ok := d.Values["kwargs"].(Object); ok {
				in.Kwargs = map[string]any{}
				for _, k := range kw.Keys {
					in.Kwargs[k] = kw.Values[k]
				}
			}
		default:
			return
		}
		_, err = cfg.Render(in)
		if err != nil && strings.Contains(err.Error(), "template engine failed") {
			t.Fatalf("engine panicked: %v", err)
		}
	})
}

// plain turns Objects back into maps so the seeds can be marshalled.
func plain(v any) any {
	switch x := v.(type) {
	case Object:
		m := make(map[string]any, len(x.Keys))
		for _, k := range x.Keys {
			m[k] = plain(x.Values[k])
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			out[i] = plain(item)
		}
		return out
	}
	return v
}
