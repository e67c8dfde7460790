package vllmsim

import (
	"net/http"
	"strings"
	"testing"
)

func TestMessagesNonStreaming(t *testing.T) {
	e, c := apiEngine(t, Config{})
	m := postObject(t, c, e.URL()+"/v1/messages", map[string]any{"model": "sim-model", "max_tokens": 6,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}, http.StatusOK)
	if m["type"] != "message" || m["role"] != "assistant" || m["model"] != "sim-model" || m["stop_reason"] != "max_tokens" {
		t.Errorf("fields: %v", m)
	}
	if _, ok := m["stop_sequence"]; ok {
		t.Error("stop_sequence present: vLLM dumps with exclude_none")
	}
	if path(t, m, "content", 0, "type") != "text" || path(t, m, "content", 0, "text") != chatText(t, c, e, []map[string]any{{"role": "user", "content": "hi"}}, 6) {
		t.Errorf("content %v", m["content"])
	}
	if num(t, path(t, m, "usage", "output_tokens")) != 6 || num(t, path(t, m, "usage", "input_tokens")) == 0 {
		t.Errorf("usage %v", m["usage"])
	}
}

func TestMessagesStreaming(t *testing.T) {
	e, c := apiEngine(t, Config{})
	evs := postSSE(t, c, e.URL()+"/v1/messages", map[string]any{"model": "sim-model", "max_tokens": 3, "stream": true,
		"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "hi"}}}}})
	var names []string
	var text strings.Builder
	for _, ev := range evs {
		names = append(names, ev.name)
		if ev.name == "content_block_delta" {
			if path(t, ev.data, "delta", "type") != "text_delta" || num(t, ev.data["index"]) != 0 {
				t.Errorf("delta %v", ev.data)
			}
			text.WriteString(path(t, ev.data, "delta", "text").(string))
		}
	}
	want := "message_start,content_block_start,content_block_delta,content_block_delta,content_block_delta,content_block_stop,message_delta,message_stop"
	if strings.Join(names, ",") != want {
		t.Fatalf("events %v\nwant %s", names, want)
	}
	start := evs[0].data["message"]
	if num(t, path(t, start, "usage", "input_tokens")) == 0 || num(t, path(t, start, "usage", "output_tokens")) != 0 ||
		path(t, start, "stop_reason") != nil {
		t.Errorf("message_start %v", start)
	}
	if path(t, evs[1].data, "content_block", "type") != "text" {
		t.Errorf("content_block_start %v", evs[1].data)
	}
	md := evs[6].data
	if path(t, md, "delta", "stop_reason") != "max_tokens" || num(t, path(t, md, "usage", "output_tokens")) != 3 {
		t.Errorf("message_delta %v", md)
	}
	if want := chatText(t, c, e, []map[string]any{{"role": "user", "content": "hi"}}, 3); text.String() != want {
		t.Errorf("streamed %q, chat path %q", text.String(), want)
	}
}

func TestMessagesSystemFirst(t *testing.T) {
	e, c := apiEngine(t, Config{})
	for _, tc := range []struct {
		name   string
		system any
		extra  []any
	}{
		{"string", "You are terse.", nil},
		{"blocks and a system message", []any{map[string]any{"type": "text", "text": "You are "},
			map[string]any{"type": "text", "text": "x-anthropic-billing-header: abc"}},
			[]any{map[string]any{"role": "system", "content": "terse."}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := append(append([]any{}, tc.extra...), map[string]any{"role": "user", "content": "hi"})
			m := postObject(t, c, e.URL()+"/v1/messages", map[string]any{"model": "sim-model", "max_tokens": 4,
				"system": tc.system, "messages": msgs}, http.StatusOK)
			want := chatText(t, c, e, []map[string]any{{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}}, 4)
			if got := path(t, m, "content", 0, "text"); got != want {
				t.Errorf("generated %q; with the system prompt first the chat path generates %q", got, want)
			}
		})
	}
}
