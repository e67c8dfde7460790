package routing

import (
	"fmt"
	"math"
	"testing"
)

// TestStaleSpeedsDoNotStarve is the starvation of an idle engine whose own
// speeds are a little worse than its peers': stale (measured under load,
// before a restart or a sleep) or noise. Requests come one at a time, so
// none is ever waiting; each goes to the engine predicted fastest, whose
// speeds its traffic then refreshes to the engines' true ones (all alike),
// while the others' grow older. Kept as they were, the stale figures would
// lose every request and never be refreshed; fading into the fresh peers'
// median, they tie within speedFade, and the tie-break sends the engine
// requests.
func TestStaleSpeedsDoNotStarve(t *testing.T) {
	const (
		interval = 0.5 // seconds between requests
		requests = 120
	)
	truth := Work{PrefillRate: 10000, MeanUncached: 1000, StepSeconds: 0.02}
	cases := []struct {
		name  string
		stale []Work // the stale engines' own figures; one fresh engine joins them
		peers int    // fresh engines
	}{
		{"rate 10% worse, one peer", []Work{{PrefillRate: 9000, MeanUncached: 1000, StepSeconds: 0.02}}, 1},
		{"step 50% worse, two peers", []Work{{PrefillRate: 10000, MeanUncached: 1000, StepSeconds: 0.03}}, 2},
		{"two stale engines, the median among them", []Work{
			{PrefillRate: 9500, MeanUncached: 900, StepSeconds: 0.02},
			{PrefillRate: 9000, MeanUncached: 1200, StepSeconds: 0.022},
		}, 1},
		{"measured under load: twice as slow", []Work{{PrefillRate: 5000, MeanUncached: 3000, StepSeconds: 0.05}}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var cands []Candidate
			for i := 0; i < tc.peers; i++ {
				cands = append(cands, Candidate{Dial: fmt.Sprintf("peer-%d:8000", i), LoadKnown: true, Work: truth})
			}
			for i, w := range tc.stale {
				cands = append(cands, Candidate{Dial: fmt.Sprintf("stale-%d:8000", i), LoadKnown: true, Work: w})
			}
			got := make([]int, len(cands))
			first := make([]int, len(cands))
			for n := range requests {
				req := Request{PromptTokens: 800, BlockSize: 16, TotalBlocks: 50, Key: uint64(n)*0x9e3779b97f4a7c15 + 1}
				d := Pick(req, cands, Config{}, false)
				if d.Index < 0 {
					t.Fatalf("request %d: no pick", n)
				}
				// Its scrape shows the winner's true speeds; the others'
				// age by the interval.
				for i := range cands {
					cands[i].Work.SpeedAge += interval
				}
				cands[d.Index].Work = truth
				if got[d.Index] == 0 {
					first[d.Index] = n
				}
				got[d.Index]++
			}
			// An engine whose figures are speedFade old ties with its
			// peers; a couple of requests of tie-break luck on top.
			due := int(speedFade/interval) + 2*len(cands)
			for i := tc.peers; i < len(cands); i++ {
				if got[i] == 0 || first[i] > due {
					t.Errorf("%s got %d of %d requests (the first as request %d, due by %d); all: %v",
						cands[i].Dial, got[i], requests, first[i], due, got)
				}
			}
			// Refreshed, it is like its peers: the requests spread.
			for i, n := range got {
				if n < requests/(4*len(cands)) {
					t.Errorf("%s got %d of %d requests; all: %v", cands[i].Dial, n, requests, got)
				}
			}
		})
	}
}

// TestSpeedsFade checks the blend of an engine's own speeds with its fresh
// peers' median: its own while fresh, seconds per token and steps averaged
// by freshness as they age, its peers' from speedFade on. A stale engine
// does not count in the median while a fresh one shows the figure.
func TestSpeedsFade(t *testing.T) {
	req := Request{PromptTokens: 1000, BlockSize: 16, TotalBlocks: 62}
	// Without MeanUncached the rate is taken whole and the whole step added.
	fresh := Candidate{Dial: "fresh:1", LoadKnown: true, Work: Work{PrefillRate: 10000, StepSeconds: 0.02}}
	ownRate, ownStep := 4000.0, 0.05
	for _, tc := range []struct {
		age, f float64 // f: the weight of the engine's own speeds
	}{
		{0, 1}, {-3, 1}, {math.NaN(), 1}, {speedFade / 4, 0.75}, {speedFade / 2, 0.5},
		{speedFade, 0}, {10 * speedFade, 0}, {math.Inf(1), 0},
	} {
		stale := Candidate{Dial: "stale:1", LoadKnown: true, Work: Work{PrefillRate: ownRate, StepSeconds: ownStep, SpeedAge: tc.age}}
		// Two stale peers as slow as it: while the fresh one shows
		// speeds, the median is the fresh one's.
		others := []Candidate{stale, fresh, stale, stale}
		others[2].Dial, others[3].Dial = "old:1", "old:2"
		others[2].Work.SpeedAge, others[3].Work.SpeedAge = speedFade, 2*speedFade
		got := Pick(req, others, Config{}, true).Scored[0].Prediction
		wantRate := 1 / (tc.f/ownRate + (1-tc.f)/10000)
		wantStep := tc.f*ownStep + (1-tc.f)*0.02
		if math.Abs(got.Rate-wantRate) > 1e-6 || math.Abs(got.StepSeconds-wantStep) > 1e-12 {
			t.Errorf("age %v: rate %v step %v, want %v and %v", tc.age, got.Rate, got.StepSeconds, wantRate, wantStep)
		}
	}
	// With no fresh engine, the stale ones' median serves.
	old := []Candidate{
		{Dial: "a:1", LoadKnown: true, Work: Work{PrefillRate: 3000, StepSeconds: 0.03, SpeedAge: 2 * speedFade}},
		{Dial: "b:1", LoadKnown: true, Work: Work{PrefillRate: 5000, StepSeconds: 0.01, SpeedAge: 2 * speedFade}},
		{Dial: "c:1", LoadKnown: true, Work: Work{PrefillRate: 4000, StepSeconds: 0.02, SpeedAge: 2 * speedFade}},
	}
	for i, s := range Pick(req, old, Config{}, true).Scored {
		if s.Prediction.Rate != 4000 || s.Prediction.StepSeconds != 0.02 {
			t.Errorf("all stale, candidate %d: rate %v step %v, want the median 4000 and 0.02", i, s.Prediction.Rate, s.Prediction.StepSeconds)
		}
	}
}
