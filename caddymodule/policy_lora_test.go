package caddymodule

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/routing"
)

// TestPolicyLoRAPrecise: vLLM hashes a LoRA request's blocks with the
// adapter's name, so the same prompt cached for the base model is no hit
// for the adapter and the other way round. One engine holds a long prompt
// cached under the adapter, another the same prompt cached for the base
// model (both warmed directly: the gateway learns them from KV events
// only). Through the gateway, the adapter's requests go to the first and
// the base model's to the second, both on the precise tier, and the
// engines report the hits.
func TestPolicyLoRAPrecise(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 5, LoRAModules: []string{"sql-lora"}})
	gateway{
		patient:     true,
		engines:     kvEngines(engines...),
		engineExtra: "\t\t\tmax_inflight 8\n",
		policy:      "\t\t\tdebug_headers\n",
	}.load(t)
	waitKV(t, engines...)
	loraHolder, baseHolder := engines[0], engines[1]
	prefix := "You translate questions into SQL." + words("schema", 600)
	asModel := func(body, model string) string {
		return strings.Replace(body, `"model":"sim-model"`, `"model":"`+model+`"`, 1)
	}
	direct(t, loraHolder, asModel(chat{system: prefix, user: "warm up", maxTokens: 1}.body(), "sql-lora"))
	direct(t, baseHolder, chat{system: prefix, user: "warm up", maxTokens: 1}.body())
	waitBlocks(t, loraHolder.Addr(), 600/16)
	waitBlocks(t, baseHolder.Addr(), 600/16)

	for i, c := range []struct {
		model string
		want  *vllmsim.Engine
	}{
		{"sql-lora", loraHolder}, {"sim-model", baseHolder}, {"sql-lora", loraHolder}, {"sim-model", baseHolder},
	} {
		waitIdle(t, c.want.Addr()) // the warm-up's or the last request's end scraped
		before := c.want.Stats()
		body := asModel(chat{system: prefix, user: "list the tables", maxTokens: 2}.body(), c.model)
		r := send(context.Background(), "", body, nil)
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d (%s): status %d, err %v, body %.200s", i, c.model, r.status, r.err, r.body)
		}
		if r.upstream != c.want.Addr() || r.tier != "precise" {
			t.Fatalf("request %d (%s) went to %s on tier %q, want %s on precise; explain %s",
				i, c.model, r.upstream, r.tier, c.want.Addr(), explainJSON(t, body))
		}
		if got := c.want.Stats().CachedTokens - before.CachedTokens; got < 600 {
			t.Errorf("request %d (%s): %d cached tokens at its holder, want >= 600", i, c.model, got)
		}
	}
}

// TestPolicyLoRAAffinity is issue 37's LoRA figure: 3 engines with 16
// sequence slots and two adapter slots each (--max-loras 2) serve 6
// adapters, and 48 clients — the fleet's 48 sequence slots, a 1× load —
// send adapter requests back to back through llm_admission, each for an
// adapter drawn at random, with prompts that share nothing (so only the
// adapter term can tell engines apart). The engines count the adapter
// requests that arrived while requests for the same adapter ran or
// waited there: after a warm-up of 3 requests per client, at least 90%
// with lb_policy llm; least_conn, in the same run, is logged for
// comparison, with both runs' adapter loads. The simulated engines run in
// real time, a request 1.28 s at the engine, so that it spends most of
// its life there rather than in the gateway and the client, as with real
// engines: at 20 times, under the race detector on a loaded machine, a
// fleet partitioned perfectly (6 adapter loads) showed 79%, and at 10
// times, in a run compiling everything cold alongside, 86% (5 loads):
// requests for an adapter were in flight at the gateway but not yet or no
// longer at the engine. At 4 times (320 ms), on 2026-12-07's host, it read
// 89.2–90.9% run after run, before and after that day's changes alike; at
// 2 times 89.5–94.9% under the race detector; in real time 92.8 and 96.3%.
func TestPolicyLoRAAffinity(t *testing.T) {
	if testing.Short() {
		t.Skip("a load run")
	}
	adapters := []string{"a1", "a2", "a3", "a4", "a5", "a6"}
	run := func(policy string) (share float64, loads uint64) {
		engines := startEngines(t, 3, vllmsim.Config{
			TimeScale: 1, MaxNumSeqs: 16, LoRAModules: adapters, MaxLoRAs: 2, LoRALoadTime: 50 * time.Millisecond,
		})
		gateway{patient: true, engines: kvEngines(engines...), policy: policy}.load(t)
		waitKV(t, engines...)
		waitModelsLearned(t, engines...)
		// Each client's first requests warm the fleet up; the figure is
		// of the arrivals after the fleet has served clients × warm.
		const clients, warm, perClient = 48, 3, 13
		var (
			wg       sync.WaitGroup
			failed   atomic.Int64
			finished atomic.Int64
			base     = make([]vllmsim.Stats, len(engines))
		)
		snapshot := sync.OnceFunc(func() {
			for i, e := range engines {
				base[i] = e.Stats()
			}
		})
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(c), 37))
				for i := range perClient {
					adapter := adapters[rng.IntN(len(adapters))]
					body := strings.Replace(chat{user: words(fmt.Sprintf("c%d-%d", c, i), 40), maxTokens: 64}.body(),
						`"model":"sim-model"`, `"model":"`+adapter+`"`, 1)
					if r := send(context.Background(), "", body, nil); r.err != nil || r.status != http.StatusOK {
						failed.Add(1)
					}
					if finished.Add(1) == clients*warm {
						snapshot()
					}
				}
			}()
		}
		wg.Wait()
		if n := failed.Load(); n > 0 {
			t.Fatalf("%s: %d requests failed", policy, n)
		}
		var all, arrivals, inFlight uint64
		for i, e := range engines {
			st := e.Stats()
			t.Logf("%s: engine %s: requests %v", cmp.Or(policy, "llm"), e.Addr(), e.RequestsByModel())
			all += st.AdapterArrivals
			arrivals += st.AdapterArrivals - base[i].AdapterArrivals
			inFlight += st.AdapterArrivalsInFlight - base[i].AdapterArrivalsInFlight
			loads += st.LoRALoads - base[i].LoRALoads
		}
		if all != clients*perClient {
			t.Fatalf("%s: the engines saw %d adapter requests, want %d", policy, all, clients*perClient)
		}
		// The explain API shows the adapter term: now that the run is
		// over no adapter is in flight, and each engine has a slot. It is
		// shown in seconds, at the reference prefill rate.
		body := strings.Replace(chatBody(false, "explain"), `"model":"sim-model"`, `"model":"a1"`, 1)
		for _, e := range engines {
			waitIdle(t, e.Addr())
			if c := explainFor(t, body, e.Addr()); c.Adapter != "free_slot" || c.AdapterCost != 0.4*routing.DefaultAdapterWeight/routing.DefaultPrefillRate {
				t.Errorf("%s: explained adapter term of %s: %q costing %v, want free_slot", policy, e.Addr(), c.Adapter, c.AdapterCost)
			}
		}
		return float64(inFlight) / float64(arrivals), loads
	}
	llm, llmLoads := run("")
	leastConn, lcLoads := run("lb_policy least_conn")
	t.Logf("adapter requests landing where their adapter was in flight: llm %.1f%% (%d adapter loads), least_conn %.1f%% (%d loads)",
		100*llm, llmLoads, 100*leastConn, lcLoads)
	if llm < 0.90 {
		t.Errorf("llm: %.1f%% of adapter requests landed where their adapter was in flight, want >= 90%%", 100*llm)
	}
}
