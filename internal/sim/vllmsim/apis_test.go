package vllmsim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// sseEvent is one named server-sent event.
type sseEvent struct {
	name string
	data map[string]any
}

// postSSE posts body and parses the answer's named events.
func postSSE(t *testing.T, c *http.Client, url string, body any) []sseEvent {
	t.Helper()
	st, out := postJSON(t, c, url, body)
	if st != http.StatusOK {
		t.Fatalf("status %d: %s", st, out)
	}
	var evs []sseEvent
	for _, block := range strings.Split(strings.TrimSpace(string(out)), "\n\n") {
		var ev sseEvent
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.data); err != nil {
					t.Fatalf("event data %q: %v", line, err)
				}
			default:
				t.Fatalf("unexpected SSE line %q", line)
			}
		}
		if ev.name == "" || ev.data == nil || ev.data["type"] != ev.name {
			t.Fatalf("malformed event %q", block)
		}
		evs = append(evs, ev)
	}
	return evs
}

// postObject posts body and decodes a JSON object answer.
func postObject(t *testing.T, c *http.Client, url string, body any, wantStatus int) map[string]any {
	t.Helper()
	st, out := postJSON(t, c, url, body)
	if st != wantStatus {
		t.Fatalf("POST %s: status %d, want %d: %s", url, st, wantStatus, out)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	return m
}

// path walks decoded JSON by object keys and array indexes.
func path(t *testing.T, v any, keys ...any) any {
	t.Helper()
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%v: not an object at %q", v, k)
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				t.Fatalf("%v: no index %d", v, k)
			}
			v = a[k]
		}
	}
	return v
}

func num(t *testing.T, v any) int {
	t.Helper()
	f, ok := v.(float64)
	if !ok {
		t.Fatalf("%v (%T) is not a number", v, v)
	}
	return int(f)
}

// chatText is what /v1/chat/completions generates for msgs: the simulator's
// output is a function of the prompt tokens, so equal text means the other
// API rendered the same prompt.
func chatText(t *testing.T, c *http.Client, e *Engine, msgs []map[string]any, maxTokens int) string {
	t.Helper()
	r := complete(t, c, e.URL()+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": maxTokens})
	return r.Choices[0].Message.Content
}

func apiEngine(t *testing.T, cfg Config) (*Engine, *http.Client) {
	t.Helper()
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 100
	}
	return startEngine(t, cfg), newClient(t)
}
