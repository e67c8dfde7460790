package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestPolicyCacheKey: with cache_key_header, 1,000 requests of 50 sessions
// each land on their session's replica; removing one replica from the
// config (a reload) moves only the sessions that lived on it.
func TestPolicyCacheKey(t *testing.T) {
	engines := startEngines(t, 4, vllmsim.Config{TimeScale: 1000})
	g := gateway{patient: true, engines: kvEngines(engines...), policy: "\t\t\tcache_key_header X-Session-ID\n\t\t\tdebug_headers\n"}
	g.load(t)
	const sessions, perSession = 50, 20
	key := func(i int) string { return fmt.Sprintf("session-%03d", i%sessions) }
	rs := parallel(sessions*perSession, 8, func(i int) reply {
		return send(context.Background(), "", chat{user: fmt.Sprintf("turn %d of %s", i/sessions, key(i)), maxTokens: 1}.body(), map[string]string{"X-Session-ID": key(i)})
	})
	home := map[string]string{}
	perEngine := map[string]int{}
	for i, r := range rs {
		k := key(i)
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d: status %d, err %v, body %.200s", i, r.status, r.err, r.body)
		}
		if r.tier != "cache_key" {
			t.Fatalf("request %d: tier %q, want cache_key", i, r.tier)
		}
		if h, ok := home[k]; ok && h != r.upstream {
			t.Fatalf("%s went to %s and to %s", k, h, r.upstream)
		}
		if _, ok := home[k]; !ok {
			perEngine[r.upstream]++
		}
		home[k] = r.upstream
	}
	if len(perEngine) != len(engines) {
		t.Errorf("sessions per engine %v: some replica got none", perEngine)
	}
	t.Logf("sessions per engine: %v", perEngine)

	// Remove engine 1 (from the llm app and from the upstreams).
	gone := engines[1].Addr()
	g.engines = kvEngines(engines[0], engines[2], engines[3])
	g.load(t)
	moved := 0
	for i := range sessions {
		k := key(i)
		r := mustSend(t, "", chat{user: "after the reload " + k, maxTokens: 1}.body(), map[string]string{"X-Session-ID": k})
		switch {
		case r.upstream == gone:
			t.Errorf("%s went to the removed replica", k)
		case home[k] == gone:
			moved++
		case r.upstream != home[k]:
			t.Errorf("%s moved from %s to %s though its replica stayed", k, home[k], r.upstream)
		}
	}
	if moved != perEngine[gone] {
		t.Errorf("%d sessions moved, want the removed replica's %d", moved, perEngine[gone])
	}
}
