package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
)

func chatRequest(t testing.TB, extra map[string]any, content string) *openai.Request {
	t.Helper()
	body := map[string]any{"model": "sim-model", "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": content}}}
	for k, v := range extra {
		body[k] = v
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := openai.ParseRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// holds reports whether the approximate tree holds a prefix of key on dial.
func holds(f *Fleet, key, dial string) bool {
	ms, _ := f.approx.Match(key)
	for _, m := range ms {
		if m.Engine == dial && m.Bytes > 0 {
			return true
		}
	}
	return false
}

// TestRoutedCacheKeyPath: a request routed by its cache key (Route's
// Decision has no approximate key) is remembered in the approximate tree
// under the same key a prompt-routed request uses — its cache_salt
// namespace included — so it neither teaches unsalted requests a prefix
// they cannot hit nor is missing for later requests of its own salt. (It
// was keyed without the namespace.)
func TestRoutedCacheKeyPath(t *testing.T) {
	f := New(zap.NewNop(), Options{})
	defer f.Close()
	req := chatRequest(t, map[string]any{"cache_salt": "tenant-a"}, "the salted prompt, long enough to be remembered by the tree")
	d := f.Route(context.Background(), Query{Request: req, Dials: deadDials, Settings: DefaultSettings(), CacheKey: "s1"})
	if d.Index < 0 || d.Tier != routing.CacheKey || d.Outcome != routing.Hit {
		t.Fatalf("cache-key decision %+v", d.Decision)
	}
	dial := deadDials[d.Index]
	d.Commit(dial)
	salted, nsLen := approxKey(req, "")
	if nsLen == 0 || !holds(f, salted, dial) {
		t.Errorf("the tree does not hold the request under its salted key (namespace %d bytes)", nsLen)
	}
	unsalted := *req
	unsalted.CacheSalt = ""
	if plain, _ := approxKey(&unsalted, ""); holds(f, plain, dial) {
		t.Errorf("the tree taught an unsalted request the salted request's prefix")
	}
}

// TestRouteApproximate: without token ids (tokenize off) the tree routes a
// repeated prompt back where it went, and a request without a body is
// routed on load alone.
func TestRouteApproximate(t *testing.T) {
	f := New(zap.NewNop(), Options{})
	defer f.Close()
	s := DefaultSettings()
	s.Tokenize = false
	req := chatRequest(t, nil, string(bytes.Repeat([]byte("a shared system prompt. "), 200)))
	f.Unrouted(req, nil).Commit(deadDials[2])
	d := f.Route(context.Background(), Query{Request: req, Dials: deadDials, Settings: s, Explain: true})
	if d.Index != 2 || d.Tier != routing.Approximate || d.Outcome != routing.Hit {
		t.Fatalf("decision %+v, want the approximate hit on engine 2", d.Decision)
	}
	if len(d.Scored) != len(deadDials) || d.Tokenize.Called {
		t.Fatalf("explain scored %d candidates, tokenize called %v", len(d.Scored), d.Tokenize.Called)
	}
	if d := f.Route(context.Background(), Query{Dials: deadDials, Settings: s}); d.Index != -1 || d.Tier != routing.LoadOnly {
		t.Fatalf("no request: %+v, want no pick on load only", d.Decision)
	}
}

// TestRouteExplainMarksUnavailable: explain shows drained engines and open
// breakers as such.
func TestRouteExplainMarksUnavailable(t *testing.T) {
	f := New(zap.NewNop(), Options{})
	defer f.Close()
	f.SetBreaker(routing.BreakerConfig{Failures: 1})
	f.SetDrained(deadDials[0], true)
	f.Proxied(deadDials[1]).Outcome(nil, 502)
	s := DefaultSettings()
	s.Tokenize = false
	d := f.Route(context.Background(), Query{Request: chatRequest(t, nil, "hello"), Dials: deadDials, Settings: s, Explain: true})
	got := []string{d.Scored[0].Excluded, d.Scored[1].Excluded, d.Scored[2].Excluded}
	if got[0] != "drained" || got[1] != "breaker_open" || got[2] != "" {
		t.Fatalf("exclusions %q", got)
	}
	f.Proxied(deadDials[2]).Outcome(nil, 200)
	if f.Breaker().State(deadDials[2], time.Now()) != routing.StateClosed {
		t.Fatal("a 200 opened the breaker")
	}
}

func TestApproxKeyNamespaces(t *testing.T) {
	req := chatRequest(t, nil, "same text")
	plain, n := approxKey(req, "")
	lora, nl := approxKey(req, "adapter")
	salted := *req
	salted.CacheSalt = "s"
	salt, ns := approxKey(&salted, "")
	if n != 0 || nl == 0 || ns == 0 {
		t.Fatalf("namespace lengths %d %d %d", n, nl, ns)
	}
	if plain[n:] != lora[nl:] || plain[n:] != salt[ns:] {
		t.Fatal("the text after the namespace differs")
	}
	if lora == salt || lora == plain || salt == plain {
		t.Fatal("two namespaces share a key")
	}
}

func TestSpreadKeyFirstBlock(t *testing.T) {
	a := []uint64{1, 2, 3, 4, 5}
	b := []uint64{1, 2, 3, 9, 9}
	if spreadKey(a, 3, "") != spreadKey(b, 3, "") {
		t.Fatal("prompts sharing their first block disagree")
	}
	if spreadKey(a, 4, "") == spreadKey(b, 4, "") {
		t.Fatal("prompts differing in their first block agree")
	}
	if spreadKey(nil, 16, "text a") == spreadKey(nil, 16, "text b") {
		t.Fatal("texts differing in their first bytes agree")
	}
}

// FuzzPromptIDs: token-id prompts are taken as they are; nothing else is.
// encoding/json is the oracle: ids are exactly what it decodes, and a
// non-empty array of unsigned integers is always taken.
func FuzzPromptIDs(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, `"text"`, `[]`, `[[1,2]]`, `["a"]`, `[1.5]`, `[-1]`, ` [7] `, `[18446744073709551616]`, `[1e3]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, prompt []byte) {
		ids := promptIDs(&openai.Request{Prompt: prompt})
		if ids != nil && len(ids) == 0 {
			t.Fatal("empty, non-nil ids")
		}
		var want []uint64
		trimmed := bytes.TrimSpace(prompt)
		err := json.Unmarshal(trimmed, &want)
		oracle := err == nil && len(want) > 0 && len(trimmed) > 0 && trimmed[0] == '['
		if oracle != (ids != nil) || !slices.Equal(ids, want) && oracle {
			t.Fatalf("promptIDs(%q) = %v, encoding/json: %v (%v)", prompt, ids, want, err)
		}
		if ids := promptIDs(&openai.Request{Prompt: prompt, Messages: []byte(`[]`)}); ids != nil {
			t.Fatal("ids for a chat request")
		}
	})
}
