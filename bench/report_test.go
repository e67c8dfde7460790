package main

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestCPUVsPlain(t *testing.T) {
	for _, tc := range []struct {
		name          string
		target, plain []float64
		want          roundStats
		ok            bool
	}{
		{name: "odd rounds", target: []float64{300, 200, 330}, plain: []float64{200, 200, 300},
			want: roundStats{median: 1.1, lo: 1, hi: 1.5, n: 3}, ok: true},
		{name: "even rounds average the middle two", target: []float64{120, 150, 130, 200}, plain: []float64{100, 100, 100, 100},
			want: roundStats{median: 1.4, lo: 1.2, hi: 2, n: 4}, ok: true},
		// A phase that served nothing (0) pairs with no other; rounds
		// only one of them ran are left out.
		{name: "empty phases skipped", target: []float64{0, 300, 400}, plain: []float64{100, 0, 200},
			want: roundStats{median: 2, lo: 2, hi: 2, n: 1}, ok: true},
		{name: "no common round", target: []float64{300}, plain: nil, ok: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := cpuVsPlain(&OverheadStat{CPURounds: tc.target}, &OverheadStat{CPURounds: tc.plain})
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
			if ok && (!near(got.median, tc.want.median) || !near(got.lo, tc.want.lo) || !near(got.hi, tc.want.hi) || got.n != tc.want.n) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAddedP50VsPlain(t *testing.T) {
	// Seconds in, milliseconds out; a round where plain served nothing is
	// left out.
	got, ok := addedP50VsPlain(&OverheadStat{P50Rounds: []float64{0.006, 0.005, 0.009}}, &OverheadStat{P50Rounds: []float64{0.004, 0, 0.0045}})
	want := roundStats{median: 3.25, lo: 2, hi: 4.5, n: 2}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !ok || !near(got.median, want.median) || !near(got.lo, want.lo) || !near(got.hi, want.hi) || got.n != want.n {
		t.Fatalf("got %+v (%v), want %+v", got, ok, want)
	}
	if s := got.millis(); s != "+3.25 ms (+2.00 to +4.50, 2 rounds)" {
		t.Fatalf("written as %q", s)
	}
}

func TestRenderLayers(t *testing.T) {
	stat := func(target string, cpu ...float64) OverheadStat {
		total := 0.0
		for _, c := range cpu {
			total += c
		}
		return OverheadStat{Body: "small", Target: target, CPUPerReq: total / float64(len(cpu)), CPURounds: cpu}
	}
	body := []OverheadBody{{Name: "small"}}
	t.Run("each layer over the one below", func(t *testing.T) {
		o := &OverheadResult{Params: OverheadParams{Bodies: body}, Stats: []OverheadStat{
			stat("plain", 100, 110), stat("admission", 110, 118), stat("approx", 130, 140),
			stat("llm", 200, 190), stat("llm-local", 150, 160)}}
		var b strings.Builder
		renderLayers(&b, o)
		for _, want := range []string{
			"| small | `admission` over `plain`: the llm app and `llm_admission` | +9 µs | +9 µs (+8 to +10, 2 rounds) | 114 µs, 1.09× plain |",
			"| small | `approx` over `admission`: `lb_policy llm`, approximate tree only | +21 µs | +21 µs (+20 to +22, 2 rounds) | 135 µs, 1.29× plain |",
			"| small | `llm-local` over `approx`: KV events and the precise tier, local tokenizer | +20 µs | +20 µs (+20 to +20, 2 rounds) | 155 µs, 1.48× plain |",
			"| small | `llm` over `approx`: KV events and the precise tier, `/tokenize` | +60 µs | +60 µs (+50 to +70, 2 rounds) | 195 µs, 1.86× plain |",
		} {
			if !strings.Contains(b.String(), want+"\n") {
				t.Errorf("no row %q in:\n%s", want, b.String())
			}
		}
	})
	t.Run("results saved before the layers", func(t *testing.T) {
		o := &OverheadResult{Params: OverheadParams{Bodies: body}, Stats: []OverheadStat{stat("plain", 100), stat("llm", 200)}}
		var b strings.Builder
		renderLayers(&b, o)
		if b.Len() != 0 {
			t.Fatalf("wrote %q for a run without layers", b.String())
		}
		if o.ran("admission") || !o.ran("llm") {
			t.Fatal("ran: wrong targets")
		}
	})
}

func TestLayersFinding(t *testing.T) {
	bodies := []OverheadBody{{Name: "small"}, {Name: "8k"}}
	o := &OverheadResult{Params: OverheadParams{Bodies: bodies}, Stats: []OverheadStat{
		{Body: "small", Target: "plain", CPUPerReq: 100}, {Body: "small", Target: "admission", CPUPerReq: 110}, {Body: "small", Target: "approx", CPUPerReq: 120},
		{Body: "8k", Target: "plain", CPUPerReq: 300}, {Body: "8k", Target: "admission", CPUPerReq: 360}, {Body: "8k", Target: "approx", CPUPerReq: 390},
	}}
	// The largest body with every layer measured.
	if got := layersFinding(o); !strings.Contains(got, "Of the 8k figures") || !strings.Contains(got, "takes 1.20×") || !strings.Contains(got, "approximate tree (no tokens, no KV events) 1.30×") {
		t.Fatalf("finding = %q", got)
	}
	o.Stats = o.Stats[:3]
	if got := layersFinding(o); !strings.Contains(got, "Of the small figures") {
		t.Fatalf("without 8k layers: %q", got)
	}
	o.Stats = o.Stats[:1]
	if got := layersFinding(o); got != "" {
		t.Fatalf("without layers: %q", got)
	}
}

// TestWhatItCostsNamesLayersOnlyWhenMeasured: results saved before the
// layers keep their headline sentence word for word.
func TestWhatItCostsNamesLayersOnlyWhenMeasured(t *testing.T) {
	body := []OverheadBody{{Name: "8k"}}
	stats := []OverheadStat{{Body: "8k", Target: "plain", CPUPerReq: 300}, {Body: "8k", Target: "llm", CPUPerReq: 600}}
	for _, tc := range []struct {
		name   string
		layers bool
		want   string
	}{
		{"without layers", false, "where it goes is in section 4's breakdown by part and its profiles.\n"},
		{"with layers", true, "where it goes is in section 4's layers, its breakdown by part and its profiles. Of the 8k figures"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &OverheadResult{Params: OverheadParams{Bodies: body}, Stats: stats}
			if tc.layers {
				o.Stats = append(slices.Clone(stats), OverheadStat{Body: "8k", Target: "admission", CPUPerReq: 360}, OverheadStat{Body: "8k", Target: "approx", CPUPerReq: 390})
			}
			var b strings.Builder
			renderFindings(&b, &loaded{overhead: o})
			if !strings.Contains(b.String(), tc.want) {
				t.Fatalf("findings lack %q:\n%s", tc.want, b.String())
			}
		})
	}
}
