package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// dynamicLLM is reverse_proxy's `dynamic llm` line for the gateway helper.
const dynamicLLM = "\t\tdynamic llm\n"

// spread sends n requests to url ("" = the gateway), each with its own
// cache key so that rendezvous hashing spreads them over the pool, and
// returns how many each upstream served.
func spread(t *testing.T, url string, n int) map[string]int {
	t.Helper()
	served := map[string]int{}
	for i := range n {
		r := mustSend(t, url, chat{user: fmt.Sprintf("spread %d", i), maxTokens: 1}.body(),
			map[string]string{"X-Session": fmt.Sprintf("s%d", i)})
		if r.upstream == "" {
			t.Fatal("no X-LLM-Upstream header")
		}
		served[r.upstream]++
	}
	return served
}

// explainDials are the engines /llm/explain considers for pool: the ones
// llm_admission of that pool gates on (fleet.PoolDials), sorted.
func explainDials(t *testing.T, pool string) []string {
	t.Helper()
	var ex struct {
		Candidates []struct{ Dial string }
	}
	if code := adminJSON(t, http.MethodPost, "/llm/explain?pool="+pool, chat{user: "which engines?"}.body(), &ex); code != http.StatusOK {
		t.Fatalf("explain pool %s: status %d", pool, code)
	}
	var dials []string
	for _, c := range ex.Candidates {
		dials = append(dials, c.Dial)
	}
	slices.Sort(dials)
	return dials
}

// sortedAddrs are the engines' dial addresses, sorted.
func sortedAddrs(es ...*vllmsim.Engine) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Addr())
	}
	slices.Sort(out)
	return out
}

const cacheKeyPolicy = "\t\t\tdebug_headers\n\t\t\tcache_key_header X-Session\n"

// TestDynamicLLMListsEachEngineOnce: engines listed only in the llm app
// serve reverse_proxy through `dynamic llm`, behind llm_admission and
// lb_policy llm; they stay configured engines (not discovered ones), and
// admission knows them before the first request.
func TestDynamicLLMListsEachEngineOnce(t *testing.T) {
	t.Cleanup(func() { resetGateway(t) })
	engines := startEngines(t, 3, vllmsim.Config{})
	gateway{engines: kvEngines(engines...), dynamic: dynamicLLM, policy: cacheKeyPolicy, patient: true}.load(t)

	if got, want := explainDials(t, "default"), sortedAddrs(engines...); !slices.Equal(got, want) {
		t.Errorf("before the first request, the default pool's engines are %v, want %v", got, want)
	}
	served := spread(t, "", 30)
	for _, e := range engines {
		if served[e.Addr()] == 0 {
			t.Errorf("%s served none of the requests: %v", e.Addr(), served)
		}
		if r := getEngineReport(t, e.Addr()); !r.Static {
			t.Errorf("%s is not a configured engine: %+v", e.Addr(), r)
		}
	}
	if len(served) != len(engines) {
		t.Errorf("requests went to %v, want only the 3 engines", served)
	}
}

// poolsGateway routes /a/* to pool a and /b/* to pool b, each through
// `dynamic llm <pool>` with its own admission and policy.
func poolsGateway(a, b []*vllmsim.Engine) gateway {
	var engines []gatewayEngine
	for _, e := range a {
		engines = append(engines, gatewayEngine{dial: e.Addr(), extra: "\t\t\tpool a\n"})
	}
	for _, e := range b {
		engines = append(engines, gatewayEngine{dial: e.Addr(), extra: "\t\t\tpool b\n"})
	}
	var routes strings.Builder
	for _, p := range []string{"a", "b"} {
		fmt.Fprintf(&routes, "\thandle_path /%s/* {\n\t\tllm_admission {\n\t\t\tpool %s\n\t\t}\n", p, p)
		fmt.Fprintf(&routes, "\t\treverse_proxy {\n\t\t\tdynamic llm %s\n\t\t\tlb_policy llm {\n\t\t\t\tpool %s\n%s\t\t\t}\n\t\t}\n\t}\n",
			p, p, strings.ReplaceAll(cacheKeyPolicy, "\t\t\t", "\t\t\t\t"))
	}
	return gateway{engines: engines, siteExtra: routes.String(), respond: "no such pool", patient: true}
}

// TestDynamicLLMPools: `dynamic llm <pool>` hands each route its pool's
// engines only, and admission of each pool knows them from the start.
func TestDynamicLLMPools(t *testing.T) {
	t.Cleanup(func() { resetGateway(t) })
	engines := startEngines(t, 3, vllmsim.Config{})
	a, b := engines[:2], engines[2:]
	poolsGateway(a, b).load(t)

	if got, want := explainDials(t, "a"), sortedAddrs(a...); !slices.Equal(got, want) {
		t.Errorf("pool a's engines before any request: %v, want %v", got, want)
	}
	if got, want := explainDials(t, "b"), sortedAddrs(b...); !slices.Equal(got, want) {
		t.Errorf("pool b's engines before any request: %v, want %v", got, want)
	}
	base := "http://" + gatewayAddr
	servedA := spread(t, base+"/a/v1/chat/completions", 20)
	servedB := spread(t, base+"/b/v1/chat/completions", 10)
	if len(servedA) != 2 || servedA[a[0].Addr()] == 0 || servedA[a[1].Addr()] == 0 {
		t.Errorf("pool a's requests went to %v, want both of %v", servedA, sortedAddrs(a...))
	}
	if len(servedB) != 1 || servedB[b[0].Addr()] != 10 {
		t.Errorf("pool b's requests went to %v, want all on %s", servedB, b[0].Addr())
	}
}

// TestDynamicLLMReload: a reload that adds an engine to the llm app makes
// it receive requests; one that removes an engine stops sending to it.
func TestDynamicLLMReload(t *testing.T) {
	t.Cleanup(func() { resetGateway(t) })
	engines := startEngines(t, 3, vllmsim.Config{})
	g := gateway{engines: noKVEngines(engines[:2]...), dynamic: dynamicLLM, policy: cacheKeyPolicy, patient: true}
	g.load(t)
	if served := spread(t, "", 10); served[engines[2].Addr()] != 0 {
		t.Fatalf("the engine not configured yet served requests: %v", served)
	}

	g.engines = noKVEngines(engines...)
	g.load(t)
	i := 0
	testwait.For(t, 15*time.Second, "the added engine to serve a request", func() bool {
		i++
		r := mustSend(t, "", chat{user: "after adding", maxTokens: 1}.body(), map[string]string{"X-Session": fmt.Sprintf("add%d", i)})
		return r.upstream == engines[2].Addr()
	})

	removed := engines[0]
	g.engines = noKVEngines(engines[1:]...)
	g.load(t)
	before := removed.Stats().RequestsServed
	served := spread(t, "", 20)
	if served[removed.Addr()] != 0 || removed.Stats().RequestsServed != before {
		t.Errorf("the removed engine still got requests: %v", served)
	}
	if served[engines[1].Addr()] == 0 || served[engines[2].Addr()] == 0 {
		t.Errorf("requests after the removal went to %v, want both remaining engines", served)
	}
	if got, want := explainDials(t, "default"), sortedAddrs(engines[1:]...); !slices.Equal(got, want) {
		t.Errorf("after the removal the default pool's engines are %v, want %v", got, want)
	}
}

// TestDynamicLLMProvisionErrors: `dynamic llm` without engines to hand out
// is refused with a clear error, and the running config keeps serving.
func TestDynamicLLMProvisionErrors(t *testing.T) {
	t.Cleanup(func() { resetGateway(t) })
	engines := startEngines(t, 1, vllmsim.Config{})
	g := gateway{engines: noKVEngines(engines...), dynamic: dynamicLLM, policy: cacheKeyPolicy}
	g.load(t)
	cases := []struct {
		name string
		g    gateway
		want string
	}{
		{"no engines", gateway{dynamic: dynamicLLM}, "dynamic llm: the llm app has no engines"},
		{"unknown pool", gateway{engines: noKVEngines(engines...), dynamic: "\t\tdynamic llm gpu\n"},
			"give engines `pool gpu`"},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		status, body, err := postLoad(ctx, c.g.caddyfile())
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if status != http.StatusBadRequest || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: status %d, body %s; want 400 with %q", c.name, status, body, c.want)
		}
	}
	if r := mustSend(t, "", chat{user: "still here?", maxTokens: 1}.body(), nil); r.upstream != engines[0].Addr() {
		t.Errorf("after the refused loads the request went to %q", r.upstream)
	}
}

// TestDynamicLLMPoolMismatchWarns: a policy fed by `dynamic llm` of another
// pool says so, once; the same pool, or every engine, is quiet.
func TestDynamicLLMPoolMismatchWarns(t *testing.T) {
	f := testFleet()
	defer f.Close()
	core, logs := observer.New(zap.WarnLevel)
	p := &Policy{Pool: "a"}
	p.setup(zap.New(core), f)
	for _, src := range []*EngineUpstreams{{}, {Pool: "a"}, {Pool: "b"}, {Pool: "b"}} {
		src.dials = deadDials
		r, _, cancel := testRequest(t, chatBody(false, "which pool?"))
		ups, err := src.GetUpstreams(r)
		if err != nil || len(ups) != len(deadDials) {
			t.Fatalf("GetUpstreams: %d upstreams, %v", len(ups), err)
		}
		for _, u := range ups {
			u.Host = new(reverseproxy.Host) // as reverse_proxy provisions them
		}
		p.Select(ups, r, nil)
		cancel()
	}
	warned := logs.FilterMessageSnippet("name different pools").All()
	if len(warned) != 1 || warned[0].ContextMap()["dynamic_pool"] != "b" {
		t.Errorf("warnings: %+v, want one naming pool b", logs.All())
	}
}

// TestDynamicLLMUpstreamsAreFresh: every call hands out new Upstream
// values in config order (reverse_proxy writes to them as it provisions
// them), and a pool filter keeps only its engines.
func TestDynamicLLMUpstreamsAreFresh(t *testing.T) {
	engines := []*fleet.EngineConfig{{Dial: "10.0.0.1:8000"}, {Dial: "10.0.0.2:8000", Pool: "big"}, nil, {Dial: "10.0.0.3:8000", Pool: "default"}}
	for pool, want := range map[string][]string{
		"":        {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"},
		"default": {"10.0.0.1:8000", "10.0.0.3:8000"},
		"big":     {"10.0.0.2:8000"},
		"none":    nil,
	} {
		u := &EngineUpstreams{Pool: pool, dials: poolEngines(engines, pool)}
		first, _ := u.GetUpstreams(nil)
		second, _ := u.GetUpstreams(nil)
		var got []string
		for i, up := range first {
			got = append(got, up.Dial)
			if up == second[i] {
				t.Errorf("pool %q: %s handed out twice", pool, up.Dial)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("pool %q: %v, want %v", pool, got, want)
		}
	}
}
