package upstreams

import (
	"errors"
	"math"
	"os"
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
				KVUsage: (0.8125*27317 + 0.40625*27301) / (27317 + 27301)},
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
			if got != tc.want {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
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
		if !ok {
			t.Errorf("unexpected line kept: %q", line)
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
	})
}
