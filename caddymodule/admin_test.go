package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/routing"
)

// TestPolicyAdminExplainEnginesDrain: /llm/explain reports every
// candidate's matched blocks, tier, load and cost and the pick, without
// proxying; /llm/engines reports each engine's KV subscription and mirror;
// a drained engine gets no new requests while its in-flight one finishes,
// and undrain restores it.
func TestPolicyAdminExplainEnginesDrain(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 20})
	gateway{patient: true, engines: kvEngines(engines...), appExtra: "\t\thash_seed 0\n", policy: "\t\t\tdebug_headers\n"}.load(t)
	waitKV(t, engines...)
	holder := engines[0]
	prefix := "Explain me." + words("exp", 1500)
	direct(t, holder, chat{system: prefix, user: "warm", maxTokens: 1}.body())
	minBlocks := 1500 / 16
	waitBlocks(t, holder.Addr(), minBlocks)

	// Explain: no request reaches an engine.
	served := make([]uint64, len(engines))
	for i, e := range engines {
		served[i] = e.Stats().RequestsServed
	}
	var ex explainReply
	if code := adminJSON(t, http.MethodPost, "/llm/explain", chat{system: prefix, user: "what would you do?", maxTokens: 4}.body(), &ex); code != http.StatusOK {
		t.Fatalf("/llm/explain: %d", code)
	}
	if ex.Pick == nil || *ex.Pick != holder.Addr() || ex.Tier != "precise" || ex.Outcome != "hit" || len(ex.Candidates) != 3 || ex.Tokens < 1500 || ex.BlockSize != 16 {
		t.Fatalf("explain: %+v", ex)
	}
	for _, c := range ex.Candidates {
		held := c.MatchedBlocks >= minBlocks
		if c.Dial != holder.Addr() {
			held = c.MatchedBlocks == 0
		}
		if c.Tier != routing.Precise.String() || !held || c.Cost <= 0 || c.Excluded != "" {
			t.Errorf("candidate %+v", c)
		}
	}
	for i, e := range engines {
		if n := e.Stats().RequestsServed; n != served[i] {
			t.Errorf("explain proxied to %s", e.Addr())
		}
		if r := getEngineReport(t, e.Addr()); r.Inflight != 0 {
			t.Errorf("explain left a reservation on %s", e.Addr())
		}
	}
	if code := adminJSON(t, http.MethodPost, "/llm/explain", `{"model":`, nil); code != http.StatusBadRequest {
		t.Errorf("explain of a broken body: %d, want 400", code)
	}

	// Engines: the KV state of each.
	r := getEngineReport(t, holder.Addr())
	kv := r.KV
	if kv == nil || !kv.Subscribed || !kv.Connected || kv.Mode != "connect" || kv.Endpoint != holder.KVEndpoint() ||
		kv.LastSeq == nil || kv.Blocks < minBlocks || kv.Stored == 0 || kv.LastResync.IsZero() || kv.Resyncs["subscribe"] == 0 ||
		!kv.Verify.Enabled || kv.Verify.Checked == 0 {
		raw, _ := json.Marshal(kv)
		t.Errorf("holder's KV report: %s", raw)
	}
	if r.Breaker != "closed" || r.Drained || !r.Known || r.BlockSize != 16 {
		t.Errorf("holder's report: %+v", r)
	}

	// Drain the holder while it streams a long answer.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	long := make(chan reply, 1)
	go func() {
		long <- send(ctx, "", chat{system: prefix, user: "a long answer please", maxTokens: 3000, stream: true}.body(), nil)
	}()
	testwait.For(t, 15*time.Second, "the long request to reach the holder", func() bool {
		st := holder.Stats()
		return st.Running+st.Waiting > 0
	})
	var dr map[string]any
	if code := adminJSON(t, http.MethodPost, "/llm/engines/"+holder.Addr()+"/drain", "", &dr); code != http.StatusOK || dr["drained"] != true {
		t.Fatalf("drain: %d %v", code, dr)
	}
	if !getEngineReport(t, holder.Addr()).Drained {
		t.Error("/llm/engines does not show the drain")
	}
	if st := holder.Stats(); st.Running+st.Waiting == 0 {
		t.Fatal("the long request ended before the drain: the test proves nothing")
	}
	ex = explainReply{}
	adminJSON(t, http.MethodPost, "/llm/explain", chat{system: prefix, user: "and while drained?", maxTokens: 4}.body(), &ex)
	if ex.Pick == nil || *ex.Pick == holder.Addr() {
		t.Errorf("explain picks the drained engine: %+v", ex)
	}
	for _, c := range ex.Candidates {
		if (c.Dial == holder.Addr()) != (c.Excluded == "drained") {
			t.Errorf("explain while drained: candidate %+v", c)
		}
	}
	for i := range 15 {
		var res reply
		if i%3 == 0 {
			res = mustSend(t, "", chat{system: prefix, user: fmt.Sprintf("while drained %d", i), maxTokens: 2}.body(), nil)
		} else {
			res = mustSend(t, "", chat{user: fmt.Sprintf("cold while drained %d", i), maxTokens: 2}.body(), nil)
		}
		if res.upstream == holder.Addr() {
			t.Fatalf("request %d went to the drained engine", i)
		}
	}
	select {
	case lr := <-long:
		if lr.err != nil || lr.status != http.StatusOK || lr.upstream != holder.Addr() || !strings.Contains(lr.body, "data: [DONE]") {
			t.Errorf("the in-flight request did not finish on the drained engine: %d %v %s %.200s", lr.status, lr.err, lr.upstream, lr.body)
		}
	case <-ctx.Done():
		t.Fatal("the in-flight request never finished")
	}

	// The long answer streamed one token per step: 20 ms simulated, 1 ms of
	// wall time at TimeScale 20. The holder's step time is the gateway's
	// wall-time measure of that stream, not the engine's histogram (which
	// reads 20 ms), and the scrape lead is sized from it.
	testwait.For(t, 15*time.Second, "the holder's step time", func() bool {
		r := getEngineReport(t, holder.Addr())
		return r.StepSeconds > 0 && r.StepSeconds < 0.01 && r.ScrapeLeadSeconds > 0 && r.ScrapeLeadSeconds <= 2*r.StepSeconds+0.005+1e-9
	})

	// Until a scrape renders the holder without the long answer, its KV
	// usage still counts the answer's blocks and costs it every cold
	// request; the 30 below take less than a poll interval, so without
	// this wait they could all go elsewhere (it failed 1 run in 6).
	testwait.For(t, 15*time.Second, "a scrape of the holder after the long answer", func() bool {
		r := getEngineReport(t, holder.Addr())
		return r.Known && r.Running == 0 && r.KVUsage == 0
	})
	if code := adminJSON(t, http.MethodPost, "/llm/engines/"+holder.Addr()+"/undrain", "", &dr); code != http.StatusOK || dr["drained"] != false {
		t.Fatalf("undrain: %d %v", code, dr)
	}
	got := 0
	for i := range 30 {
		if mustSend(t, "", chat{user: fmt.Sprintf("cold after the drain %d", i), maxTokens: 2}.body(), nil).upstream == holder.Addr() {
			got++
		}
	}
	if got == 0 {
		t.Error("the undrained engine got none of 30 cold requests")
	}
	if code := adminJSON(t, http.MethodPost, "/llm/engines/"+holder.Addr()+"/explode", "", nil); code != http.StatusNotFound {
		t.Errorf("unknown action: %d, want 404", code)
	}
}
