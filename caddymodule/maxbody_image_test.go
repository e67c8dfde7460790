package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// imageChatBody is a chat whose image part is a data URL of n base64 bytes.
func imageChatBody(t *testing.T, n int) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1, "messages": []any{
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "what is this?"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/jpeg;base64," + strings.Repeat("A", n)}},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDefaultMaxBodyAdmitsImages: with the default max_body (8 MiB) a chat
// carrying a 6 MiB base64 image (a 4.5 MiB photo) reaches the vision
// engine; a body over 8 MiB gets the JSON 413.
func TestDefaultMaxBodyAdmitsImages(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{ImageTokens: 16})[0]
	gateway{engines: noKVEngines(e)}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range []struct {
		name   string
		n      int
		status int
	}{
		{"6 MiB image", 6 << 20, http.StatusOK},
		{"9 MiB image", 9 << 20, http.StatusRequestEntityTooLarge},
	} {
		r := do(nil, gatewayRequest(t, ctx, http.MethodPost, "/v1/chat/completions", "application/json", imageChatBody(t, c.n), false, nil), nil)
		if r.err != nil || r.status != c.status {
			t.Errorf("%s: status %d (%v), want %d: %.300s", c.name, r.status, r.err, c.status, r.body)
		}
	}
}
