package fleetsim

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// testTrace is n requests of families prefix families, gap milliseconds
// apart: request j of family f starts with 1 to 3 of the family's leading
// blocks, then one block of its own, so that no prompt is wholly a prefix
// of an earlier one.
func testTrace(n, families int, gap int64) []TraceRequest {
	var out []TraceRequest
	for j := range n {
		f := uint64(j % families)
		var ids []uint64
		for k := range 1 + (j/families)%3 {
			ids = append(ids, f*1000+uint64(k))
		}
		ids = append(ids, 1_000_000+uint64(j))
		out = append(out, TraceRequest{Timestamp: int64(j) * gap, InputLength: len(ids) * TraceBlockTokens, OutputLength: 8, HashIDs: ids})
	}
	return out
}

func traceParams(policy string, trace []TraceRequest, engines int) Params {
	p := smallParams(policy)
	p.Engines, p.KVBlocks = engines, 4096
	p.Trace, p.TraceSpeedup = trace, 1
	return p
}

// TestReplayHitsTheCeiling: one engine whose cache holds the whole trace,
// requests far enough apart that each ends before the next, hits exactly
// the ceiling's tokens: equal hash ids became equal prompt tokens, and
// different ones shared nothing.
func TestReplayHitsTheCeiling(t *testing.T) {
	trace := testTrace(60, 5, 10_000)
	c := Ceiling(trace)
	if c.HitTokens == 0 {
		t.Fatal("the test trace shares nothing")
	}
	for _, policy := range []string{PolicyLLM, PolicyRoundRobin} {
		r, err := Run(context.Background(), traceParams(policy, trace, 1))
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed != len(trace) || r.PromptTokens != c.Tokens || r.CachedTokens != c.HitTokens {
			t.Fatalf("%s: completed %d of %d, prompt tokens %d (want %d), cached %d (want the ceiling's %d)",
				policy, r.Completed, len(trace), r.PromptTokens, c.Tokens, r.CachedTokens, c.HitTokens)
		}
		// The last request arrives at its timestamp: the run lasts past it.
		if last := float64(trace[len(trace)-1].Timestamp) / 1000; r.SimSeconds < last {
			t.Fatalf("%s: run ended at %.1f s, before the last arrival at %.1f s", policy, r.SimSeconds, last)
		}
	}
}

// TestReplayCompressed: four engines under compressed arrivals account for
// every request, stay below the ceiling, repeat themselves, and routing on
// the index keeps families together, finding more cache than round robin.
func TestReplayCompressed(t *testing.T) {
	// Seven families over four engines: round robin sends each family
	// everywhere, and an engine's cache holds about half of them.
	trace := testTrace(240, 7, 1000)
	c := Ceiling(trace)
	hit := map[string]float64{}
	for _, policy := range []string{PolicyLLM, PolicyLeastConn, PolicyRoundRobin} {
		p := traceParams(policy, trace, 4)
		p.TraceSpeedup, p.KVBlocks = 20, 400
		r, err := Run(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed+r.Rejected != len(trace) || r.Completed == 0 || r.CachedTokens > c.HitTokens {
			t.Fatalf("%s: %d completed + %d rejected of %d; cached %d, ceiling %d", policy, r.Completed, r.Rejected, len(trace), r.CachedTokens, c.HitTokens)
		}
		if policy == PolicyLLM && r.MirrorProblems != 0 {
			t.Fatalf("llm: %d mirror problems", r.MirrorProblems)
		}
		// 240 arrivals 50 ms apart: the compressed trace lasts 12 s.
		if r.SimSeconds < 11.95 || r.SimSeconds > 0.5*float64(len(trace)) {
			t.Fatalf("%s: run lasted %.2f s, want about the compressed trace's 12 s", policy, r.SimSeconds)
		}
		again, err := Run(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(again.TTFT, r.TTFT) || again.CachedTokens != r.CachedTokens {
			t.Fatalf("%s: two runs of the same trace differ", policy)
		}
		hit[policy] = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	if hit[PolicyLLM] <= hit[PolicyRoundRobin] {
		t.Fatalf("llm found no more cache than round robin: %v", hit)
	}
}

func TestReplayRejectsBadParams(t *testing.T) {
	trace := testTrace(4, 2, 100)
	cases := []struct {
		name   string
		change func(*Params)
		want   string
	}{
		{"negative speedup", func(p *Params) { p.TraceSpeedup = -1 }, "speedup"},
		{"bursts", func(p *Params) { p.BurstSize = 4 }, "no bursts"},
		{"prompt beyond the cache", func(p *Params) { p.KVBlocks = 64 }, "needs 65 KV blocks, more than an engine's 64"},
		{"empty", func(p *Params) { p.Trace = []TraceRequest{} }, "empty trace"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := traceParams(PolicyLLM, trace, 2)
			c.change(&p)
			_, err := Run(context.Background(), p)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
}
