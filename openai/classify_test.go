package openai

import (
	"net/http/httptest"
	"testing"
)

// TestIsInference: every API a vLLM fleet serves is admitted and routed
// on its JSON body; other paths, methods and media types are not.
func TestIsInference(t *testing.T) {
	tests := []struct {
		method, path, ct string
		want             bool
	}{
		{"POST", "/v1/chat/completions", "application/json", true},
		{"POST", "/v1/completions", "", true},
		{"POST", "/v1/chat/completions", "application/json; charset=utf-8", true},
		{"POST", "/v1/chat/completions", "application/vnd.api+json", true},
		{"POST", "/v1/chat/completions", "Application/JSON; charset=UTF-8", true},
		{"POST", "/v1/chat/completions", "text/plain", false},
		{"POST", "/v1/chat/completions", "not a media type;;", false},
		{"GET", "/v1/chat/completions", "application/json", false},
		{"POST", "/v1/embeddings", "application/json", true},
		{"POST", "/v1/responses", "application/json", true},
		{"POST", "/v1/messages", "application/json", true},
		{"POST", "/score", "", true},
		{"POST", "/v1/rerank", "", true},
		{"POST", "/v1/messages/count_tokens", "application/json", false},
		{"POST", "/v1/audio/transcriptions", "multipart/form-data; boundary=x", false},
		{"POST", "/tokenize", "application/json", false},
		{"POST", "/metrics", "", false},
	}
	for _, tc := range tests {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		if tc.ct != "" {
			r.Header.Set("Content-Type", tc.ct)
		}
		if got := IsInference(r); got != tc.want {
			t.Errorf("%s %s (%q): IsInference = %v, want %v", tc.method, tc.path, tc.ct, got, tc.want)
		}
	}
}

func TestMediaType(t *testing.T) {
	for ct, want := range map[string]string{
		"application/json":                 "application/json",
		"text/event-stream; charset=utf-8": "text/event-stream",
		"Text/Event-Stream; charset=UTF-8": "text/event-stream",
	} {
		if got, ok := MediaType(ct); !ok || got != want {
			t.Errorf("MediaType(%q) = %q, %v; want %q", ct, got, ok, want)
		}
	}
	if _, ok := MediaType("a/b; x"); ok {
		t.Error("a malformed parameter list was accepted")
	}
}
