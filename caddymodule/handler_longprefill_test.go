package caddymodule

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestLongPrefillHoldEndsAtFirstToken: a streamed prompt over long_prefill
// occupies its engine (/llm/engines' occupied_seconds) while the engine
// prefills it, and the hold ends at the stream's first token — long before
// the estimate (here 1,200 tokens at a configured 1 token/s) would have.
func TestLongPrefillHoldEndsAtFirstToken(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{TimeScale: 1, PrefillTokensPerSec: 1000, DecodeStepTime: 10 * time.Millisecond})[0]
	gateway{engines: kvEngines(e), admission: "\t\tlong_prefill 100\n\t\tprefill_rate 1\n", patient: true}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	testwait.For(t, 10*time.Second, "engine gauged", func() bool { return getEngineReport(t, e.Addr()).Known })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := chat{user: longText(1200), stream: true, maxTokens: 300}.body()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+gatewayAddr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The engine prefills 1,200 tokens for ~1.2 s: the hold shows.
	testwait.For(t, 5*time.Second, "the engine occupied by the long prefill", func() bool {
		return getEngineReport(t, e.Addr()).Occupied > 60
	})
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			break // the first token
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if r := getEngineReport(t, e.Addr()); r.Occupied != 0 || r.Inflight != 1 {
		t.Fatalf("after the first token, still in flight: occupied %v s (want 0), local_inflight %d", r.Occupied, r.Inflight)
	}
}
