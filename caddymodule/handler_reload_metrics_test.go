package caddymodule

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestAdmissionReloadUnderLoad: a config reload while requests are parked
// loses none of them — they stay in the queue, are admitted by the new
// generation's kicks and complete with 200 (streams with their tokens) —
// and the engines keep their state (gauges known at once, drain rate, no
// re-scrape needed) and the counters their values.
func TestAdmissionReloadUnderLoad(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 30s\n\t\theartbeat 50ms\n").load(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 3 {
		if r := waitReply(t, sendAsync(ctx, "", chatBody(false, "before the reload"), nil), 30*time.Second); r.status != http.StatusOK {
			t.Fatalf("warm-up: %d %s", r.status, r.body)
		}
	}
	occ := occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)

	plain := []<-chan reply{sendAsync(ctx, "", chatBody(false, "parked 1"), nil), sendAsync(ctx, "", chatBody(false, "parked 2"), map[string]string{"X-Priority": "low"})}
	streams := []*sseStream{openStream(t, ctx, chat{user: "parked stream 1", maxTokens: 4, stream: true, usage: true}.body(), nil), openStream(t, ctx, chat{user: "parked stream 2", maxTokens: 4, stream: true, usage: true}.body(), nil)}
	for _, s := range streams {
		if l, _ := s.next(t, 10*time.Second); l != ": keep-alive" {
			t.Fatalf("parked stream: %q", l)
		}
	}
	waitQueueDepth(t, "", 4)
	before := getEngineReport(t, e.Addr())
	admitted := metricValue(t, "llmgw_admission_admitted_total")
	if before.DrainRate <= 0 || admitted < 3 {
		t.Fatalf("before the reload: drain rate %v, admitted %v", before.DrainRate, admitted)
	}

	parkGateway(e, "\t\tmax_park 40s\n\t\theartbeat 80ms\n\t\tqueue_size 100\n").load(t)
	after := getEngineReport(t, e.Addr())
	if !after.Known || after.ScrapedAt.Before(before.ScrapedAt) || after.DrainRate < before.DrainRate/2 {
		t.Errorf("engine state after the reload: known %v, scraped %v (was %v), drain rate %v (was %v)",
			after.Known, after.ScrapedAt, before.ScrapedAt, after.DrainRate, before.DrainRate)
	}
	if d := queueDepth(t, ""); d != 4 {
		t.Fatalf("%d parked after the reload, want 4", d)
	}
	if v := metricValue(t, "llmgw_admission_admitted_total"); v != admitted {
		t.Errorf("llmgw_admission_admitted_total %v -> %v across the reload", admitted, v)
	}
	plain = append(plain, sendAsync(ctx, "", chatBody(false, "parked after the reload"), nil))
	waitQueueDepth(t, "", 5)

	occ[0].release()
	for i, ch := range plain {
		if r := waitReply(t, ch, 60*time.Second); r.status != http.StatusOK {
			t.Errorf("parked request %d: %d %v %s", i, r.status, r.err, r.body)
		}
	}
	for i, s := range streams {
		rest := strings.Join(s.rest(t, 60*time.Second), "\n")
		if !strings.Contains(rest, `"content"`) || !strings.HasSuffix(rest, "data: [DONE]\n") || strings.Contains(rest, "event: error") {
			t.Errorf("parked stream %d after the reload: %q", i, rest)
		}
	}
	if v := metricValue(t, "llmgw_admission_admitted_total"); v != admitted+5 {
		t.Errorf("llmgw_admission_admitted_total = %v, want %v", v, admitted+5)
	}
	if n := strings.Count(scrapeMetrics(t), "# TYPE llmgw_admission_admitted_total "); n != 1 {
		t.Errorf("llmgw_admission_admitted_total described %d times", n)
	}
}

// TestAdmissionMetricNames: after traffic that parks, admits, rejects and
// streams, every metric the admission design names is exposed with its
// labels, once.
func TestAdmissionMetricNames(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 200ms\n").load(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if r := waitReply(t, sendAsync(ctx, "", chat{user: "metrics", maxTokens: 4, stream: true, usage: true}.body(), nil), 30*time.Second); r.status != http.StatusOK {
		t.Fatalf("stream: %d %s", r.status, r.body)
	}
	occ := occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)
	if r := waitReply(t, sendAsync(ctx, "", chatBody(false, "rejected"), map[string]string{"X-Priority": "low"}), 30*time.Second); r.status != http.StatusServiceUnavailable {
		t.Fatalf("want a max_park rejection, got %d", r.status)
	}
	ch := sendAsync(ctx, "", chatBody(false, "parked then admitted"), nil)
	waitQueueDepth(t, "normal", 1)
	occ[0].release()
	if r := waitReply(t, ch, 30*time.Second); r.status != http.StatusOK {
		t.Fatalf("parked: %d %s", r.status, r.body)
	}

	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(scrapeMetrics(t)))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	endpoint := []string{"pool", "replica"}
	for name, labels := range map[string][]string{
		"llmgw_admission_admitted_total":      {"band", "order"},
		"llmgw_admission_parked_total":        {"band"},
		"llmgw_admission_park_seconds":        {"band"},
		"llmgw_admission_rejected_total":      {"band", "reason"},
		"llmgw_admission_queue_depth":         {"band"},
		"llmgw_admission_fail_open_total":     nil,
		"llmgw_endpoint_inflight":             endpoint,
		"llmgw_endpoint_waiting":              endpoint,
		"llmgw_endpoint_running":              endpoint,
		"llmgw_endpoint_kv_cache_usage":       endpoint,
		"llmgw_endpoint_drain_rate":           endpoint,
		"llmgw_endpoint_metrics_stale":        endpoint,
		"llmgw_endpoint_asleep":               endpoint,
		"llmgw_pool_saturation":               {"model"},
		"llmgw_engine_state_stale_total":      nil,
		"llmgw_observer_degraded":             nil,
		"llmgw_ttft_seconds":                  {"engine", "model"},
		"llmgw_ttft_prediction_error_seconds": {"engine"},
		"llmgw_itl_seconds":                   {"engine", "model"},
		"llmgw_tokens_total":                  {"kind"},
	} {
		f, ok := fams[name]
		if !ok || len(f.GetMetric()) == 0 {
			t.Errorf("%s: missing", name)
			continue
		}
		if got := labelNames(f.GetMetric()[0]); !slices.Equal(got, labels) {
			t.Errorf("%s: labels %v, want %v", name, got, labels)
		}
	}
	if v := metricValue(t, "llmgw_endpoint_running", `replica="`+e.Addr()+`"`); v < 0 {
		t.Errorf("llmgw_endpoint_running = %v", v)
	}
	if v := metricValue(t, "llmgw_pool_saturation", `model="sim-model"`); v < 0 || v > 1 {
		t.Errorf("llmgw_pool_saturation{sim-model} = %v", v)
	}
}

func labelNames(m *dto.Metric) []string {
	var out []string
	for _, l := range m.GetLabel() {
		out = append(out, l.GetName())
	}
	slices.Sort(out)
	return out
}

// TestAdmissionAdminShapes: GET /llm/engines reports per engine its dial,
// pool, gauges and their age, staleness, local in-flight count, drain
// rate and served models; GET /llm/queue reports per pool and band the depth and the oldest
// wait.
func TestAdmissionAdminShapes(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 30s\n\t\tmax_inflight 2\n").load(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// One long request through the gateway (local in-flight), one direct
	// occupant: the engine is at max_inflight 2 and the next request parks.
	long := openStream(t, ctx, `{"model":"sim-model","stream":true,"max_tokens":20000,"messages":[{"role":"user","content":"long"}]}`, nil)
	defer long.res.Body.Close()
	occupy(t, e, 1)
	waitBusy(t, e.Addr(), 2)
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	parked := sendAsync(pctx, "", chatBody(false, "parked"), map[string]string{"X-Priority": "high"})
	waitQueueDepth(t, "high", 1)
	// The oldest wait is checked below to be reported in seconds.
	testwait.For(t, 10*time.Second, "the parked request's wait past 100ms", func() bool {
		return getQueue(t).Pools["default"]["high"].OldestWait >= 0.1
	})

	var engines []map[string]any
	if code := adminJSON(t, http.MethodGet, "/llm/engines", "", &engines); code != http.StatusOK {
		t.Fatalf("/llm/engines: %d", code)
	}
	var eng map[string]any
	for _, m := range engines {
		if m["dial"] == e.Addr() {
			eng = m
		}
	}
	if eng == nil {
		t.Fatalf("engine %s missing from %v", e.Addr(), engines)
	}
	for key, kind := range map[string]string{
		"dial": "string", "pool": "string", "scraped_at": "string",
		"running": "number", "waiting": "number", "kv_cache_usage": "number", "gauges_age_seconds": "number",
		"local_inflight": "number", "dispatched_since_scrape": "number", "drain_rate": "number", "max_inflight": "number",
		"stale": "bool", "gauges_known": "bool", "degraded": "bool",
	} {
		if got := jsonKind(eng[key]); got != kind {
			t.Errorf("/llm/engines %q: %s (%v), want %s", key, got, eng[key], kind)
		}
	}
	if eng["pool"] != "default" || eng["stale"] != false || eng["gauges_known"] != true ||
		eng["local_inflight"] != 1.0 || eng["running"].(float64)+eng["waiting"].(float64) != 2 {
		t.Errorf("/llm/engines values: %v", eng)
	}
	if age := eng["gauges_age_seconds"].(float64); age < 0 || age > 5 {
		t.Errorf("gauges age %v s with a 50ms poll interval", age)
	}
	// The engine's /v1/models, learned at its first scrape: the
	// simulator's one model, with its context length; no LoRA.
	if models, ok := eng["models"].([]any); !ok || len(models) != 1 {
		t.Errorf("/llm/engines models: %v", eng["models"])
	} else if m, _ := models[0].(map[string]any); m["id"] != "sim-model" || m["max_model_len"] != 32768.0 || m["parent"] != nil {
		t.Errorf("/llm/engines model: %v", m)
	}
	if eng["models_source"] != "discovered" || eng["models_error"] != nil || eng["lora"] != nil {
		t.Errorf("/llm/engines models_source %v, models_error %v, lora %v", eng["models_source"], eng["models_error"], eng["lora"])
	}

	var q map[string]map[string]map[string]map[string]any
	if code := adminJSON(t, http.MethodGet, "/llm/queue", "", &q); code != http.StatusOK {
		t.Fatalf("/llm/queue: %d", code)
	}
	bands := q["pools"]["default"]
	for _, b := range []string{"high", "normal", "low"} {
		for _, key := range []string{"depth", "oldest_wait_seconds", "admitted", "parked"} {
			if jsonKind(bands[b][key]) != "number" {
				t.Errorf("/llm/queue %s.%s = %v", b, key, bands[b][key])
			}
		}
	}
	if bands["high"]["depth"] != 1.0 || bands["normal"]["depth"] != 0.0 {
		t.Errorf("/llm/queue depths: %v", bands)
	}
	if w := bands["high"]["oldest_wait_seconds"].(float64); w < 0.1 || w > 30 {
		t.Errorf("oldest wait %v s, parked for >= 100ms", w)
	}
	if w := bands["normal"]["oldest_wait_seconds"].(float64); w != 0 {
		t.Errorf("empty band's oldest wait %v", w)
	}
	pcancel()
	<-parked
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "missing"
	}
	return "other"
}
