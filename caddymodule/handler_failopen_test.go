package caddymodule

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestAdmissionMetricsOutage: an engine whose /metrics errors, hangs or
// returns garbage from the start fails the startup self-check
// (llmgw_observer_degraded), turns stale after stale_after failed polls
// (llmgw_engine_state_stale_total), and its requests are admitted anyway —
// fail-open, counted in llmgw_admission_fail_open_total — even though the
// engine is busier than max_inflight. With fail_closed they get 503 at once.
func TestAdmissionMetricsOutage(t *testing.T) {
	const outageApp = "\t\tstale_after 3\n\t\tpoll_timeout 300ms\n"
	for _, fault := range []string{"error", "hang", "garbage"} {
		t.Run(fault, func(t *testing.T) {
			e := slowEngine(t)
			e.SetFaults(vllmsim.Faults{Metrics: fault})
			occupy(t, e, 1) // at max_inflight: would park if the gauges were known
			// A config without the engine first, for the counters'
			// baseline, and a fleet that has forgotten every engine: it
			// keeps those a config no longer lists until idle_ttl, and the
			// kernel may give this engine the port of an earlier one,
			// whose history the checks below would then read (a run saw
			// "degraded false" so, that engine's self-check long done).
			gateway{respond: "reset"}.load(t)
			resetGateway(t)
			staleBefore := metricValue(t, "llmgw_engine_state_stale_total")
			// Scrapes time out at 300ms (the interval is 50ms): a hanging
			// /metrics turns stale within about a second, and once the
			// outage ends a loaded machine does not time three in a row out,
			// which would fail the last request closed instead of parking it.
			gateway{
				engines:   noKVEngines(e),
				appExtra:  outageApp,
				admission: "\t\tmax_inflight 1\n\t\tmax_park 30s\n",
			}.load(t)
			testwait.For(t, 10*time.Second, "engine stale", func() bool {
				r := getEngineReport(t, e.Addr())
				return r.Stale && !r.Known && r.Failures >= 3
			})
			r := getEngineReport(t, e.Addr())
			if !r.Degraded || r.LastError == "" {
				t.Errorf("engine report: degraded %v, last error %q", r.Degraded, r.LastError)
			}
			if v := metricValue(t, "llmgw_observer_degraded"); v < 1 {
				t.Errorf("llmgw_observer_degraded = %v", v)
			}
			if v := metricValue(t, "llmgw_engine_state_stale_total"); v <= staleBefore {
				t.Errorf("llmgw_engine_state_stale_total %v -> %v", staleBefore, v)
			}
			if v := metricValue(t, "llmgw_endpoint_metrics_stale", `replica="`+e.Addr()+`"`); v != 1 {
				t.Errorf("llmgw_endpoint_metrics_stale = %v", v)
			}

			failOpen := metricValue(t, "llmgw_admission_fail_open_total")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := range 3 {
				res := waitReply(t, sendAsync(ctx, "", chatBody(false, "fail open "+strconv.Itoa(i)), nil), 30*time.Second)
				if res.status != http.StatusOK {
					t.Fatalf("request %d with metrics %q: %d %v (reused connection %v) %s", i, fault, res.status, res.err, res.reused, res.body)
				}
			}
			if v := metricValue(t, "llmgw_admission_fail_open_total"); v != failOpen+3 {
				t.Errorf("llmgw_admission_fail_open_total %v -> %v, want +3", failOpen, v)
			}

			gateway{
				engines:   noKVEngines(e),
				appExtra:  outageApp,
				admission: "\t\tmax_inflight 1\n\t\tmax_park 30s\n\t\tfail_closed\n",
			}.load(t)
			start := time.Now()
			res := waitReply(t, sendAsync(ctx, "", chatBody(false, "fail closed"), nil), 30*time.Second)
			if res.status != http.StatusServiceUnavailable {
				t.Fatalf("fail_closed: %d %v (reused connection %v) %s", res.status, res.err, res.reused, res.body)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("fail_closed answered after %v; want at once", took)
			}
			if ra, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || ra < 1 {
				t.Errorf("Retry-After %q", res.header.Get("Retry-After"))
			}
			openAIError(t, res.body)

			// The outage ends: the engine is known again, and at its limit
			// the next request parks instead of failing open.
			e.SetFaults(vllmsim.Faults{})
			testwait.For(t, 10*time.Second, "engine recovered", func() bool {
				r := getEngineReport(t, e.Addr())
				return r.Known && !r.Stale && !r.Degraded
			})
			ch := sendAsync(ctx, "", chatBody(false, "after the outage"), nil)
			waitQueueDepth(t, "normal", 1)
			cancel()
			<-ch
			waitQueueDepth(t, "", 0)
		})
	}
}
