package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
)

// TestRenderPooled: the pooled-cache paragraph gives the LRU figure, and
// Belady's MIN beside the infinite ceiling only when the result has it
// (a trace.json written before it was computed has none).
func TestRenderPooled(t *testing.T) {
	c := fleetsim.TraceCeiling{BlockRate: 0.366, TokenRate: 0.374}
	for _, tc := range []struct {
		opt  float64
		want []string
		not  []string
	}{
		{0, []string{"7736 blocks", "**17.7% of tokens**", "not a strict bound.\n\n"}, []string{"Belady"}},
		{0.365, []string{"**17.7% of tokens**", "Belady's MIN", "find 36.5% of the prompt blocks", "infinite cache finds 36.6%", "not the room.\n\n"}, nil},
	} {
		var b strings.Builder
		w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
		renderPooled(w, TracePooled{Engines: 16, Blocks: 7736, BlockRate: 0.17, TokenRate: 0.177, OptimalBlockRate: tc.opt}, c)
		for _, s := range tc.want {
			if !strings.Contains(b.String(), s) {
				t.Errorf("optimal %v: %q lacks %q", tc.opt, b.String(), s)
			}
		}
		for _, s := range tc.not {
			if strings.Contains(b.String(), s) {
				t.Errorf("optimal %v: %q has %q", tc.opt, b.String(), s)
			}
		}
	}
}
