package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// apiFigures are what one answer should add to the gateway's metrics.
type apiFigures struct {
	ttft, itl                  float64 // histogram samples
	prompt, completion, cached float64 // tokens
}

// metricsNow reads the figures apiFigures counts.
func metricsNow(t *testing.T) apiFigures {
	t.Helper()
	return apiFigures{
		ttft:       metricValue(t, "llmgw_ttft_seconds_count"),
		itl:        metricValue(t, "llmgw_itl_seconds_count"),
		prompt:     metricValue(t, "llmgw_tokens_total", `kind="prompt"`),
		completion: metricValue(t, "llmgw_tokens_total", `kind="completion"`),
		cached:     metricValue(t, "llmgw_tokens_total", `kind="cached"`),
	}
}

// sub is a - b.
func (a apiFigures) sub(b apiFigures) apiFigures {
	return apiFigures{a.ttft - b.ttft, a.itl - b.itl, a.prompt - b.prompt, a.completion - b.completion, a.cached - b.cached}
}

// apiEvent is the part of a Responses or Anthropic stream event (or
// non-streaming answer) the test reads.
type apiEvent struct {
	Type     string          `json:"type"`
	Delta    json.RawMessage `json:"delta"`
	Usage    *apiUsage       `json:"usage"`
	Response usageHolder     `json:"response"` // Responses events
	Message  usageHolder     `json:"message"`  // Anthropic message_start
}

// usageHolder is an object with a usage.
type usageHolder struct {
	Usage *apiUsage `json:"usage"`
}

type apiUsage struct {
	InputTokens        *float64 `json:"input_tokens"`
	OutputTokens       *float64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens float64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// expectedFigures reads what an answer's body says it should count: a
// sample of TTFT and of ITL per token event after the first (a non-empty
// Responses text delta or Anthropic text delta), and the usage, as the
// client sees it.
func expectedFigures(t *testing.T, body string) apiFigures {
	t.Helper()
	var want apiFigures
	tokens := 0
	for _, d := range sseDataOrBody(body) {
		var ev apiEvent
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatalf("event %q: %v", d, err)
		}
		switch ev.Type {
		case "response.output_text.delta", "content_block_delta":
			var text string
			var block struct{ Text string }
			if json.Unmarshal(ev.Delta, &text) != nil && json.Unmarshal(ev.Delta, &block) == nil {
				text = block.Text
			}
			if text != "" {
				tokens++
			}
		}
		for _, u := range []*apiUsage{ev.Usage, ev.Response.Usage, ev.Message.Usage} {
			want.addUsage(u)
		}
	}
	if tokens > 0 {
		want.ttft, want.itl = 1, float64(tokens-1)
	}
	return want
}

// addUsage takes a usage object's counts (the last of each wins, as
// input tokens come in message_start and output tokens in message_delta).
func (a *apiFigures) addUsage(u *apiUsage) {
	if u == nil {
		return
	}
	if u.InputTokens != nil {
		a.prompt = *u.InputTokens
	}
	if u.OutputTokens != nil {
		a.completion = *u.OutputTokens
	}
	if u.InputTokensDetails != nil {
		a.cached = u.InputTokensDetails.CachedTokens
	}
}

// TestAPIStreamMetrics is issue 38's observation figure: a streamed
// Responses request and a streamed Anthropic request each add one TTFT
// sample, one ITL sample per token after the first, and their usage to
// the token counters, as a chat stream does; their non-streaming answers
// add their usage.
func TestAPIStreamMetrics(t *testing.T) {
	engines := startEngines(t, 1, vllmsim.Config{TimeScale: 50})
	gateway{patient: true, engines: kvEngines(engines...)}.load(t)
	base := "http://" + gatewayAddr
	tests := []struct {
		name, path, body string
		stream           bool
	}{
		{"responses stream", "/v1/responses", `{"model":"sim-model","input":"Tell me a story.","max_output_tokens":6,"stream":true}`, true},
		{"anthropic stream", "/v1/messages", `{"model":"sim-model","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"Tell me a story."}]}`, true},
		{"responses", "/v1/responses", `{"model":"sim-model","input":"Tell me another.","max_output_tokens":3}`, false},
		{"anthropic", "/v1/messages", `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"And another."}]}`, false},
	}
	for _, tt := range tests {
		before := metricsNow(t)
		r := mustSend(t, base+tt.path, tt.body, nil)
		want := expectedFigures(t, r.body)
		if tt.stream && (want.ttft != 1 || want.itl < 2) || want.prompt == 0 || want.completion == 0 {
			t.Fatalf("%s: the answer has too little to count (%+v): %.500s", tt.name, want, r.body)
		}
		if r.status != http.StatusOK {
			t.Fatalf("%s: status %d", tt.name, r.status)
		}
		// The gateway counts as the response ends, which the client may
		// see first.
		var got apiFigures
		for w := newWait(t, 5*time.Second, tt.name+"'s figures"); ; w.tick(fmt.Sprintf("got %+v, want %+v", got, want)) {
			if got = metricsNow(t).sub(before); got == want {
				break
			}
		}
	}
}
