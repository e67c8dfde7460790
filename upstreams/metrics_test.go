package upstreams

import (
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

const modelLabel = `model_name="m"`

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseGauges(t *testing.T) {
	dp2 := string(readFixture(t, "vllm_metrics_dp2.txt"))
	tests := []struct {
		name    string
		page    string
		want    gauges
		wantErr string // substring; "" = success
		missing bool   // error must wrap errMissingSeries
	}{
		{
			name: "realistic vLLM page, two DP ranks, block-weighted KV mean",
			page: dp2,
			want: gauges{Running: 37 + 41, Waiting: 3, KVUsageMax: 0.8125, BlockSize: 16, NumGPUBlocks: 27317 + 27301, Ranks: 2,
				KVUsage:      (0.8125*27317 + 0.40625*27301) / (27317 + 27301),
				PromptTokens: 5.1023e7 + 5.0887e7, CachedTokens: 3.1022e7 + 2.9871e7, PrefillSeconds: 2 * 5040.125, HasPrefill: true,
				PrefillCount: 3360, HasPrefillCount: true, // the prefill-time histogram's _count, both ranks
				FirstTokens: 3674, TTFTSeconds: 2 * 5511.125, HasFirstTokens: true, // the TTFT histogram's _count, both ranks: ahead of the prefills ended
				ITLSeconds: 2 * 4161.125, ITLCount: 2 * 1387, HasStep: true},
		},
		{
			name: "pre-DP vLLM: no engine label, legacy gpu_cache_usage_perc, no cache_config_info",
			page: "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 4.0\n" +
				"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 2.0\n" +
				"# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n",
			want: gauges{Running: 4, Waiting: 2, KVUsage: 0.25, KVUsageMax: 0.25, Ranks: 1},
		},
		{
			name: "new KV name wins over legacy when both are exposed",
			page: "vllm:num_requests_running{" + modelLabel + "} 1\nvllm:num_requests_waiting{" + modelLabel + "} 0\n" +
				"vllm:gpu_cache_usage_perc{" + modelLabel + "} 0.9\nvllm:kv_cache_usage_perc{" + modelLabel + "} 0.5\n",
			want: gauges{Running: 1, KVUsage: 0.5, KVUsageMax: 0.5, Ranks: 1},
		},
		{
			name: "unweighted mean when a rank has no block count; None and duplicates ignored",
			page: "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"1\"} 2\nvllm:num_requests_running{engine=\"2\"} 3\n" +
				"vllm:num_requests_waiting{engine=\"0\"} 0\n" +
				"vllm:kv_cache_usage_perc{engine=\"0\"} 0.2\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.4\nvllm:kv_cache_usage_perc{engine=\"2\"} 0.9\n" +
				"vllm:cache_config_info{block_size=\"32\",engine=\"0\",num_gpu_blocks=\"100\"} 1\n" +
				"vllm:cache_config_info{block_size=\"32\",engine=\"0\",num_gpu_blocks=\"999\",other=\"x\"} 1\n" +
				"vllm:cache_config_info{block_size=\"32\",engine=\"1\",num_gpu_blocks=\"None\"} 1\n",
			want: gauges{Running: 6, Waiting: 0, KVUsage: (0.2 + 0.4 + 0.9) / 3, KVUsageMax: 0.9, BlockSize: 32, NumGPUBlocks: 100, Ranks: 3},
		},
		{
			name: "KV usage above 1 is clamped; OpenMetrics EOF and unrelated families ignored",
			page: "vllm:num_requests_running 0\nvllm:num_requests_waiting 7\nvllm:kv_cache_usage_perc 1.5\nfoo_bar{x=\"y\"} 3\n# EOF\n",
			want: gauges{Waiting: 7, KVUsage: 1, KVUsageMax: 1, Ranks: 1},
		},
		{
			name: "leading whitespace and no trailing newline",
			page: "  vllm:num_requests_running 2\n\tvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5",
			want: gauges{Running: 2, Waiting: 1, KVUsage: 0.5, KVUsageMax: 0.5, Ranks: 1},
		},
		{
			name:    "waiting_by_reason is not waiting",
			page:    "vllm:num_requests_running 1\nvllm:num_requests_waiting_by_reason{reason=\"capacity\"} 4\nvllm:kv_cache_usage_perc 0.1\n",
			wantErr: metricWaiting, missing: true,
		},
		{
			name:    "no KV usage",
			page:    "vllm:num_requests_running 1\nvllm:num_requests_waiting 4\n",
			wantErr: metricKVUsage, missing: true,
		},
		{
			name:    "family with HELP/TYPE but no samples is missing",
			page:    "# HELP vllm:num_requests_running r\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_waiting 4\nvllm:kv_cache_usage_perc 0.1\n",
			wantErr: metricRunning, missing: true,
		},
		{name: "HTML", page: "<!DOCTYPE html><html><body>Login</body></html>", wantErr: "HTML", missing: true},
		{name: "JSON", page: `{"detail":"Not Found"}`, wantErr: "JSON", missing: true},
		{name: "empty", page: "", wantErr: "empty", missing: true},
		{name: "binary garbage", page: "\x00\x01\xff\xfe garbage \x7f", wantErr: "no vLLM metric lines", missing: true},
		{name: "malformed wanted line", page: "vllm:num_requests_running{engine=\"0\" 5\n", wantErr: "parse metrics"},
		{name: "non-numeric value", page: "vllm:num_requests_running abc\n", wantErr: "parse metrics"},
		{name: "NaN", page: "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n", wantErr: "invalid value"},
		{name: "negative", page: "vllm:num_requests_running 1\nvllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc 0\n", wantErr: "invalid value"},
		{name: "+Inf KV", page: "vllm:num_requests_running 1\nvllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc +Inf\n", wantErr: "invalid value"},
		{name: "conflicting TYPE", page: "# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_running counter\nvllm:num_requests_running 1\n", wantErr: "parse metrics"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var scratch []byte
			got, err := parseGauges([]byte(tc.page), &scratch)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				if tc.missing != errors.Is(err, errMissingSeries) {
					t.Fatalf("errors.Is(err, errMissingSeries) = %v, want %v (%v)", !tc.missing, tc.missing, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got.KVUsage-tc.want.KVUsage) > 1e-12 {
				t.Fatalf("KVUsage = %v, want %v", got.KVUsage, tc.want.KVUsage)
			}
			got.KVUsage = tc.want.KVUsage
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// prefillPage is a minimal valid page (the required gauges) followed by
// extra lines.
func prefillPage(extra string) string {
	return "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n" + extra
}

// TestParsePrefillCounters: the prefill-rate counters are optional; a page
// without them, or with unusable values, still parses, only without them.
func TestParsePrefillCounters(t *testing.T) {
	const (
		prompt = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine=\"0\"} 1000\nvllm:prompt_tokens_total{engine=\"1\"} 500\n"
		hits   = "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\"} 300\nvllm:prefix_cache_hits_total{engine=\"1\"} 100\n"
		hist   = "# HELP vllm:request_prefill_time_seconds h\n# TYPE vllm:request_prefill_time_seconds histogram\n" +
			"vllm:request_prefill_time_seconds_bucket{engine=\"0\",le=\"0.3\"} 1\nvllm:request_prefill_time_seconds_bucket{engine=\"0\",le=\"+Inf\"} 4\n" +
			"vllm:request_prefill_time_seconds_count{engine=\"0\"} 4\nvllm:request_prefill_time_seconds_sum{engine=\"0\"} 0.75\n" +
			"vllm:request_prefill_time_seconds_count{engine=\"1\"} 2\nvllm:request_prefill_time_seconds_sum{engine=\"1\"} 0.25\n"
	)
	full := gauges{PromptTokens: 1500, CachedTokens: 400, PrefillSeconds: 1, HasPrefill: true}
	tests := []struct {
		name string
		page string
		want gauges // prefill fields only
	}{
		{"all three, summed over ranks", prompt + hits + hist, full},
		{"families absent (older vLLM, other engines)", "", gauges{}},
		{"no cache hits: no rate rather than a wrong one", prompt + hist, gauges{}},
		{"no prefill histogram", prompt + hits, gauges{}},
		{"histogram without _sum", prompt + hits + "# TYPE vllm:request_prefill_time_seconds histogram\nvllm:request_prefill_time_seconds_count 3\n", gauges{}},
		{"legacy gpu_prefix_cache_hits_total", prompt + hist + "vllm:gpu_prefix_cache_hits_total 400\n", full},
		// llm-d-inference-sim names its counters without _total.
		{"counters without _total", strings.ReplaceAll(prompt+hits, "_total", "") + hist, full},
		{"one counter with _total, one without", prompt + strings.ReplaceAll(hits, "_total", "") + hist, full},
		{"untyped _sum (no TYPE lines)", prompt + hits + "vllm:request_prefill_time_seconds_sum{engine=\"0\"} 1\n", full},
		{"NaN prompt tokens", "vllm:prompt_tokens_total NaN\n" + hits + hist, gauges{}},
		{"negative hits", prompt + "vllm:prefix_cache_hits_total -1\n" + hist, gauges{}},
		{"+Inf prefill sum", prompt + hits + "# TYPE vllm:request_prefill_time_seconds histogram\nvllm:request_prefill_time_seconds_sum +Inf\nvllm:request_prefill_time_seconds_count 1\n", gauges{}},
		{"sum overflowing to +Inf", "vllm:prompt_tokens_total{engine=\"0\"} 1e308\nvllm:prompt_tokens_total{engine=\"1\"} 1e308\n" + hits + hist, gauges{}},
		{"prompt tokens typed as a histogram", "# TYPE vllm:prompt_tokens_total histogram\nvllm:prompt_tokens_total_sum 1\n" + hits + hist, gauges{}},
		{"bucket lines are not kept", prompt + hits + "vllm:request_prefill_time_seconds_bucket{le=\"+Inf\"} 1\n", gauges{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var scratch []byte
			got, err := parseGauges([]byte(prefillPage(tc.page)), &scratch)
			if err != nil {
				t.Fatalf("err = %v; the prefill counters must never fail a scrape", err)
			}
			if got.Running != 1 || got.KVUsage != 0.5 {
				t.Fatalf("required gauges lost: %+v", got)
			}
			if got.PromptTokens != tc.want.PromptTokens || got.CachedTokens != tc.want.CachedTokens ||
				got.PrefillSeconds != tc.want.PrefillSeconds || got.HasPrefill != tc.want.HasPrefill {
				t.Fatalf("got prompt=%v cached=%v secs=%v has=%v, want %+v",
					got.PromptTokens, got.CachedTokens, got.PrefillSeconds, got.HasPrefill, tc.want)
			}
		})
	}
}

func TestFilterExpositionKeepsOnlyWantedFamilies(t *testing.T) {
	page := readFixture(t, "vllm_metrics_dp2.txt")
	out := string(filterExposition(nil, page))
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		ok := false
		for _, w := range wantedFamilies {
			if strings.HasPrefix(line, w+"{") || strings.HasPrefix(line, w+" ") || strings.Contains(line, " "+w+" ") {
				ok = true
			}
		}
		if !ok || strings.Contains(line, "_bucket") {
			t.Errorf("unexpected line kept: %q", line)
		}
	}
	for _, want := range []string{metricPromptTokens + "{", metricPrefixHits + "{", metricPrefillTime + "_sum{", metricPrefillTime + "_count{", "# TYPE " + metricPrefillTime + " histogram"} {
		if !strings.Contains(out, want) {
			t.Errorf("filtered page lacks %q", want)
		}
	}
	if len(out) == 0 || len(out) > len(page)/10 {
		t.Fatalf("filtered %d of %d bytes", len(out), len(page))
	}
}

// FuzzParseGauges: arbitrary pages must never panic, and whatever parses must
// be sane.
func FuzzParseGauges(f *testing.F) {
	f.Add(readFixture(f, "vllm_metrics_dp2.txt"))
	f.Add([]byte("vllm:num_requests_running 1\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 0.5\n"))
	f.Add([]byte("vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_waiting{engine=\"0\"} 2\nvllm:gpu_cache_usage_perc{engine=\"0\"} 0.5\n" +
		"vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"10\"} 1\n"))
	f.Add([]byte("<html></html>"))
	f.Add([]byte("# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running_bucket{le=\"1\"} 1\n"))
	f.Add([]byte("vllm:cache_config_info{num_gpu_blocks=\"2147483647\",engine=\"0\"} 1\nvllm:cache_config_info{num_gpu_blocks=\"2147483647\",engine=\"1\"} 1\n"))
	f.Add([]byte(prefillPage("vllm:prompt_tokens_total 100\nvllm:prefix_cache_hits_total 20\n" +
		"# TYPE vllm:request_prefill_time_seconds histogram\nvllm:request_prefill_time_seconds_sum{engine=\"0\"} 0.5\nvllm:request_prefill_time_seconds_count{engine=\"0\"} 2\n")))
	f.Add([]byte(prefillPage("vllm:prompt_tokens_total 1e308\nvllm:prompt_tokens_total{engine=\"1\"} 1e308\nvllm:prefix_cache_hits_total NaN\nvllm:request_prefill_time_seconds_sum -1\n")))
	f.Fuzz(func(t *testing.T, page []byte) {
		var scratch []byte
		g, err := parseGauges(page, &scratch)
		if err != nil {
			return
		}
		for _, v := range []float64{g.Running, g.Waiting, g.KVUsage, g.KVUsageMax} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("bad value in %+v", g)
			}
		}
		if g.KVUsage > 1 || g.KVUsageMax > 1 || g.KVUsage > g.KVUsageMax+1e-9 {
			t.Fatalf("bad KV usage in %+v", g)
		}
		if g.BlockSize < 0 || g.NumGPUBlocks < 0 || g.Ranks < 1 {
			t.Fatalf("bad geometry in %+v", g)
		}
		for _, v := range []float64{g.PromptTokens, g.CachedTokens, g.PrefillSeconds} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || (!g.HasPrefill && v != 0) {
				t.Fatalf("bad prefill counters in %+v", g)
			}
		}
		// The estimator must take whatever parses without panicking or
		// deriving a non-finite or negative rate.
		var p prefillEstimator
		p.observe(prefillSample{})
		if g.HasPrefill {
			p.observe(prefillSample{prompt: g.PromptTokens, cached: g.CachedTokens, secs: g.PrefillSeconds})
		}
		if r := p.rate(); math.IsNaN(r) || math.IsInf(r, 0) || r < 0 {
			t.Fatalf("rate %v from %+v", r, g)
		}
	})
}

// TestParseStepCounters: the inter-token latency histogram's _sum and
// _count are optional, both needed, summed over ranks; they never fail a
// scrape.
func TestParseStepCounters(t *testing.T) {
	const hist = "# HELP vllm:inter_token_latency_seconds h\n# TYPE vllm:inter_token_latency_seconds histogram\n" +
		"vllm:inter_token_latency_seconds_bucket{engine=\"0\",le=\"0.01\"} 1\nvllm:inter_token_latency_seconds_bucket{engine=\"0\",le=\"+Inf\"} 40\n" +
		"vllm:inter_token_latency_seconds_count{engine=\"0\"} 40\nvllm:inter_token_latency_seconds_sum{engine=\"0\"} 1.5\n" +
		"vllm:inter_token_latency_seconds_count{engine=\"1\"} 10\nvllm:inter_token_latency_seconds_sum{engine=\"1\"} 0.5\n"
	tests := []struct {
		name       string
		page       string
		secs, n    float64
		wantHasAny bool
	}{
		{"histogram, two ranks", hist, 2, 50, true},
		{"absent", "", 0, 0, false},
		{"untyped _sum and _count", "vllm:inter_token_latency_seconds_sum 3\nvllm:inter_token_latency_seconds_count 7\n", 3, 7, true},
		{"untyped _sum only", "vllm:inter_token_latency_seconds_sum 3\n", 0, 0, false},
		{"histogram without _sum", "# TYPE vllm:inter_token_latency_seconds histogram\nvllm:inter_token_latency_seconds_count 3\n", 0, 0, false},
		{"NaN sum", "vllm:inter_token_latency_seconds_sum NaN\nvllm:inter_token_latency_seconds_count 7\n", 0, 0, false},
		{"negative count", "vllm:inter_token_latency_seconds_sum 1\nvllm:inter_token_latency_seconds_count -7\n", 0, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var scratch []byte
			got, err := parseGauges([]byte(prefillPage(tc.page)), &scratch)
			if err != nil {
				t.Fatalf("err = %v; the step counters must never fail a scrape", err)
			}
			if got.HasStep != tc.wantHasAny || (got.HasStep && (got.ITLSeconds != tc.secs || got.ITLCount != tc.n)) {
				t.Fatalf("got secs=%v count=%v has=%v, want %v %v %v", got.ITLSeconds, got.ITLCount, got.HasStep, tc.secs, tc.n, tc.wantHasAny)
			}
		})
	}
}
