package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestPoolingEndpoints is issue 38's pooling figure: 1,000 embeddings and
// score requests through llm_admission and lb_policy llm are all admitted
// and answered, none is tokenized (so none counts as a tokenize failure),
// and they spread over the engines by load: none gets more than 1.5 times
// the mean.
func TestPoolingEndpoints(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 50})
	gateway{patient: true, engines: kvEngines(engines...)}.load(t)
	waitKV(t, engines...)
	failuresBefore := metricValue(t, "llmgw_tokenize_failures_total")
	admittedBefore := metricValue(t, "llmgw_admission_admitted_total")
	const n = 1000
	base := "http://" + gatewayAddr
	rs := parallel(n, 16, func(i int) reply {
		if i%2 == 0 {
			return send(context.Background(), base+"/v1/embeddings",
				fmt.Sprintf(`{"model":"sim-model","input":["embed %d", "and %d"]}`, i, i), nil)
		}
		return send(context.Background(), base+"/score",
			fmt.Sprintf(`{"model":"sim-model","text_1":"query %d","text_2":["a %d","b %d"]}`, i, i, i), nil)
	})
	for i, r := range rs {
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d: status %d, err %v, body %.200s", i, r.status, r.err, r.body)
		}
	}
	if d := metricValue(t, "llmgw_tokenize_failures_total") - failuresBefore; d != 0 {
		t.Errorf("%v tokenize failures counted for pooling requests", d)
	}
	if d := metricValue(t, "llmgw_admission_admitted_total") - admittedBefore; d != n {
		t.Errorf("%v requests admitted, want %d", d, n)
	}
	var per []uint64
	var sum uint64
	for _, e := range engines {
		st := e.Stats()
		c := st.RequestsByEndpoint["/v1/embeddings"] + st.RequestsByEndpoint["/score"]
		per, sum = append(per, c), sum+c
	}
	if sum != n {
		t.Fatalf("the engines saw %d pooling requests, want %d (%v)", sum, n, per)
	}
	mean := float64(sum) / float64(len(engines))
	for i, c := range per {
		if float64(c) > 1.5*mean {
			t.Errorf("engine %d got %d of %d requests, over 1.5 × the mean %.0f (%v)", i, c, n, mean, per)
		}
	}
	t.Logf("pooling requests per engine: %v", per)
}

// TestMessagesMatchLikeChat: an Anthropic /v1/messages conversation with
// a system prompt is tokenized as vLLM renders it, so its second request
// matches the blocks its first left in an engine's cache exactly as its
// chat-completions equivalent does, on the precise tier, and is routed
// there; the same holds for a /v1/responses request with instructions.
func TestMessagesMatchLikeChat(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{TimeScale: 20})
	gateway{patient: true, engines: kvEngines(engines...), policy: "\t\t\tdebug_headers\n"}.load(t)
	waitKV(t, engines...)
	system := "You answer questions about the schema." + words("table", 300)
	turns := []map[string]string{
		{"role": "user", "content": "list the tables"},
		{"role": "assistant", "content": "there are many"},
		{"role": "user", "content": "which are large?"},
	}
	anthropic := func(msgs []map[string]string) string {
		b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "system": system, "messages": msgs})
		return string(b)
	}
	chatBody := func(msgs []map[string]string) string {
		all := append([]map[string]string{{"role": "system", "content": system}}, msgs...)
		b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "messages": all})
		return string(b)
	}
	base := "http://" + gatewayAddr
	first := send(context.Background(), base+"/v1/messages", anthropic(turns[:1]), nil)
	if first.err != nil || first.status != http.StatusOK {
		t.Fatalf("first request: status %d, err %v, body %.300s", first.status, first.err, first.body)
	}
	holder := first.upstream
	waitBlocks(t, holder, 300/16)
	waitIdle(t, holder)

	asMessages := explainPath(t, "/v1/messages", anthropic(turns))
	asChat := explainPath(t, "/v1/chat/completions", chatBody(turns))
	m, c := asMessages.matched(holder), asChat.matched(holder)
	if m < 300/16 || m != c || asMessages.Tokens != asChat.Tokens {
		t.Fatalf("at %s: messages matched %d blocks of %d tokens, chat %d of %d; want equal, at least %d",
			holder, m, asMessages.Tokens, c, asChat.Tokens, 300/16)
	}
	// Responses: instructions are the system message, input the turns.
	responses := func(msgs []map[string]string) string {
		b, _ := json.Marshal(map[string]any{"model": "sim-model", "max_output_tokens": 4, "instructions": system, "input": msgs})
		return string(b)
	}
	asResponses := explainPath(t, "/v1/responses", responses(turns))
	if r := asResponses.matched(holder); r != c || asResponses.Tokens != asChat.Tokens {
		t.Errorf("responses matched %d blocks of %d tokens at %s, chat %d of %d", r, asResponses.Tokens, holder, c, asChat.Tokens)
	}
	second := send(context.Background(), base+"/v1/messages", anthropic(turns), nil)
	if second.status != http.StatusOK || second.upstream != holder || second.tier != "precise" {
		t.Fatalf("second request: status %d to %s on tier %q, want 200 to %s on precise: %.300s",
			second.status, second.upstream, second.tier, holder, second.body)
	}

	if !strings.Contains(first.body, `"type":"message"`) {
		t.Errorf("the first answer is not an Anthropic message: %.200s", first.body)
	}
}

// explainPath is /llm/explain's answer for body parsed as path's API.
func explainPath(t *testing.T, path, body string) explainReply {
	t.Helper()
	var ex explainReply
	if code := adminJSON(t, http.MethodPost, "/llm/explain?path="+path, body, &ex); code != http.StatusOK {
		t.Fatalf("explain %s: status %d", path, code)
	}
	return ex
}

// matched is the blocks explain says dial holds of the prompt.
func (ex explainReply) matched(dial string) int {
	for _, c := range ex.Candidates {
		if c.Dial == dial {
			return c.MatchedBlocks
		}
	}
	return -1
}
