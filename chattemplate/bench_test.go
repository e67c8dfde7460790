package chattemplate

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// benchConversation is a ~32 KB (about 8k tokens) tool-using chat: a
// system prompt, two tools and 40 turns of user, assistant and tool
// messages.
func benchConversation() ([]any, []any) {
	para := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 14) // ~630 bytes
	msgs := []any{Object{Keys: []string{"role", "content"}, Values: map[string]any{"role": "system", "content": "You are a helpful assistant. " + para}}}
	for i := range 40 {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("Question %d: %s", i, para[:300])},
			map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{
				"type": "function", "function": map[string]any{"name": "search", "arguments": fmt.Sprintf(`{"query": "q%d", "limit": 5}`, i)}}}},
			map[string]any{"role": "tool", "content": para[:120]},
			map[string]any{"role": "assistant", "content": "<think>\nreasoning\n</think>\n\n" + para[:180]})
	}
	tool := map[string]any{"type": "function", "function": map[string]any{"name": "search", "description": "Search the web",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"query": map[string]any{"type": "string"}}}}}
	return msgs, []any{tool, tool}
}

func BenchmarkRenderQwen3_32KB(b *testing.B) {
	cfg, err := LoadDir(filepath.Join("testdata", "models", "qwen3"))
	if err != nil {
		b.Fatal(err)
	}
	msgs, tools := benchConversation()
	in := Input{Messages: msgs, Tools: tools, AddGenerationPrompt: true}
	out, err := cfg.Render(in)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(out)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := cfg.Render(in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(out)), "prompt-bytes")
}

// TestConcurrentRender renders one parsed template from many goroutines;
// run with -race it checks that a Template is safe for concurrent use.
func TestConcurrentRender(t *testing.T) {
	cfg, err := LoadDir(filepath.Join("testdata", "models", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	msgs, tools := benchConversation()
	in := Input{Messages: msgs[:9], Tools: tools, AddGenerationPrompt: true}
	want, err := cfg.Render(in)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 20 {
				got, err := cfg.Render(in)
				if err == nil && got != want {
					err = fmt.Errorf("concurrent render differs")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
