package caddymodule

import (
	"encoding/json"
	"testing"

	"github.com/llmgw/caddy-llmgw/admission"
)

// TestPolicyApproxKeyCacheKeyPath: a request routed by its cache-key
// header is remembered in the approximate tree under the same key a
// prompt-routed request uses — its cache_salt namespace included — so it
// neither teaches unsalted requests a prefix they cannot hit nor is
// missing for later requests of its own salt. (It was keyed without the
// namespace.)
func TestPolicyApproxKeyCacheKeyPath(t *testing.T) {
	defer polLeakCheck(t)()
	f := testFleet()
	defer f.Destruct()
	p := testPolicy(f, &Policy{CacheKeyHeader: "X-Session-ID"})
	b, _ := json.Marshal(map[string]any{
		"model":      "sim-model",
		"max_tokens": 8,
		"cache_salt": "tenant-a",
		"messages":   []map[string]string{{"role": "user", "content": "the salted prompt, long enough to be remembered by the tree"}},
	})
	r, _, cancel := testRequest(t, string(b))
	defer cancel()
	r.Header.Set("X-Session-ID", "s1")
	u := p.Select(testPool(deadDials...), r, nil)
	if u == nil {
		t.Fatal("no pick")
	}
	req, err := admission.ParseRequest(b)
	if err != nil || req.CacheSalt != "tenant-a" {
		t.Fatalf("parse: %+v, %v", req, err)
	}
	holds := func(key string) bool {
		ms, _ := f.approx.Match(key)
		for _, m := range ms {
			if m.Engine == u.Dial && m.Bytes > 0 {
				return true
			}
		}
		return false
	}
	salted, nsLen := approxKey(req, "")
	if nsLen == 0 || !holds(salted) {
		t.Errorf("the tree does not hold the request under its salted key (namespace %d bytes)", nsLen)
	}
	unsalted := *req
	unsalted.CacheSalt = ""
	if plain, _ := approxKey(&unsalted, ""); holds(plain) {
		t.Errorf("the tree taught an unsalted request the salted request's prefix")
	}
}
