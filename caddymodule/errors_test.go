package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestAnthropicErrorShapes: the gateway's own answers on /v1/messages are
// in Anthropic's error shape (so its SDKs raise their error types), with
// the type for the status; the same failures on /v1/chat/completions
// keep OpenAI's shape.
func TestAnthropicErrorShapes(t *testing.T) {
	engines := startEngines(t, 1, vllmsim.Config{})
	base := "http://" + gatewayAddr
	anthropic := func(model, extra string) string {
		return `{"model":"` + model + `","max_tokens":4` + extra + `,"messages":[{"role":"user","content":"hi"}]}`
	}
	cases := []struct {
		name, admission, body, wantType string
		status                          int
		engines                         []gatewayEngine
	}{
		{"unknown model", "", anthropic("no-such-model", ""), "not_found_error", http.StatusNotFound, noKVEngines(engines...)},
		{"too large", "\t\tmax_body 1KiB\n", anthropic("sim-model", `,"system":"`+strings.Repeat("x", 2048)+`"`), "request_too_large", http.StatusRequestEntityTooLarge, noKVEngines(engines...)},
		{"malformed", "", `{"model":"sim-model","max_tokens":4,"messages":7}`, "invalid_request_error", http.StatusBadRequest, noKVEngines(engines...)},
		{"no capacity", "\t\tfail_closed\n", anthropic("sim-model", ""), "overloaded_error", http.StatusServiceUnavailable, dialEngines("127.0.0.1:1")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gateway{engines: tc.engines, admission: tc.admission}.load(t)
			if tc.name == "unknown model" {
				waitModelsLearned(t, engines...)
			}
			r := send(context.Background(), base+"/v1/messages", tc.body, nil)
			var got struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(r.body), &got); err != nil || r.status != tc.status ||
				got.Type != "error" || got.Error.Type != tc.wantType || got.Error.Message == "" {
				t.Fatalf("status %d %s (err %v), want %d with an Anthropic %s", r.status, r.body, r.err, tc.status, tc.wantType)
			}
			if tc.status == http.StatusServiceUnavailable && r.header.Get("Retry-After") == "" {
				t.Error("no Retry-After")
			}
			// The same failure on the OpenAI API keeps OpenAI's shape.
			chatBody := strings.Replace(tc.body, `"max_tokens":4`, `"max_tokens":4,"stream":false`, 1)
			o := send(context.Background(), base+"/v1/chat/completions", chatBody, nil)
			var oe struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(o.body), &oe); err != nil || o.status != tc.status || oe.Error.Message == "" {
				t.Errorf("chat: status %d %s, want %d in OpenAI's shape", o.status, o.body, tc.status)
			}
		})
	}
}
