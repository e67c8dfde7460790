package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAnthropicErrors: the body and event shapes Anthropic's SDKs parse,
// with the type for each status, and any message escaped into valid JSON.
func TestAnthropicErrors(t *testing.T) {
	for _, tc := range []struct {
		status int
		typ    string
	}{
		{400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"},
		{404, "not_found_error"}, {408, "invalid_request_error"}, {413, "request_too_large"},
		{429, "rate_limit_error"}, {500, "api_error"}, {502, "api_error"}, {503, "overloaded_error"},
		{529, "overloaded_error"}, {200, "api_error"},
	} {
		msg := "bad \"thing\"\n<&>\xff"
		var got struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		body := AnthropicErrorJSON(msg, tc.status)
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("%d: %s: %v", tc.status, body, err)
		}
		if got.Type != "error" || got.Error.Type != tc.typ || got.Error.Message != "bad \"thing\"\n<&>\uFFFD" {
			t.Errorf("%d: %s, want type %s", tc.status, body, tc.typ)
		}
		ev := string(AnthropicErrorEvent(msg, tc.status))
		if !strings.HasPrefix(ev, "event: error\ndata: "+string(body)) || !strings.HasSuffix(ev, "\n\n") || strings.Count(ev, "\n") != 3 {
			t.Errorf("%d: event %q", tc.status, ev)
		}
	}
}
