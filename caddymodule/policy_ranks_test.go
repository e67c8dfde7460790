package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// startDPServer starts a simulated `vllm serve --data-parallel-size n`
// whose rank r publishes KV events on the returned base port + r, as vLLM
// does: the base is a free port, tried again if a rank's port is taken.
func startDPServer(t *testing.T, n int) (*vllmsim.DPServer, int) {
	t.Helper()
	var last error
	for range 10 {
		port := mustFreePort(t)
		d, err := vllmsim.StartDataParallel(context.Background(), vllmsim.Config{
			TimeScale: 5, DataParallelSize: n,
			// A `*` binds, as vLLM's publisher does; rank r binds port + r.
			KVEvents: &vllmsim.KVEventsConfig{Endpoint: fmt.Sprintf("tcp://*:%d", port)},
		})
		if err == nil {
			t.Cleanup(func() { _ = d.Close() })
			return d, port
		}
		last = err
	}
	t.Fatalf("starting a data-parallel server: %v", last)
	return nil, 0
}

// TestPolicyDataParallelRanks: one vLLM API server with two data-parallel
// ranks, declared with data_parallel_size 2, is two routing targets: each
// rank's KV events (port + rank) feed its own mirror, a prompt whose
// prefix rank 1 holds goes to rank 1 and reaches it through the
// X-data-parallel-rank header, and fresh prompts reach rank 0 the same
// way. /llm/explain scores the ranks apart and /llm/engines shows both,
// and no engine keyed by the bare address: llm_admission in front counts
// each request on the rank it went to.
func TestPolicyDataParallelRanks(t *testing.T) {
	d, port := startDPServer(t, 2)
	addr := d.Addr()
	rank := func(r int) string { return fleet.RankKey(addr, r) }
	gateway{
		patient: true,
		engines: []gatewayEngine{{dial: addr, kv: fmt.Sprintf("tcp://127.0.0.1:%d", port), extra: "\t\t\tdata_parallel_size 2\n"}},
		policy:  "\t\t\tdebug_headers\n",
	}.load(t)
	for r, e := range d.Ranks() {
		testwait.For(t, 15*time.Second, "KV subscription to "+rank(r), func() bool {
			rep := getEngineReport(t, rank(r))
			return rep.KV != nil && rep.KV.Connected && rep.Known
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := e.WaitKVSubscribers(ctx, 1)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}

	prefix := "You are the assistant of rank one." + words("dp", 400)
	warm := send(context.Background(), d.URL()+"/v1/chat/completions", chat{system: prefix, user: "warm up", maxTokens: 1}.body(),
		map[string]string{"X-Data-Parallel-Rank": "1"})
	if warm.err != nil || warm.status != http.StatusOK {
		t.Fatalf("warm-up on rank 1: status %d, err %v", warm.status, warm.err)
	}
	waitBlocks(t, rank(1), 400/16)
	if rep := getEngineReport(t, rank(0)); rep.KV == nil || rep.KV.Blocks != 0 || rep.KV.Unapplied["wrong_rank"] != 0 {
		t.Fatalf("rank 0's mirror after rank 1's events: %+v", rep.KV)
	}
	waitIdle(t, rank(1))

	before := d.Pinned()
	for i := range 4 {
		r := mustSend(t, "", chat{system: prefix, user: fmt.Sprintf("question %d", i), maxTokens: 2}.body(), nil)
		if r.upstream != rank(1) {
			t.Fatalf("request %d with rank 1's prefix went to %s, want %s; explain: %s", i, r.upstream, rank(1),
				explainJSON(t, chat{system: prefix, user: "q"}.body()))
		}
	}
	if after := d.Pinned(); after[1]-before[1] != 4 || after[0] != before[0] {
		t.Fatalf("the engine saw X-data-parallel-rank %v before and %v after, want rank 1 four more times", before, after)
	}

	ex := chat{system: prefix, user: "q"}.body()
	if c1, c0 := explainFor(t, ex, rank(1)), explainFor(t, ex, rank(0)); c1.MatchedBlocks < 400/16 || c0.MatchedBlocks != 0 {
		t.Fatalf("/llm/explain: rank 1 matches %d blocks, rank 0 %d; want rank 1 the prefix, rank 0 none", c1.MatchedBlocks, c0.MatchedBlocks)
	}

	// Fresh prompts: rank 0 is a candidate of its own, and is named too.
	for i := 0; ; i++ {
		r := mustSend(t, "", chat{user: fmt.Sprintf("a fresh prompt %d: %s", i, words(fmt.Sprint("f", i), 40)), maxTokens: 2}.body(), nil)
		if r.upstream == rank(0) {
			break
		}
		if i == 60 {
			t.Fatalf("60 fresh requests, none went to %s", rank(0))
		}
	}
	if after := d.Pinned(); after[0] == before[0] {
		t.Fatalf("rank 0 never saw its header: %v", after)
	}
	var ranks []string
	for _, rep := range getEngineReports(t) {
		if rep.Dial == addr {
			// llm_admission once moved each request's reservation (and
			// reported its outcome) to the address reverse_proxy dialled,
			// an engine of its own beside the ranks, which then never
			// counted the requests sent to them.
			t.Fatalf("/llm/engines shows the bare address %s beside its ranks: %+v", addr, rep)
		}
		if strings.HasPrefix(rep.Dial, addr) && rep.Rank != nil {
			ranks = append(ranks, fmt.Sprintf("%s=%s/%d", rep.Dial, rep.Address, *rep.Rank))
		}
	}
	if want := fmt.Sprint([]string{rank(0) + "=" + addr + "/0", rank(1) + "=" + addr + "/1"}); fmt.Sprint(ranks) != want {
		t.Fatalf("/llm/engines shows %v, want %v", ranks, want)
	}
}
