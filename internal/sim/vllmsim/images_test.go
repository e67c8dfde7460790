package vllmsim

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/kvindex"
)

// imageChat is a chat request with text, one image part and more text.
func imageChat(url, uuid string) map[string]any {
	img := map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}
	if uuid != "" {
		img["uuid"] = uuid
	}
	return map[string]any{
		"max_tokens": 1,
		"messages": []any{
			map[string]any{"role": "system", "content": strings.Repeat("You describe pictures carefully. ", 8)},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "text", "text": "What is in this picture?"},
				img,
				map[string]any{"type": "text", "text": strings.Repeat("Answer in detail, naming every object. ", 10)},
			}},
		},
	}
}

// imageTokens asks /tokenize for the request's prompt ids.
func imageTokens(t *testing.T, c *http.Client, e *Engine, body map[string]any) []uint64 {
	t.Helper()
	st, out := postJSON(t, c, e.URL()+"/tokenize", map[string]any{"messages": body["messages"]})
	if st != http.StatusOK {
		t.Fatalf("tokenize: %d %s", st, out)
	}
	var r struct {
		Count  int      `json:"count"`
		Tokens []uint64 `json:"tokens"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Count != len(r.Tokens) {
		t.Fatalf("tokenize answer %s: %v", out, err)
	}
	return r.Tokens
}

// TestImagePromptCaching: the simulator expands an image to ImageTokens
// placeholders and hashes its blocks with the item's identifier, so a
// repeated image prompt is cached past the image while the same text with
// another image is cached only before it.
func TestImagePromptCaching(t *testing.T) {
	const bs, n = 16, 40
	e := startEngine(t, Config{ImageTokens: n})
	c := newClient(t)
	a := imageChat("data:image/png;base64,AAAA", "img-1")
	ids := imageTokens(t, c, e, a)
	offset := slices.Index(ids, tokImagePad)
	if offset < bs || ids[offset-1] != tokVisionStart || ids[offset+n] != tokVisionEnd || ids[offset+n-1] != tokImagePad {
		t.Fatalf("image at %d not expanded to %d placeholders: %v", offset, n, ids)
	}
	whole := (len(ids) - 1) / bs * bs
	before := offset / bs * bs
	for _, step := range []struct {
		name string
		body map[string]any
		want int
	}{
		{"first", a, 0},
		{"same uuid", imageChat("data:image/png;base64,BBBB", "img-1"), whole},
		{"other uuid", imageChat("data:image/png;base64,AAAA", "img-2"), before},
		{"no uuid", imageChat("https://example.com/cat.png", ""), before},
		{"no uuid, same url", imageChat("https://example.com/cat.png", ""), whole},
	} {
		r := complete(t, c, e.URL()+"/v1/chat/completions", step.body)
		if r.Usage.PromptTokens != len(ids) {
			t.Fatalf("%s: %d prompt tokens, want %d", step.name, r.Usage.PromptTokens, len(ids))
		}
		if got := cachedTokens(r); got != step.want {
			t.Errorf("%s: cached %d tokens, want %d (image at %d)", step.name, got, step.want, offset)
		}
	}
}

// TestImageRefusedByTextModel: without ImageTokens an image part is a 400,
// as a text-only vLLM model answers.
func TestImageRefusedByTextModel(t *testing.T) {
	e := startEngine(t, Config{})
	st, out := postJSON(t, newClient(t), e.URL()+"/v1/chat/completions", imageChat("data:,x", "u"))
	if st != http.StatusBadRequest || !strings.Contains(string(out), "image_url") {
		t.Fatalf("status %d: %s", st, out)
	}
}

// TestExpandImages: spans and refusals of the placeholder expansion.
func TestExpandImages(t *testing.T) {
	toks := []uint64{1, tokVisionStart, tokImagePad, tokVisionEnd, 2, tokVisionStart, tokImagePad, tokVisionEnd}
	out, items, err := expandImages(toks, []string{"a", "b"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []kvindex.MMItem{{ID: "a", Offset: 2, Length: 3}, {ID: "b", Offset: 8, Length: 3}}
	if !slices.Equal(items, want) || len(out) != len(toks)+4 {
		t.Fatalf("items %v, %d tokens", items, len(out))
	}
	if _, _, err := expandImages(toks, []string{"a"}, 3); err == nil {
		t.Error("a typed placeholder beyond the images was accepted")
	}
	if _, _, err := expandImages(toks, []string{"a", "b", "c"}, 3); err == nil {
		t.Error("an image without its placeholder was accepted")
	}
}
