package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// The late-join tests: engines that cached a prefix before the gateway
// subscribed (a restart, a deploy, a scale-out instance). vllmsim hashes
// with sha256_cbor and PYTHONHASHSEED "0" unless told otherwise.

// chatTokens is the engine's own /tokenize answer for a chat body, so a
// test can say how many leading blocks two prompts share.
func chatTokens(t testing.TB, e *vllmsim.Engine, body string) []uint64 {
	t.Helper()
	var req map[string]any
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	tb, _ := json.Marshal(map[string]any{"model": req["model"], "messages": req["messages"]})
	res, err := client.Post("http://"+e.Addr()+"/tokenize", "application/json", bytes.NewReader(tb))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out struct {
		Tokens []uint64 `json:"tokens"`
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/tokenize: %d", res.StatusCode)
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Tokens
}

// sharedBlocks is how many leading full blocks of 16 tokens a and b share.
func sharedBlocks(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n / 16
}

// TestPolicyLateJoinRecognisesHeldPrefix: the holder cached a system
// prompt before the gateway started, and the gateway has no replay
// endpoint to learn it from. Blind at first; once the holder stores a
// block extending the prefix (its event's parent is unknown to the
// gateway), hash_seed lets the gateway recognise the prefix by the
// engine's own hashes: explain shows the holder matched through the new
// block, and through the whole shared prefix for another question.
func TestPolicyLateJoinRecognisesHeldPrefix(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{TimeScale: 50})
	holder := engines[0]
	sys := "Late join instructions." + words("late", 400)
	direct(t, holder, chat{system: sys, user: "warm-up question", maxTokens: 1}.body())

	g := gateway{patient: true, engines: noKVEngines(engines...), appExtra: "\t\thash_seed 0\n", policy: "\t\t\tdebug_headers\n"}
	for i, e := range engines {
		g.engines[i].kv = e.KVEndpoint() // no kv_replay
	}
	g.load(t)
	waitKV(t, engines...)

	second := chat{system: sys, user: "a second question, asked on the engine directly", maxTokens: 1}.body()
	if c := explainFor(t, second, holder.Addr()); c.MatchedBlocks != 0 || c.Tier != "precise" {
		t.Fatalf("before any event of the holder: %+v, want precise with 0 blocks (blind)", c)
	}
	direct(t, holder, second)
	testwait.For(t, 10*time.Second, "the holder's orphan event", func() bool {
		kv := getEngineReport(t, holder.Addr()).KV
		return kv.OrphanEvents > 0
	})

	secondToks := chatTokens(t, holder, second)
	if c := explainFor(t, second, holder.Addr()); c.MatchedBlocks != len(secondToks)/16 {
		t.Fatalf("the prompt the holder stored: %d blocks matched, want all %d; explain %s",
			c.MatchedBlocks, len(secondToks)/16, explainJSON(t, second))
	}
	third := chat{system: sys, user: "a third question, through the gateway", maxTokens: 1}.body()
	want := sharedBlocks(secondToks, chatTokens(t, holder, third))
	if want < 400/16 {
		t.Fatalf("the prompts share %d blocks: the test's system prompt is too short", want)
	}
	if c := explainFor(t, third, holder.Addr()); c.MatchedBlocks != want {
		t.Fatalf("another question after the same system prompt: %d blocks matched, want %d; explain %s",
			c.MatchedBlocks, want, explainJSON(t, third))
	}
	waitIdle(t, holder.Addr())
	if r := mustSend(t, "", third, nil); r.upstream != holder.Addr() || r.tier != "precise" {
		t.Fatalf("the first request through the gateway went to %s on %q, want the holder %s on precise",
			r.upstream, r.tier, holder.Addr())
	}
	r := getEngineReport(t, holder.Addr()).KV
	if r.RecognizedBlocks == 0 || r.Unapplied["unknown_parent"] != 0 || !r.Trusted {
		t.Fatalf("report: recognized %d, unapplied %v, trusted %v", r.RecognizedBlocks, r.Unapplied, r.Trusted)
	}
}

// TestPolicyLateJoinBackfill: with kv_replay, a gateway that subscribes
// after the engines cached their prefixes asks the replay buffer for what
// they published before it, and routes the very first request of each
// prefix to its holder at the prefix's full length.
func TestPolicyLateJoinBackfill(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 50})
	prefixes := make([]string, len(engines))
	for i, e := range engines {
		prefixes[i] = fmt.Sprintf("Backfill tenant %d.", i) + words(fmt.Sprintf("bf%d", i), 500)
		direct(t, e, chat{system: prefixes[i], user: "warm-up", maxTokens: 1}.body())
	}
	gateway{patient: true, engines: kvEngines(engines...), policy: "\t\t\tdebug_headers\n"}.load(t)
	waitKV(t, engines...)
	for i, e := range engines {
		testwait.For(t, 10*time.Second, "backfilled mirror of "+e.Addr(), func() bool {
			return getEngineReport(t, e.Addr()).KV.Backfilled > 0
		})
		body := chat{system: prefixes[i], user: "the first question through the gateway", maxTokens: 1}.body()
		want := sharedBlocks(chatTokens(t, e, chat{system: prefixes[i], user: "warm-up"}.body()), chatTokens(t, e, body))
		if c := explainFor(t, body, e.Addr()); c.MatchedBlocks != want {
			t.Fatalf("engine %d: %d blocks matched, want the %d the engine holds; explain %s", i, c.MatchedBlocks, want, explainJSON(t, body))
		}
		waitIdle(t, e.Addr())
		if r := mustSend(t, "", body, nil); r.upstream != e.Addr() || r.tier != "precise" {
			t.Errorf("prefix %d: first request to %s on %q, want %s on precise", i, r.upstream, r.tier, e.Addr())
		}
	}
}

// TestPolicyLateJoinUnappliedFallsBack: without hash_seed or a replay
// endpoint, events that extend prefixes cached before the subscription
// cannot be applied. They are counted by reason, in /llm/engines and in
// llmgw_kv_events_unapplied_total, and once they are most of an engine's
// recent events, routing weighs it on the approximate tier and explain
// says why.
func TestPolicyLateJoinUnappliedFallsBack(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{TimeScale: 200})
	e := engines[0]
	systems := make([]string, 20)
	for i := range systems {
		systems[i] = fmt.Sprintf("Orphan tenant %d.", i) + words(fmt.Sprintf("or%d", i), 60)
		direct(t, e, chat{system: systems[i], user: "warm-up", maxTokens: 1}.body())
	}
	g := gateway{patient: true, engines: noKVEngines(engines...)}
	for i, x := range engines {
		g.engines[i].kv = x.KVEndpoint()
	}
	g.load(t)
	waitKV(t, engines...)
	for i := range systems {
		direct(t, e, chat{system: systems[i], user: "a later question", maxTokens: 1}.body())
	}
	testwait.For(t, 10*time.Second, "unapplied events counted", func() bool {
		kv := getEngineReport(t, e.Addr()).KV
		return kv.Unapplied["unknown_parent"] >= 16 && !kv.Trusted
	})
	if v := metricValue(t, "llmgw_kv_events_unapplied_total", `engine="`+e.Addr()+`"`, `reason="unknown_parent"`); v < 16 {
		t.Fatalf("llmgw_kv_events_unapplied_total{reason=unknown_parent} = %v, want >= 16", v)
	}
	if v := metricValue(t, "llmgw_kv_trusted", `engine="`+e.Addr()+`"`); v != 0 {
		t.Fatalf("llmgw_kv_trusted = %v, want 0", v)
	}
	var ex struct {
		Candidates []struct {
			Dial       string `json:"dial"`
			Tier       string `json:"tier"`
			TierReason string `json:"tier_reason"`
		} `json:"candidates"`
	}
	body := chat{system: systems[0], user: "where does it go"}.body()
	if code := adminJSON(t, http.MethodPost, "/llm/explain", body, &ex); code != http.StatusOK {
		t.Fatalf("explain: %d", code)
	}
	for _, c := range ex.Candidates {
		switch {
		case c.Dial == e.Addr() && (c.Tier != "approximate" || c.TierReason != "kv_events_unapplied"):
			t.Errorf("the engine whose events do not apply: tier %q reason %q, want approximate, kv_events_unapplied", c.Tier, c.TierReason)
		case c.Dial != e.Addr() && (c.Tier != "precise" || c.TierReason != ""):
			t.Errorf("the other engine: tier %q reason %q, want precise", c.Tier, c.TierReason)
		}
	}
}
