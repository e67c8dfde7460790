package routing

import (
	"fmt"
	"testing"
)

// benchCands is a realistic fleet: a few replicas hold part of the prompt,
// loads and KV usage vary.
func benchCands(n int) []Candidate {
	cands := make([]Candidate, n)
	for i := range cands {
		cands[i] = Candidate{
			Dial:          fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1),
			MatchedBlocks: (i * 7) % 63,
			Running:       float64(i % 17),
			Waiting:       float64(i % 3),
			Inflight:      int64(i % 11),
			Dispatched:    int64(i % 2),
			KVUsage:       float64(i%10) / 12,
			MaxInflight:   64,
			LoadKnown:     true,
		}
		if i%5 == 0 {
			cands[i].Tier = Approximate
		}
	}
	return cands
}

// withSpeeds gives every candidate speeds of its own, of several ages,
// as engines that have served traffic show (the peers' median, and each
// engine's fade into it, then have work to do).
func withSpeeds(cands []Candidate) []Candidate {
	for i := range cands {
		cands[i].Work = Work{PrefillRate: 9000 + float64(i*37%1000), StepSeconds: 0.02 + float64(i%7)/1000,
			MeanUncached: 1000, SpeedAge: float64(i % 20)}
	}
	return cands
}

func benchPick(b *testing.B, cands []Candidate, explain bool) {
	var cfg Config
	cfg.SetDefaults()
	req := prompt1000
	b.ReportAllocs()
	for b.Loop() {
		req.Key++
		if d := Pick(req, cands, cfg, explain); d.Index < 0 {
			b.Fatal("no pick")
		}
	}
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{8, 64, 256} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) { benchPick(b, benchCands(n), false) })
	}
	b.Run("n=8/explain", func(b *testing.B) { benchPick(b, benchCands(8), true) })
	b.Run("n=64/speeds", func(b *testing.B) { benchPick(b, withSpeeds(benchCands(64)), false) })
}

func BenchmarkRendezvous64(b *testing.B) {
	ds := dials(64)
	ks := keys(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if Rendezvous(ks[i%len(ks)], ds) < 0 {
			b.Fatal("no dial")
		}
		i++
	}
}

func BenchmarkLeastLoaded64(b *testing.B) {
	cands := benchCands(64)
	b.ReportAllocs()
	for b.Loop() {
		if LeastLoaded(cands) < 0 {
			b.Fatal("none")
		}
	}
}

func BenchmarkBreakerAllow(b *testing.B) {
	br := NewBreaker(BreakerConfig{})
	ds := dials(64)
	br.Failure(ds[0], t0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		br.Allow(ds[i%len(ds)], t0)
		i++
	}
}
