package caddymodule

import (
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/llmgw/caddy-llmgw/internal/testutil/prombin"
)

// The operators' kit in deploy/: a Grafana dashboard and Prometheus alert
// rules over the llmgw_* series. These tests keep them true to what the
// gateway exports: the static one checks every metric and label name
// against the collectors' descriptors (no Prometheus needed); promtool
// checks and unit-tests the rules; TestPrometheusDashboardQueries (in
// metrics_prometheus_test.go) runs every query against a real Prometheus
// scraping a real gateway.
const (
	dashboardFile = "../deploy/grafana/llmgw-dashboard.json"
	rulesFile     = "../deploy/prometheus/llmgw-rules.yaml"
	rulesTestFile = "../deploy/prometheus/llmgw-rules.test.yaml"
)

// dashQuery is one query of the dashboard: a panel target's expr, or a
// template variable's query.
type dashQuery struct {
	where, expr string
}

// dashVariable is a template variable of the dashboard.
type dashVariable struct {
	Name     string          `json:"name"`
	Type     string          `json:"type"`
	Query    json.RawMessage `json:"query"`
	AllValue string          `json:"allValue"`
}

// queryText is the variable's query, a string or Grafana's {"query": ...}.
func (v dashVariable) queryText() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.Query, &o)
	return o.Query
}

type dashPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // a collapsed row's panels
}

// loadDashboard returns the dashboard's panel queries and its template
// variables.
func loadDashboard(t testing.TB) ([]dashQuery, []dashVariable) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []dashVariable `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []dashQuery
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, dashQuery{where: p.Title + " / " + tg.RefID, expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out, d.Templating.List
}

// alertRule is one rule of the rules file.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t testing.TB) []alertRule {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("no rules")
	}
	return out
}

// selectorRE finds the llmgw series selectors of a PromQL expression: a
// metric name and its optional {matchers}. The expressions here never put
// a brace inside a matcher's value, so [^}] is enough.
var (
	selectorRE = regexp.MustCompile(`\b(llmgw_[a-z0-9_]+)(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	byRE       = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
)

// seriesSelector is one selector found in an expression.
type seriesSelector struct {
	text, metric string
	labels       []string // label names its matchers use
}

func selectors(expr string) []seriesSelector {
	var out []seriesSelector
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		s := seriesSelector{text: m[0], metric: m[1]}
		for _, l := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			s.labels = append(s.labels, l[1])
		}
		out = append(out, s)
	}
	return out
}

// exportedMetrics maps each llmgw metric the gateway can export to its
// label names, from the descriptors of the package collectors and of the
// fleet collector (the same lists registerMetrics registers).
// prometheus.Desc has no accessors, so its String form is parsed.
func exportedMetrics(t testing.TB) map[string][]string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 256)
	for _, c := range append(collectors(), &fleetCollector{}) {
		c.Describe(ch)
	}
	close(ch)
	nameRE := regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	labelsRE := regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
	out := map[string][]string{}
	for d := range ch {
		s := d.String()
		n, l := nameRE.FindStringSubmatch(s), labelsRE.FindStringSubmatch(s)
		if n == nil || l == nil {
			t.Fatalf("cannot parse descriptor %s", s)
		}
		var labels []string
		if l[1] != "" {
			labels = strings.Split(l[1], ",")
		}
		out[n[1]] = labels
	}
	return out
}

// resolveMetric maps a series name to the exported metric and the labels
// its series carry: a histogram's _bucket, _count and _sum series are the
// histogram's (le only on _bucket); every scraped series also has the
// target labels instance and job.
func resolveMetric(exported map[string][]string, name string) (string, []string, bool) {
	if labels, ok := exported[name]; ok {
		return name, append(slices.Clone(labels), "instance", "job"), true
	}
	for _, suf := range []string{"_bucket", "_count", "_sum"} {
		base, ok := strings.CutSuffix(name, suf)
		if labels, found := exported[base]; ok && found {
			labels = append(slices.Clone(labels), "instance", "job")
			if suf == "_bucket" {
				labels = append(labels, "le")
			}
			return base, labels, true
		}
	}
	return "", nil, false
}

// TestDeployMetricNames: every llmgw series the dashboard and the alert
// rules (and the rules' unit tests) name is one the gateway exports, with
// labels it has; the labels they group or match by are labels of a metric
// of the same expression; and every exported metric has a dashboard panel.
// It runs without Prometheus, so a renamed metric breaks even a run that
// skips the Prometheus tests.
func TestDeployMetricNames(t *testing.T) {
	exported := exportedMetrics(t)
	used := map[string]bool{}
	check := func(where, expr string) {
		sels := selectors(expr)
		exprLabels := map[string]bool{"instance": true, "job": true, "le": true}
		for _, s := range sels {
			base, labels, ok := resolveMetric(exported, s.metric)
			if !ok {
				t.Errorf("%s: %s is not a metric the gateway exports", where, s.metric)
				continue
			}
			used[base] = true
			for _, l := range labels {
				exprLabels[l] = true
			}
			for _, l := range s.labels {
				if !slices.Contains(labels, l) {
					t.Errorf("%s: %s has no label %q (it has %v)", where, s.metric, l, labels)
				}
			}
		}
		for _, m := range byRE.FindAllStringSubmatch(expr, -1) {
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !exprLabels[l] {
					t.Errorf("%s: groups or matches by %q, a label of none of its metrics", where, l)
				}
			}
		}
		if len(sels) == 0 && !strings.HasPrefix(where, "promtool test") {
			t.Errorf("%s: no llmgw series in %q", where, expr)
		}
	}
	queries, vars := loadDashboard(t)
	for _, q := range queries {
		check("dashboard "+q.where, q.expr)
	}
	for _, v := range vars {
		if v.Type == "query" {
			check("dashboard variable "+v.Name, v.queryText())
		}
	}
	dashboardUses := maps.Clone(used)
	for _, r := range loadRules(t) {
		check("rule "+r.Alert, r.Expr)
	}
	raw, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			Name        string `yaml:"name"`
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests.Tests {
		for _, s := range tc.InputSeries {
			check("promtool test "+tc.Name, s.Series)
		}
	}
	for name := range exported {
		if !dashboardUses[name] {
			t.Errorf("%s is exported but no dashboard panel shows it", name)
		}
	}
}

// TestPromtoolRules: the rules file passes promtool check rules, and its
// unit tests (a firing and a quiet case for every alert) pass promtool test
// rules.
func TestPromtoolRules(t *testing.T) {
	bin := prombin.Require(t)
	dir, err := filepath.Abs(filepath.Dir(rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"check", "rules", filepath.Base(rulesFile)},
		{"test", "rules", filepath.Base(rulesTestFile)},
	} {
		cmd := exec.Command(bin.Promtool, args...)
		cmd.Dir = dir // rule_files in the test file are relative to it
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Every alert must carry what the on-call operator needs.
	for _, r := range loadRules(t) {
		if r.For == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: needs for:, a severity label and summary and description annotations: %+v", r.Alert, r)
		}
	}
}
