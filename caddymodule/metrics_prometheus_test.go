package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/prombin"
)

// noDataExpected lists dashboard queries (by "panel title / refId") that
// may return no data here, each with why: conditions too costly to bring
// about in this test. Keep it tiny; every other query must return data.
var noDataExpected = map[string]string{}

// TestPrometheusDashboardQueries runs a real gateway (two simulated
// engines, KV events, a local tokenizer, a metrics listener) and a real
// Prometheus (Debian's) that scrapes it every 250ms and evaluates
// deploy/prometheus/llmgw-rules.yaml. After traffic that exercises every
// row of the dashboard (streams with usage and cache hits, a parked and
// rejected request, an upstream 500, a tokenizer that disagrees with the
// engines, a KV subscription cut), it checks through Prometheus' HTTP API:
//
//   - every dashboard query, with $instance and $model set to the scraped
//     gateway and its model, returns data, and the instance and model
//     variables offer those values;
//   - every llmgw series selector of every alert rule returns data;
//   - every rule evaluates without error;
//   - the alerts this traffic must raise are pending or firing with the
//     right labels (KV subscription down for the cut engine only, tokenizer
//     mismatches and fallback), and alerts it must not raise are not.
//
// A renamed metric or label, or a join on a label one side lacks, fails it.
func TestPrometheusDashboardQueries(t *testing.T) {
	bin := prombin.Require(t)
	start := time.Now()
	// No engines left over from earlier tests of this process: dead ones
	// would be stale and degraded. The first load starts Caddy if this
	// test runs alone; resetGateway then waits for the fleet to forget.
	newTester(t, gateway{appExtra: "\t\tidle_ttl 1ms\n", respond: "reset"}.caddyfile())
	resetGateway(t)
	engines := tokenizerEngines(t, 2, chatmlDir)
	// Engine 1's KV events go through a proxy the test cuts later, while
	// the engine itself keeps serving.
	kvProxy := newTCPProxy(t, strings.TrimPrefix(engines[1].KVEndpoint(), "tcp://"))
	ges := kvEngines(engines...)
	ges[1].kv = kvProxy.endpoint()
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", mustFreePort(t, "127.0.0.1"))
	g := gateway{
		engines: ges,
		policy:  "\t\t\tdebug_headers\n",
		// A loaded machine must not time scrapes out (stale gauges fail
		// open: the request meant to park would be admitted) nor /tokenize.
		patient: true,
		// The other model's tokenizer: every sampled check mismatches and
		// the model falls back after 3.
		appExtra: fmt.Sprintf("\t\ttokenizer sim-model %s\n\t\ttokenizer_check_sample 1\n\t\ttokenizer_mismatch_limit 3\n", absDir(t, chatmlOtherDir)),
		// One request per engine, so a direct occupant fills it and a
		// gateway request parks, and is rejected after 300ms.
		admission: "\t\tmax_inflight 1\n\t\tmax_park 300ms\n",
	}
	// The metrics handler on its own listener, as deployments run it.
	newTester(t, g.caddyfile()+fmt.Sprintf("\nhttp://%s {\n\tmetrics\n}\n", metricsAddr))
	t.Cleanup(func() { resetGateway(t) })
	waitKV(t, engines...)

	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, bin.Prometheus, metricsAddr, rules)
	prom.waitScrapedAfter(t, time.Now())

	// Two waves with a scrape between them: the first creates the
	// label-keyed series (they appear with their first value), the second
	// moves them, so rates and quantiles have something to show.
	sys := longText(80)
	for wave := range 2 {
		driveDashboardTraffic(t, engines, sys, wave)
		prom.waitScrapedAfter(t, time.Now())
	}
	// Cut engine 1's KV subscription: the mirror records a "disconnect"
	// reset, which LLMGWKVSubscriptionDown and the derived panel read.
	kvProxy.close()
	testwait.For(t, 10*time.Second, "the KV disconnect in the metrics", func() bool {
		return metricValue(t, "llmgw_kv_resyncs_total", `reason="disconnect"`, `engine="`+engines[1].Addr()+`"`) >= 1
	})
	// The queries read the state of this scrape: on a loaded machine a
	// later scrape may time out, and its staleness markers would empty
	// every instant selector queried after it.
	prom.settle(t, metricsAddr)
	prom.waitRulesEvaluatedAfter(t, time.Now())

	instance, model := metricsAddr, "sim-model"
	subst := strings.NewReplacer("$instance", instance, "$model", model, "$__rate_interval", "1m")

	queries, vars := loadDashboard(t)
	for _, v := range vars {
		if v.Type != "query" {
			continue
		}
		metric, label, ok := parseLabelValues(v.queryText())
		if !ok {
			t.Errorf("variable %s: not label_values(selector, label): %q", v.Name, v.queryText())
			continue
		}
		want := map[string]string{"instance": instance, "model": model}[v.Name]
		got := prom.labelValues(t, subst.Replace(metric), label)
		if !slices.Contains(got, want) {
			t.Errorf("variable %s: %s offers %q, want %q among them", v.Name, v.queryText(), got, want)
		}
	}
	var empty, zero []string
	for _, q := range queries {
		expr := subst.Replace(q.expr)
		if strings.Contains(expr, "$") {
			t.Errorf("%s: a template variable the test does not know: %s", q.where, expr)
			continue
		}
		res := prom.query(t, expr)
		switch {
		case len(res) == 0 && noDataExpected[q.where] != "":
			t.Logf("%s: no data, as expected (%s)", q.where, noDataExpected[q.where])
		case len(res) == 0:
			empty = append(empty, q.where+": "+expr)
		case !anyNonZero(res):
			zero = append(zero, q.where)
		}
	}
	for _, e := range empty {
		t.Errorf("dashboard query returned no data: %s", e)
	}
	for where := range noDataExpected {
		if !slices.ContainsFunc(queries, func(q dashQuery) bool { return q.where == where }) {
			t.Errorf("noDataExpected lists %q, which is no dashboard query", where)
		}
	}
	// Data but all zero or NaN: a gauge at rest (queue depth, stale,
	// breaker) or a counter this traffic does not move. Logged, not
	// failed: the series exist with the right names and labels.
	t.Logf("%d dashboard queries, %d with data but only zeros/NaN now: %v", len(queries), len(zero), zero)

	for _, r := range loadRules(t) {
		for _, s := range selectors(r.Expr) {
			if len(prom.query(t, s.text)) == 0 {
				t.Errorf("alert %s: selector %s returns no data", r.Alert, s.text)
			}
		}
	}
	prom.checkRulesHealthy(t)

	// The alerts the traffic raised. for: keeps them pending at most.
	raised := []map[string]string{
		{"alertname": "LLMGWKVSubscriptionDown", "engine": engines[1].Addr()},
		{"alertname": "LLMGWTokenizerMismatches", "model": model},
		{"alertname": "LLMGWTokenizerFallback", "model": model},
		// 2 of about 16 normal-band requests rejected, and every engine
		// answered 2 of at most 14 with a 500: all above their 5%.
		{"alertname": "LLMGWRejectionsSustained", "band": "normal", "instance": instance},
		{"alertname": "LLMGWUpstreamErrors", "instance": instance, "engine": engines[0].Addr()},
		{"alertname": "LLMGWUpstreamErrors", "instance": instance, "engine": engines[1].Addr()},
	}
	quiet := []map[string]string{
		{"alertname": "LLMGWKVSubscriptionDown", "engine": engines[0].Addr()},
		{"alertname": "LLMGWMetricsAbsent"},
		{"alertname": "LLMGWObserverDegraded"},
		{"alertname": "LLMGWAllEnginesStale"},
		{"alertname": "LLMGWKVHashMismatch"},
		{"alertname": "LLMGWKVEventsUnapplied"},
		{"alertname": "LLMGWBreakerOpen"},
	}
	var alerts []map[string]string
	for w := newWait(t, 10*time.Second, "the raised alerts").pace(100 * time.Millisecond); ; w.tick(alerts) {
		alerts = prom.alerts(t)
		if !slices.ContainsFunc(raised, func(want map[string]string) bool { return !matchAny(alerts, want) }) {
			break
		}
	}
	t.Logf("active alerts: %v", alerts)
	for _, q := range quiet {
		if matchAny(alerts, q) {
			t.Errorf("alert %v is active; it must not be: %v", q, alerts)
		}
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// driveDashboardTraffic sends what every dashboard row needs: streams with
// usage sharing a long system prompt (TTFT, ITL, tokens, cache hits,
// routing decisions and placements), a non-streaming request, a
// previous_response_id follow-up, a request
// that parks and is rejected after max_park while both engines are full,
// and one the engines answer 500.
func driveDashboardTraffic(t *testing.T, engines []*vllmsim.Engine, sys string, wave int) {
	t.Helper()
	for i := range 4 {
		r := mustSend(t, "", chat{system: sys, user: fmt.Sprintf("wave %d question %d", wave, i), maxTokens: 4, stream: true, usage: true}.body(), nil)
		if !r.complete() {
			t.Fatalf("stream: %+v", r)
		}
	}
	mustSend(t, "", chat{system: sys, user: fmt.Sprintf("wave %d plain", wave), maxTokens: 4}.body(), nil)
	// A Responses answer and its follow-up, pinned to its engine.
	responses := "http://" + gatewayAddr + "/v1/responses"
	first := mustSend(t, responses, responsesBody(fmt.Sprintf("wave %d responses", wave), "", false, nil), nil)
	mustSend(t, responses, responsesBody("and then?", responseIDOf(t, first), true, nil), nil)

	var occ []*occupant
	for _, e := range engines {
		occ = append(occ, occupy(t, e, 1)...)
		waitBusy(t, e.Addr(), 1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r := send(ctx, "", chatBody(false, fmt.Sprintf("wave %d parked", wave)), nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("with both engines full: %d %v %.300s, want 503 after max_park", r.status, r.err, r.body)
	}
	freed := time.Now()
	for _, o := range occ {
		o.release()
	}
	for _, e := range engines {
		waitGauges(t, e.Addr(), "the engine free again", func(r fleet.EngineReport) bool {
			return r.Known && r.ScrapedAt.After(freed) && r.Running+r.Waiting == 0
		})
	}

	// One 500 from each engine in each wave, the other drained so the
	// request cannot go there: the second wave then moves both engines'
	// upstream_error series, whichever way routing would have gone.
	for i, e := range engines {
		other := engines[1-i].Addr()
		if code := adminJSON(t, http.MethodPost, "/llm/engines/"+other+"/drain", "", nil); code != http.StatusOK {
			t.Fatalf("drain %s: %d", other, code)
		}
		e.SetFaults(vllmsim.Faults{Error500: true})
		r := send(ctx, "", chatBody(false, fmt.Sprintf("wave %d fails on %d", wave, i)), nil)
		e.SetFaults(vllmsim.Faults{})
		if code := adminJSON(t, http.MethodPost, "/llm/engines/"+other+"/undrain", "", nil); code != http.StatusOK {
			t.Fatalf("undrain %s: %d", other, code)
		}
		if r.status < 500 || r.upstream != e.Addr() {
			t.Fatalf("with engine %s answering 500 and the other drained: %d from %q %v %.300s", e.Addr(), r.status, r.upstream, r.err, r.body)
		}
	}
}

// prometheusServer is a prometheus process the test started.
type prometheusServer struct {
	base string    // http://127.0.0.1:port
	at   time.Time // when set, the time instant queries are evaluated at
}

// startPrometheus starts Debian's prometheus on a free loopback port with a
// temporary TSDB, scraping target every 500ms and evaluating the rules
// file as often, and stops it when the test ends. The port is probed
// free, not reserved, so a start that loses it is retried on another.
func startPrometheus(t *testing.T, binary, target, rules string) *prometheusServer {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 500ms
  scrape_timeout: 500ms
  evaluation_interval: 250ms
rule_files:
  - %q
scrape_configs:
  - job_name: llmgw
    static_configs:
      - targets: [%q]
`, rules, target)
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		addr := fmt.Sprintf("127.0.0.1:%d", mustFreePort(t, "127.0.0.1"))
		p, exited, out := runPrometheus(t, binary, cfgFile, filepath.Join(dir, fmt.Sprintf("data%d", attempt)), addr)
		if err := p.waitReady(exited); err == nil {
			return p
		} else if attempt == 2 || !strings.Contains(out.String(), "address already in use") {
			t.Fatalf("prometheus did not start: %v\n%s", err, out.String())
		}
	}
}

// runPrometheus starts one prometheus process; exited is closed when it
// ends. The test's cleanup stops it (SIGTERM, then SIGKILL after 10s) and
// shows its output if the test failed.
func runPrometheus(t *testing.T, binary, cfgFile, dataDir, addr string) (*prometheusServer, <-chan struct{}, *syncBuffer) {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(binary,
		"--config.file="+cfgFile,
		"--storage.tsdb.path="+dataDir,
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	return &prometheusServer{base: "http://" + addr}, exited, out
}

// waitReady waits until /-/ready answers 200, or the process exits.
func (p *prometheusServer) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("prometheus exited")
		default:
		}
		if res, err := client.Get(p.base + "/-/ready"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// api GETs an API path and decodes its "data" into v.
func (p *prometheusServer) api(t testing.TB, path string, params url.Values, v any) {
	t.Helper()
	u := p.base + path
	if params != nil {
		u += "?" + params.Encode()
	}
	res, err := client.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	body := readAll(t, res)
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &env); err != nil || env.Status != "success" {
		t.Fatalf("GET %s: %d %s %v %.500s", u, res.StatusCode, env.Error, err, body)
	}
	if err := json.Unmarshal(env.Data, v); err != nil {
		t.Fatalf("GET %s: %v in %.500s", u, err, env.Data)
	}
}

// waitScrapedAfter waits until the target is up and was last scraped
// (the scrape began) after since, so Prometheus holds the state of then,
// and returns when that scrape ended.
func (p *prometheusServer) waitScrapedAfter(t testing.TB, since time.Time) time.Time {
	t.Helper()
	var last string
	for w := newWait(t, 15*time.Second, "a scrape of the gateway").pace(20 * time.Millisecond); ; w.tick(last) {
		var d struct {
			ActiveTargets []struct {
				Health     string    `json:"health"`
				LastScrape time.Time `json:"lastScrape"`
				Duration   float64   `json:"lastScrapeDuration"`
				LastError  string    `json:"lastError"`
			} `json:"activeTargets"`
		}
		p.api(t, "/api/v1/targets", nil, &d)
		if len(d.ActiveTargets) == 1 {
			tg := d.ActiveTargets[0]
			if tg.Health == "up" && tg.LastScrape.After(since) {
				return tg.LastScrape.Add(time.Duration(tg.Duration*float64(time.Second)) + time.Millisecond)
			}
			last = fmt.Sprintf("%+v", tg)
		}
	}
}

// settle points the queries (p.at) at a scrape of the gateway whose
// samples can be read. /api/v1/targets can report a scrape before its
// samples are queryable at its time: in a CI run on a loaded machine
// every instant selector of the gateway's came back empty there (the
// range queries, reaching back to earlier scrapes, did not). So a scrape
// counts once its llmgw_ series are seen at its time; else a later one is
// taken.
func (p *prometheusServer) settle(t testing.TB, instance string) {
	t.Helper()
	expr := fmt.Sprintf(`count({__name__=~"llmgw_.+", instance=%q})`, instance)
	testwait.For(t, 30*time.Second, "a scrape of the gateway whose samples are queryable", func() bool {
		p.at = p.waitScrapedAfter(t, time.Now())
		return len(p.query(t, expr)) > 0
	})
}

// ruleGroups is /api/v1/rules' data.
type ruleGroups struct {
	Groups []struct {
		Name           string    `json:"name"`
		LastEvaluation time.Time `json:"lastEvaluation"`
		Rules          []struct {
			Name      string `json:"name"`
			Health    string `json:"health"`
			LastError string `json:"lastError"`
		} `json:"rules"`
	} `json:"groups"`
}

// waitRulesEvaluatedAfter waits until every rule group was evaluated
// after since.
func (p *prometheusServer) waitRulesEvaluatedAfter(t testing.TB, since time.Time) {
	t.Helper()
	var d ruleGroups
	done := func() bool {
		p.api(t, "/api/v1/rules", nil, &d)
		if len(d.Groups) == 0 {
			return false
		}
		for _, g := range d.Groups {
			if !g.LastEvaluation.After(since) {
				return false
			}
		}
		return true
	}
	for w := newWait(t, 15*time.Second, "the rules evaluated").pace(20 * time.Millisecond); !done(); w.tick(d) {
	}
}

// checkRulesHealthy fails for every rule whose last evaluation erred (a
// many-to-many join, say), or that was never evaluated.
func (p *prometheusServer) checkRulesHealthy(t testing.TB) {
	t.Helper()
	var d ruleGroups
	p.api(t, "/api/v1/rules", nil, &d)
	n := 0
	for _, g := range d.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				t.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if want := len(loadRules(t)); n != want {
		t.Errorf("prometheus loaded %d rules, the file has %d", n, want)
	}
}

// sample is one element of an instant query's result.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query (at p.at when set, else now) and returns its vector; a scalar result
// is one sample without labels.
func (p *prometheusServer) query(t testing.TB, expr string) []sample {
	t.Helper()
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	params := url.Values{"query": {expr}}
	if !p.at.IsZero() {
		params.Set("time", strconv.FormatFloat(float64(p.at.UnixNano())/1e9, 'f', 3, 64))
	}
	p.api(t, "/api/v1/query", params, &d)
	switch d.ResultType {
	case "vector":
		var v []sample
		if err := json.Unmarshal(d.Result, &v); err != nil {
			t.Fatal(err)
		}
		return v
	case "scalar":
		var s [2]any
		if err := json.Unmarshal(d.Result, &s); err != nil {
			t.Fatal(err)
		}
		return []sample{{Value: s}}
	default:
		t.Fatalf("%s: result type %s", expr, d.ResultType)
		return nil
	}
}

// labelValues returns the values of label among the series of selector,
// as Grafana's label_values(selector, label) offers them.
func (p *prometheusServer) labelValues(t testing.TB, selector, label string) []string {
	t.Helper()
	var out []string
	for _, s := range p.query(t, fmt.Sprintf("count by (%s) (%s)", label, selector)) {
		if v := s.Metric[label]; v != "" {
			out = append(out, v)
		}
	}
	return out
}

// alerts returns the labels of the pending and firing alerts.
func (p *prometheusServer) alerts(t testing.TB) []map[string]string {
	t.Helper()
	var d struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	p.api(t, "/api/v1/alerts", nil, &d)
	out := make([]map[string]string, 0, len(d.Alerts))
	for _, a := range d.Alerts {
		out = append(out, a.Labels)
	}
	return out
}

// matchAny reports whether one of alerts has every label of want.
func matchAny(alerts []map[string]string, want map[string]string) bool {
	return slices.ContainsFunc(alerts, func(a map[string]string) bool {
		for k, v := range want {
			if a[k] != v {
				return false
			}
		}
		return true
	})
}

// anyNonZero reports whether a result has a value other than 0 and NaN.
func anyNonZero(res []sample) bool {
	for _, s := range res {
		if str, ok := s.Value[1].(string); ok {
			if v, err := strconv.ParseFloat(str, 64); err == nil && v != 0 && v == v {
				return true
			}
		}
	}
	return false
}

// parseLabelValues splits Grafana's label_values(selector, label).
func parseLabelValues(q string) (selector, label string, ok bool) {
	inner, found := strings.CutPrefix(strings.TrimSpace(q), "label_values(")
	if !found || !strings.HasSuffix(inner, ")") {
		return "", "", false
	}
	inner = strings.TrimSuffix(inner, ")")
	i := strings.LastIndexByte(inner, ',')
	if i < 0 {
		return "", "", false
	}
	return strings.TrimSpace(inner[:i]), strings.TrimSpace(inner[i+1:]), true
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
