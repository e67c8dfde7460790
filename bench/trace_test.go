package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
	"github.com/llmgw/caddy-llmgw/routing"
)

// TestCommittedTrace reads the trace committed in bench/traces and checks
// the figures its README states, so that the file and its note agree.
func TestCommittedTrace(t *testing.T) {
	reqs, err := fleetsim.ReadTraceFile(filepath.Join("traces", "conversation_trace.jsonl.gz"), fleetsim.TraceLimits{})
	if err != nil {
		t.Fatal(err)
	}
	c := fleetsim.Ceiling(reqs)
	if c.Requests != 12031 || c.DistinctBlocks != 182790 || math.Round(c.Seconds) != 3537 || int(c.BlockRate*1000) != 366 {
		t.Fatalf("trace figures %+v; its README says 12,031 requests, 182,790 blocks, 3,537 s, a 36.6%% ceiling", c)
	}
	// The section's KV cache holds the largest request (126,195 tokens
	// and its output).
	kv := traceKVBlocks(reqs, model32B(), 1, 1)
	if kv*16 < 126195 {
		t.Fatalf("kv blocks %d cannot hold the largest prompt", kv)
	}
	// A finite pooled cache finds less than the infinite ceiling, and
	// LRU less than Belady's MIN in the same room.
	for _, engines := range []int{16, 64} {
		pc := fleetsim.PooledCeiling(reqs, engines*kv*16/512)
		if pc.TokenRate >= c.TokenRate || pc.TokenRate <= 0 {
			t.Fatalf("%d engines' pooled ceiling %.3f, infinite %.3f", engines, pc.TokenRate, c.TokenRate)
		}
		opt := fleetsim.OptimalCeiling(reqs, engines*kv*16/512)
		if opt.BlockRate <= pc.BlockRate {
			t.Fatalf("%d engines: MIN finds %.3f of blocks, LRU %.3f", engines, opt.BlockRate, pc.BlockRate)
		}
		t.Logf("%d engines: pooled-cache ceiling %.1f%% of tokens (infinite %.1f%%); MIN %.1f%% of blocks (infinite %.1f%%)",
			engines, pc.TokenRate*100, c.TokenRate*100, opt.BlockRate*100, c.BlockRate*100)
	}
}

// TestTraceSessions: the scaled replay's prompts have 512 ÷ scale words
// per block (fewer in a partial last block), equal leading ids give equal
// leading text, and different ids different text.
func TestTraceSessions(t *testing.T) {
	reqs := []fleetsim.TraceRequest{
		{InputLength: 1024, OutputLength: 100, HashIDs: []uint64{1, 2}},
		{InputLength: 700, OutputLength: 3, HashIDs: []uint64{1, 3}},
		{InputLength: 512, OutputLength: 8, HashIDs: []uint64{4}},
	}
	s := traceSessions(reqs, 16, 4, 9)
	var words [][]string
	// 700 ÷ 16 = 43.75: 44 words, 12 of them in the partial last block.
	for i, want := range []int{64, 44, 32} {
		u := s[i].Turns[0].User
		if n := len(strings.Fields(u)); n != want {
			t.Errorf("request %d: %d words, want %d", i, n, want)
		}
		words = append(words, strings.Fields(u))
	}
	if strings.Join(words[0][:32], " ") != strings.Join(words[1][:32], " ") {
		t.Error("requests sharing hash id 1 differ in its block")
	}
	if strings.Join(words[0][32:44], " ") == strings.Join(words[1][32:44], " ") || words[0][0] == words[2][0] {
		t.Error("different hash ids gave the same text")
	}
	if s[0].Turns[0].MaxTokens != 25 || s[1].Turns[0].MaxTokens != 1 {
		t.Errorf("max tokens %d, %d; want 25 and 1 (outputs ÷ token scale 4, rounded up)", s[0].Turns[0].MaxTokens, s[1].Turns[0].MaxTokens)
	}
}

// TestTraceFlags: -trace runs the trace section alone unless -only names
// others, and the section cannot run without a file.
func TestTraceFlags(t *testing.T) {
	cases := []struct {
		args    []string
		only    string // the sections run, sorted, comma-separated
		wantErr string
	}{
		{[]string{"-trace", "f.jsonl"}, "trace", ""},
		{[]string{"-trace", "f.jsonl", "-only", "trace,fleet"}, "fleet,trace", ""},
		{[]string{"-only", "trace"}, "", "needs -trace FILE"},
		{[]string{"-trace", "f.jsonl", "-only", "fleet"}, "", "leaves out the trace section"},
	}
	for _, c := range cases {
		o, err := parseFlags(c.args)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%v: err %v, want %q", c.args, err, c.wantErr)
			}
			continue
		}
		var only []string
		for s := range o.Only {
			only = append(only, s)
		}
		slices.Sort(only)
		if err != nil || strings.Join(only, ",") != c.only || o.Trace != "f.jsonl" {
			t.Errorf("%v: only %v trace %q err %v, want %s", c.args, only, o.Trace, err, c.only)
		}
	}
}

// TestScaledGateway: the scaled replay's gateway counts tokens at the
// prompts' scale — long_prefill for every policy, lb_policy llm's token
// weights and reference rate for llm — and every weight still converts
// to the seconds it does at full size.
func TestScaledGateway(t *testing.T) {
	base := GatewayConfig{Policy: "llm", PolicyBody: "debug_headers", AdmissionBody: "engine_queue 1"}
	if got := scaledGateway(base, 1); got.PolicyBody != base.PolicyBody || got.AdmissionBody != base.AdmissionBody {
		t.Errorf("scale 1 changed the config: %+v", got)
	}
	g := scaledGateway(base, 16)
	if !strings.Contains(g.AdmissionBody, "engine_queue 1\nlong_prefill 1024") {
		t.Errorf("admission body %q lacks long_prefill 1024 after its own lines", g.AdmissionBody)
	}
	got := map[string]float64{}
	for _, l := range strings.Split(g.PolicyBody, "\n")[1:] {
		var name string
		var v float64
		if _, err := fmt.Sscanf(l, "%s %g", &name, &v); err != nil {
			t.Fatalf("policy line %q: %v", l, err)
		}
		got[name] = v
	}
	cfg := routing.Config{PrefillRate: got["prefill_rate"], QueueWeight: got["queue_weight"], RunningWeight: got["running_weight"],
		KVWeight: got["kv_weight"], TieTokens: got["tie_tokens"], AdapterWeight: got["adapter_weight"]}
	if len(got) != 6 || cfg.PrefillRate != routing.DefaultPrefillRate/16 {
		t.Fatalf("policy settings %v; want six, prefill_rate %g", got, routing.DefaultPrefillRate/16)
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Errorf("scaled settings invalid: %v", err)
	}
	if a, b := cfg.RunningWeight/cfg.PrefillRate, routing.DefaultRunningWeight/routing.DefaultPrefillRate; math.Abs(a-b) > 1e-12 {
		t.Errorf("a running sequence costs %g s scaled, %g s at full size", a, b)
	}
	lc := scaledGateway(GatewayConfig{Policy: "least_conn", AdmissionBody: "engine_queue 1"}, 16)
	if lc.PolicyBody != "" || !strings.Contains(lc.AdmissionBody, "long_prefill 1024") {
		t.Errorf("least_conn: policy body %q, admission %q", lc.PolicyBody, lc.AdmissionBody)
	}
}
