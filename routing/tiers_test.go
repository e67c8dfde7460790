package routing

import "testing"

// TestPickOffloadedTiers: blocks an engine keeps in its CPU or storage
// tier past its GPU match are credited at their tiers' weights, never
// past the prompt, and only for precise matches; the weights decide
// between a GPU holder that is busy and an idle engine holding the prefix
// on CPU.
func TestPickOffloadedTiers(t *testing.T) {
	req := Request{PromptTokens: 1600, BlockSize: 16, TotalBlocks: 100}
	idle := func(dial string) Candidate {
		return Candidate{Dial: dial, Tier: Precise, LoadKnown: true}
	}
	tests := []struct {
		name        string
		c           Candidate
		cfg         Config
		cpu, stored int     // credited blocks
		prefill     float64 // the request's own uncached tokens there
	}{
		{"GPU only", Candidate{MatchedBlocks: 40}, Config{}, 0, 0, 1600 - 640},
		{"CPU continues GPU", Candidate{MatchedBlocks: 40, CPUBlocks: 20}, Config{}, 20, 0, 1600 - 640 - 0.75*320},
		{"then storage", Candidate{MatchedBlocks: 40, CPUBlocks: 20, StorageBlocks: 20}, Config{}, 20, 20, 1600 - 640 - 0.75*320 - 0.25*320},
		{"CPU only", Candidate{CPUBlocks: 100}, Config{}, 100, 0, 1600 - 0.75*1600},
		{"clamped to the prompt", Candidate{MatchedBlocks: 90, CPUBlocks: 30, StorageBlocks: 30}, Config{}, 10, 0, 1600 - 1440 - 0.75*160},
		{"weights off", Candidate{MatchedBlocks: 40, CPUBlocks: 20, StorageBlocks: 20}, Config{CPUTierWeight: -1, StorageTierWeight: -1}, 20, 20, 1600 - 640},
		{"full weight", Candidate{CPUBlocks: 50}, Config{CPUTierWeight: 1}, 50, 0, 800},
		{"bad counts", Candidate{MatchedBlocks: 10, CPUBlocks: -5, StorageBlocks: -1}, Config{}, 0, 0, 1600 - 160},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := idle("a")
			c.MatchedBlocks, c.CPUBlocks, c.StorageBlocks = tt.c.MatchedBlocks, tt.c.CPUBlocks, tt.c.StorageBlocks
			d := Pick(req, []Candidate{c}, tt.cfg, true)
			s := d.Scored[0]
			if s.CPUBlocks != tt.cpu || s.StorageBlocks != tt.stored || !near(s.Prediction.Prefill, tt.prefill) {
				t.Fatalf("credited %d CPU, %d storage blocks, prefill %.1f; want %d, %d, %.1f",
					s.CPUBlocks, s.StorageBlocks, s.Prediction.Prefill, tt.cpu, tt.stored, tt.prefill)
			}
		})
	}

	// An approximate match has no tiers: the counts are ignored.
	approx := idle("a")
	approx.Tier, approx.CPUBlocks = Approximate, 50
	if s := Pick(req, []Candidate{approx}, Config{}, true).Scored[0]; s.CPUBlocks != 0 {
		t.Fatalf("approximate candidate credited %d CPU blocks", s.CPUBlocks)
	}

	// A GPU holder with two long prompts queued ahead, an idle engine
	// holding nothing and an idle one holding the whole prefix on CPU:
	// the CPU copy wins, the cold engine being otherwise its equal.
	busy := idle("gpu")
	busy.MatchedBlocks, busy.Waiting = 100, 2
	busy.Work = Work{MeanUncached: 2000}
	cpu := idle("cpu")
	cpu.CPUBlocks = 100
	if d := Pick(req, []Candidate{busy, idle("cold"), cpu}, Config{}, false); d.Index != 2 {
		t.Fatalf("busy GPU holder, idle cold engine, idle CPU holder: picked %d, want the CPU holder", d.Index)
	}
}

// near: equal within a thousandth of a token.
func near(a, b float64) bool { return a-b < 1e-3 && b-a < 1e-3 }
