package upstreams

import (
	"errors"
	"reflect"
	"testing"
)

// TestParseRankGauges: each data-parallel rank of a vLLM page reads its own
// series (the `engine` label), not the sum over ranks; a rank the page does
// not have fails the scrape as a page without vLLM's gauges does.
func TestParseRankGauges(t *testing.T) {
	page := readFixture(t, "vllm_metrics_dp2.txt")
	tests := []struct {
		engine string
		want   gauges
	}{
		{engine: "0", want: gauges{Running: 37, Waiting: 3, KVUsage: 0.8125, KVUsageMax: 0.8125, BlockSize: 16, NumGPUBlocks: 27317, Ranks: 1,
			PromptTokens: 5.1023e7, CachedTokens: 3.1022e7, PrefillSeconds: 5040.125, HasPrefill: true,
			PrefillCount: 1680, HasPrefillCount: true, FirstTokens: 1837, HasFirstTokens: true, TTFTSeconds: 5511.125, ITLSeconds: 4161.125, ITLCount: 1387, HasStep: true}},
		{engine: "1", want: gauges{Running: 41, Waiting: 0, KVUsage: 0.40625, KVUsageMax: 0.40625, BlockSize: 16, NumGPUBlocks: 27301, Ranks: 1,
			PromptTokens: 5.0887e7, CachedTokens: 2.9871e7, PrefillSeconds: 5040.125, HasPrefill: true,
			PrefillCount: 1680, HasPrefillCount: true, FirstTokens: 1837, HasFirstTokens: true, TTFTSeconds: 5511.125, ITLSeconds: 4161.125, ITLCount: 1387, HasStep: true}},
	}
	var scratch []byte
	for _, tc := range tests {
		got, err := parseRankGauges(page, &scratch, tc.engine)
		if err != nil {
			t.Fatalf("engine %s: %v", tc.engine, err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("engine %s:\n got %+v\nwant %+v", tc.engine, got, tc.want)
		}
	}
	if _, err := parseRankGauges(page, &scratch, "2"); !errors.Is(err, errMissingSeries) {
		t.Fatalf("rank 2 of a two-rank page: err %v, want %v", err, errMissingSeries)
	}
	all, err := parseRankGauges(page, &scratch, "")
	if err != nil || all.Running != 37+41 || all.Ranks != 2 {
		t.Fatalf("no rank: %+v, %v; want both ranks summed", all, err)
	}
}
