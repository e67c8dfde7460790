package caddymodule

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestPolicyWithoutAdmission: without llm_admission the policy reads the
// body itself and still routes precisely; the engines get the whole body
// (the prompt they count is the prompt sent directly); and a response-based
// retry works without request_buffers, because the policy hands every
// attempt the body it read.
func TestPolicyWithoutAdmission(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 100})
	bad := engines[2]
	gateway{
		patient:    true,
		engines:    kvEngines(engines...),
		admission:  "-",
		policy:     "\t\t\tdebug_headers\n\t\t\tbreaker_failures 2\n\t\t\tbreaker_cooldown 1m\n",
		proxyExtra: "\t\tlb_retries 2\n\t\tlb_retry_match {\n\t\t\texpression `{rp.status_code} >= 500`\n\t\t}\n",
	}.load(t)
	waitKV(t, engines...)
	holder := engines[0]
	prefix := "No admission here." + words("noadm", 1500)
	direct(t, holder, chat{system: prefix, user: "warm", maxTokens: 1}.body())
	waitBlocks(t, holder.Addr(), 1500/16)

	promptTokens := func(body string) int {
		var r struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("response %q: %v", body, err)
		}
		return r.Usage.PromptTokens
	}
	for i := range 5 {
		body := chat{system: prefix, user: fmt.Sprintf("question %d", i), maxTokens: 2}.body()
		r := mustSend(t, "", body, nil)
		if r.upstream != holder.Addr() || r.tier != "precise" {
			t.Errorf("request %d: %s on %q, want %s on precise", i, r.upstream, r.tier, holder.Addr())
		}
		want := promptTokens(direct(t, holder, body).body)
		if got := promptTokens(r.body); got != want {
			t.Errorf("request %d: the engine counted %d prompt tokens through the gateway, %d directly", i, got, want)
		}
	}

	// One engine answers 500: retries go elsewhere with the whole body.
	bad.SetFaults(vllmsim.Faults{Error500: true})
	for i := range 30 {
		body := chat{user: fmt.Sprintf("cold %d %s", i, strings.Repeat("words ", i)), maxTokens: 2}.body()
		r := mustSend(t, "", body, nil)
		if r.upstream == bad.Addr() {
			t.Fatalf("request %d answered by the failing engine", i)
		}
		if promptTokens(r.body) == 0 {
			t.Errorf("request %d: no prompt reached the engine", i)
		}
	}
	// The failing engine was picked (and its failures seen on the retries).
	if st := getEngineReport(t, bad.Addr()).Breaker; st != "open" {
		t.Errorf("the failing engine's breaker is %q, want open: were retries seen?", st)
	}
}
