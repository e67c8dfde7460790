package caddymodule

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestSpeculativeEntriesMetric: a request the policy routes with its
// tokens known to an engine with live KV events inserts speculative
// entries for its prompt there, which the engine's BlockStored then
// confirms, both counted in llmgw_kv_speculative_blocks_total; with
// speculative_ttl 0 none are inserted.
func TestSpeculativeEntriesMetric(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{})
	spec := func(outcome string) float64 {
		return metricValue(t, "llmgw_kv_speculative_blocks_total", `outcome="`+outcome+`"`)
	}
	for _, tc := range []struct {
		name, app string
		on        bool
	}{
		{"off", "\t\tspeculative_ttl 0\n", false},
		{"default", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gateway{patient: true, engines: kvEngines(engines...), appExtra: tc.app}.load(t)
			waitKV(t, engines...)
			inserted, confirmed := spec("inserted"), spec("confirmed")
			r := send(context.Background(), "", chat{user: words("spec-"+tc.name, 400), maxTokens: 1}.body(), nil)
			if r.err != nil || r.status != http.StatusOK {
				t.Fatalf("status %d, err %v", r.status, r.err)
			}
			if !tc.on {
				if n := spec("inserted") - inserted; n != 0 {
					t.Fatalf("%v entries inserted with speculative_ttl 0", n)
				}
				return
			}
			if n := spec("inserted") - inserted; n < 20 {
				t.Fatalf("%v entries inserted for a 400-token prompt, want its ~25 blocks", n)
			}
			testwait.For(t, 10*time.Second, "the engine's events confirm the entries", func() bool {
				return spec("confirmed")-confirmed >= 20
			})
		})
	}
}
