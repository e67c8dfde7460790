package vllmsim

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

func TestAPIErrorShapes(t *testing.T) {
	e, c := apiEngine(t, Config{})
	openAI := func(typ string) func(t *testing.T, m map[string]any) {
		return func(t *testing.T, m map[string]any) {
			if path(t, m, "error", "type") != typ || path(t, m, "error", "message") == "" {
				t.Errorf("want OpenAI error of type %s: %v", typ, m)
			}
		}
	}
	anthropic := func(typ string) func(t *testing.T, m map[string]any) {
		return func(t *testing.T, m map[string]any) {
			if m["type"] != "error" || path(t, m, "error", "type") != typ || path(t, m, "error", "message") == "" {
				t.Errorf("want Anthropic error of type %s: %v", typ, m)
			}
		}
	}
	for _, tc := range []struct {
		name, path, body string
		status           int
		check            func(*testing.T, map[string]any)
	}{
		{"responses malformed", "/v1/responses", `{"input":`, 400, openAI("BadRequestError")},
		{"responses no input", "/v1/responses", `{"model":"sim-model"}`, 400, openAI("BadRequestError")},
		{"responses item type", "/v1/responses", `{"input":[{"type":"reasoning"}]}`, 400, openAI("BadRequestError")},
		{"responses image part", "/v1/responses", `{"input":[{"role":"user","content":[{"type":"input_image"}]}]}`, 400, openAI("BadRequestError")},
		{"responses background", "/v1/responses", `{"input":"x","background":true}`, 400, openAI("invalid_request_error")},
		{"responses unknown model", "/v1/responses", `{"model":"nope","input":"x"}`, 404, openAI("NotFoundError")},
		{"messages malformed", "/v1/messages", `{"model":`, 400, anthropic("BadRequestError")},
		{"messages no max_tokens", "/v1/messages", `{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`, 400, anthropic("BadRequestError")},
		{"messages bad role", "/v1/messages", `{"model":"sim-model","max_tokens":1,"messages":[{"role":"tool","content":"x"}]}`, 400, anthropic("BadRequestError")},
		{"messages unknown model", "/v1/messages", `{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 404, anthropic("NotFoundError")},
		{"embeddings malformed", "/v1/embeddings", `{"input":`, 400, openAI("BadRequestError")},
		{"embeddings empty", "/v1/embeddings", `{"input":[]}`, 400, openAI("BadRequestError")},
		{"embeddings bad input", "/v1/embeddings", `{"input":{"a":1}}`, 400, openAI("BadRequestError")},
		{"score one side", "/score", `{"text_1":"a"}`, 400, openAI("BadRequestError")},
		{"score lengths", "/score", `{"queries":["a","b"],"documents":["c","d","e"]}`, 400, openAI("BadRequestError")},
		{"rerank no query", "/rerank", `{"documents":["a"]}`, 400, openAI("BadRequestError")},
		{"classify unknown model", "/classify", `{"model":"nope","input":"x"}`, 404, openAI("NotFoundError")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.Post(e.URL()+tc.path, "application/json", bytes.NewReader([]byte(tc.body)))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var m map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, tc.status, m)
			}
			tc.check(t, m)
		})
	}
}

// TestAPIStreamsDropped: Faults.DropStreamAfter cuts the Responses and
// Anthropic streams too, before their final event.
func TestAPIStreamsDropped(t *testing.T) {
	e, c := apiEngine(t, Config{})
	e.SetFaults(Faults{DropStreamAfter: 2})
	for _, tc := range []struct {
		path, last string
		body       map[string]any
	}{
		{"/v1/responses", "response.completed", map[string]any{"input": "x", "stream": true, "max_output_tokens": 5}},
		{"/v1/messages", "message_stop", map[string]any{"model": "sim-model", "max_tokens": 5, "stream": true,
			"messages": []any{map[string]any{"role": "user", "content": "x"}}}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			b, _ := json.Marshal(tc.body)
			resp, err := c.Post(e.URL()+tc.path, "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			out, err := io.ReadAll(resp.Body)
			if err == nil || bytes.Contains(out, []byte(tc.last)) {
				t.Errorf("stream not cut (err %v): %s", err, out)
			}
		})
	}
}
