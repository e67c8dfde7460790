package vllmsim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// getBody GETs url and returns its status and body.
func getBody(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestSleepMode: POST /sleep empties the KV cache (an idle engine
// publishes AllBlocksCleared as vLLM's prefix-cache reset does), the
// gauge and /is_sleeping show it, inference answers 503 while /metrics
// and /tokenize keep working; POST /wake_up serves again, cold.
func TestSleepMode(t *testing.T) {
	e := startEngine(t, Config{KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0"}})
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := dialSub(t, e.KVEndpoint(), "")
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat("sleep on it ", 20)
	complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	if r := complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}); cachedTokens(r) == 0 {
		t.Fatal("the repeated prompt hit no cache before sleep")
	}
	for _, bad := range []string{"3", "x"} {
		if st, _ := postJSON(t, c, e.URL()+"/sleep?level="+bad, nil); st != http.StatusBadRequest {
			t.Errorf("POST /sleep?level=%s: %d, want 400", bad, st)
		}
	}
	if st, out := postJSON(t, c, e.URL()+"/sleep?level=2", nil); st != http.StatusOK {
		t.Fatalf("POST /sleep: %d %s", st, out)
	}
	for cleared := false; !cleared; {
		for _, raw := range decodeBatch(t, sub.next(t, 5*time.Second)[2]).events {
			cleared = cleared || asEvent(t, raw, false).typ == "AllBlocksCleared"
		}
	}
	if _, body := getBody(t, c, e.URL()+"/is_sleeping"); !strings.Contains(body, `"is_sleeping":true`) {
		t.Errorf("/is_sleeping: %s", body)
	}
	_, metrics := getBody(t, c, e.URL()+"/metrics")
	for _, want := range []string{`sleep_state="awake"} 0.0`, `sleep_state="discard_all"} 1.0`, `sleep_state="weights_offloaded"} 0.0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	st, out := postJSON(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	var apiErr apiError
	if st != http.StatusServiceUnavailable || json.Unmarshal(out, &apiErr) != nil || apiErr.Error.Code != 503 {
		t.Errorf("completion while asleep: %d %s, want vLLM's 503 error", st, out)
	}
	if st, out := postJSON(t, c, e.URL()+"/tokenize", map[string]any{"prompt": prompt}); st != http.StatusOK {
		t.Errorf("/tokenize while asleep: %d %s", st, out)
	}

	if st, out := postJSON(t, c, e.URL()+"/wake_up", nil); st != http.StatusOK {
		t.Fatalf("POST /wake_up: %d %s", st, out)
	}
	if _, body := getBody(t, c, e.URL()+"/metrics"); !strings.Contains(body, `sleep_state="awake"} 1.0`) {
		t.Error("/metrics does not show the engine awake")
	}
	if r := complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}); cachedTokens(r) != 0 {
		t.Errorf("%d cached tokens after waking, want a cold cache", cachedTokens(r))
	}
}
