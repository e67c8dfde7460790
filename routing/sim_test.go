package routing

import "testing"

// simResult is what a hot-prefix simulation observed.
type simResult struct {
	picks      [4]int
	outcomes   map[Outcome]int
	firstSpill int // request number of the first pick that was not the holder; -1 if none
	holderPeak int // most requests the holder ever had at once
}

// simulateHotPrefix sends n requests sharing one prompt prefix, one per
// tick, to 4 replicas of which only replica 0 holds the prefix (60 of 62
// blocks). Load feeds back: every pick adds an in-flight request that
// finishes after 20 decode ticks plus one tick per 250 uncached prompt
// tokens, and the engines' gauges (running up to 16, the rest waiting) are
// scraped every 5 ticks, with Dispatched covering picks since the scrape.
// The spill targets never learn the prefix: the worst case for a hot spot.
func simulateHotPrefix(t *testing.T, cfg Config, n int) simResult {
	t.Helper()
	const (
		replicas    = 4
		maxSeqs     = 16
		scrapeEvery = 5
		decodeTicks = 20
	)
	req := prompt1000
	cands := make([]Candidate, replicas)
	for i := range cands {
		cands[i] = Candidate{Dial: [...]string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"}[i], LoadKnown: true}
	}
	cands[0].MatchedBlocks = 60
	ends := make([][]int, replicas) // finish tick of each in-flight request

	res := simResult{outcomes: map[Outcome]int{}, firstSpill: -1}
	for tick := range n {
		for i := range ends {
			live := ends[i][:0]
			for _, e := range ends[i] {
				if e > tick {
					live = append(live, e)
				}
			}
			ends[i] = live
			cands[i].Inflight = int64(len(live))
			if tick%scrapeEvery == 0 {
				cands[i].Running = float64(min(len(live), maxSeqs))
				cands[i].Waiting = float64(max(len(live)-maxSeqs, 0))
				cands[i].Dispatched = 0
			}
		}
		d := Pick(req, cands, cfg, false)
		if d.Index < 0 {
			t.Fatalf("request %d: no pick", tick)
		}
		res.picks[d.Index]++
		res.outcomes[d.Outcome]++
		if d.Index != 0 && res.firstSpill < 0 {
			res.firstSpill = tick
		}
		uncached := req.PromptTokens - cands[d.Index].MatchedBlocks*req.BlockSize
		ends[d.Index] = append(ends[d.Index], tick+decodeTicks+(uncached+249)/250)
		cands[d.Index].Inflight++
		cands[d.Index].Dispatched++
		res.holderPeak = max(res.holderPeak, len(ends[0]))
	}
	return res
}

// TestHotPrefixBoundedLoad: with the default rules the holder serves the
// majority of a popular prefix's traffic and all of it while lightly
// loaded, yet once it is loaded the other replicas get a real share:
// no starvation, no 100%.
func TestHotPrefixBoundedLoad(t *testing.T) {
	const n = 1000
	res := simulateHotPrefix(t, Config{}, n)
	t.Logf("defaults: picks %v, outcomes %v, first spill at request %d, holder peak %d in flight",
		res.picks, res.outcomes, res.firstSpill, res.holderPeak)

	if share := float64(res.picks[0]) / n; share <= 0.5 || share >= 0.95 {
		t.Errorf("holder share %.2f, want a majority but not (nearly) all", share)
	}
	for i := 1; i < 4; i++ {
		if share := float64(res.picks[i]) / n; share < 0.05 {
			t.Errorf("replica %d starved: share %.3f", i, share)
		}
	}
	if res.firstSpill < int(DefaultBoundedLoadMin) {
		t.Errorf("first spill at request %d: affinity broken before the holder ran %v requests", res.firstSpill, DefaultBoundedLoadMin)
	}
	if res.outcomes[Hit] != res.picks[0] || res.outcomes[OverriddenByLoad] != n-res.picks[0] {
		t.Errorf("outcomes %v do not match picks %v", res.outcomes, res.picks)
	}

	// Control: with both hot-spot rules off only the queue term spills
	// (once the holder's 16 batch slots fill up), so the holder carries
	// more, and more at once.
	off := simulateHotPrefix(t, Config{Epsilon: -1, ImbalanceThreshold: -1}, n)
	t.Logf("rules off: picks %v, holder peak %d in flight", off.picks, off.holderPeak)
	if off.picks[0] <= res.picks[0] || off.holderPeak <= res.holderPeak {
		t.Errorf("hot-spot rules changed nothing: holder %d picks / peak %d with them, %d / %d without",
			res.picks[0], res.holderPeak, off.picks[0], off.holderPeak)
	}
}
