package fleetsim

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestReadTraceErrors(t *testing.T) {
	ok := `{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}`
	cases := []struct {
		name, trace string
		lim         TraceLimits
		want        string // in the error
	}{
		{"not json", "hello\n", TraceLimits{}, "line 1: not a trace record"},
		{"trailing", ok + " {}\n", TraceLimits{}, "trailing data"},
		{"wrong type", `{"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}`, TraceLimits{}, "not a trace record"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, TraceLimits{}, "negative timestamp"},
		{"no input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, TraceLimits{}, "input_length 0"},
		{"no output", `{"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": [1]}`, TraceLimits{}, "output_length 0"},
		{"too few ids", `{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}`, TraceLimits{}, "1 hash_ids for input_length 513, want 2"},
		{"too many ids", `{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}`, TraceLimits{}, "want 1"},
		{"input limit", ok, TraceLimits{MaxInputTokens: 599}, "input_length 600 outside 1..599"},
		{"output limit", ok, TraceLimits{MaxOutputTokens: 9}, "output_length 10 outside 1..9"},
		{"out of order", strings.Replace(ok, `"timestamp": 0`, `"timestamp": 5`, 1) + "\n" + ok, TraceLimits{}, "line 2: timestamp 0 before the previous line's 5"},
		{"request limit", ok + "\n" + ok + "\n", TraceLimits{MaxRequests: 1}, "line 2: more than 1 requests"},
		{"line limit", ok, TraceLimits{MaxLineBytes: 20}, "line 1: longer than 20 bytes"},
		{"byte limit", ok + "\n" + ok + "\n", TraceLimits{MaxBytes: int64(len(ok)) + 5}, "larger than"},
		{"empty", "\n\n", TraceLimits{}, "no requests"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(c.trace), c.lim)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestReadTraceAndCeiling(t *testing.T) {
	// Request 2 shares request 1's first block only; request 3 repeats
	// request 1 whole, but its third block (id 9) is new and its fourth
	// (id 2) has been seen, though not as a leading block: it is no hit.
	trace := `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}

{"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [1, 3]}
{"timestamp": 4000, "input_length": 1600, "output_length": 9, "hash_ids": [1, 2, 9, 2]}
`
	reqs, err := ReadTrace(strings.NewReader(trace), TraceLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 || reqs[1].Timestamp != 1500 || reqs[2].InputLength != 1600 || reqs[1].OutputLength != 7 || len(reqs[2].HashIDs) != 4 {
		t.Fatalf("reqs = %+v", reqs)
	}
	c := Ceiling(reqs)
	// Blocks: 2 + 2 + 4; hits: request 2's id 1, request 3's ids 1 and 2.
	if c.Blocks != 8 || c.HitBlocks != 3 || c.BlockRate != 3.0/8 {
		t.Errorf("blocks %d hit %d rate %v, want 8, 3, 0.375", c.Blocks, c.HitBlocks, c.BlockRate)
	}
	// Tokens: 1000 + 600 + 1600; hits 512 + 512 + 512.
	if c.Tokens != 3200 || c.HitTokens != 1536 {
		t.Errorf("tokens %d hit %d, want 3200, 1536", c.Tokens, c.HitTokens)
	}
	if c.DistinctBlocks != 4 || c.Seconds != 4 || c.Requests != 3 {
		t.Errorf("distinct %d seconds %v requests %d, want 4, 4, 3", c.DistinctBlocks, c.Seconds, c.Requests)
	}
}

// TestPooledCeiling: with room for every block the pooled LRU is the
// infinite ceiling; with none it hits nothing; with two blocks the third
// request's leading blocks 1 and 2 were pushed out by 1, 3 (request 2
// touched 1 and 3 last, so 2 is gone and 1 alone hits).
func TestPooledCeiling(t *testing.T) {
	reqs := []TraceRequest{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 1, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 3}},
		{Timestamp: 2, InputLength: 1536, OutputLength: 1, HashIDs: []uint64{1, 2, 4}},
	}
	inf := Ceiling(reqs)
	if got := PooledCeiling(reqs, 100); got.HitBlocks != inf.HitBlocks || got.HitTokens != inf.HitTokens || got.DistinctBlocks != inf.DistinctBlocks {
		t.Errorf("ample pool: %+v, want the infinite ceiling %+v", got, inf)
	}
	if got := PooledCeiling(reqs, 0); got.HitBlocks != 0 {
		t.Errorf("empty pool hit %d blocks", got.HitBlocks)
	}
	// Blocks: 2 + 2 + 3 = 7; request 2 hits 1; request 3 hits 1 only.
	if got := PooledCeiling(reqs, 2); got.HitBlocks != 2 || got.Blocks != 7 || got.BlockRate != 2.0/7 {
		t.Errorf("two-block pool: %+v, want 2 of 7 blocks", got)
	}
}

// TestOptimalCeiling: on TestPooledCeiling's trace with two blocks, MIN
// keeps 1 and 2 and never stores 3 (not used again), so request 2 hits
// 1 and request 3 hits 1 and 2: 3 of 7 blocks where LRU found 2. With
// room for every block it is the infinite ceiling; with none, nothing.
func TestOptimalCeiling(t *testing.T) {
	reqs := []TraceRequest{
		{Timestamp: 0, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 2}},
		{Timestamp: 1, InputLength: 1024, OutputLength: 1, HashIDs: []uint64{1, 3}},
		{Timestamp: 2, InputLength: 1300, OutputLength: 1, HashIDs: []uint64{1, 2, 4}},
	}
	if got := OptimalCeiling(reqs, 2); got.HitBlocks != 3 || got.Blocks != 7 || got.HitTokens != 3*512 || got.Tokens != 3348 {
		t.Errorf("two blocks: %+v, want 3 of 7 blocks, 1536 of 3348 tokens", got)
	}
	inf := Ceiling(reqs)
	if got := OptimalCeiling(reqs, 100); got.HitBlocks != inf.HitBlocks || got.HitTokens != inf.HitTokens {
		t.Errorf("ample: %+v, want the infinite ceiling %+v", got, inf)
	}
	if got := OptimalCeiling(reqs, 0); got.HitBlocks != 0 || got.Blocks != 7 {
		t.Errorf("no room: %+v, want 0 of 7 blocks", got)
	}
}

// TestOptimalCeilingBounds: on a random trace of shared prefixes MIN
// finds at least what LRU does and at most every block seen before (the
// ceiling without the prefix rule), more as the capacity grows, and all
// of those with room for every block.
func TestOptimalCeilingBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var reqs []TraceRequest
	for i := 0; i < 400; i++ {
		n := 1 + rng.IntN(6)
		ids := make([]uint64, n)
		root := uint64(rng.IntN(30))
		for j := range ids {
			ids[j] = root*100 + uint64(j)
			if j > 1 && rng.IntN(2) == 0 {
				ids[j] = uint64(1000 + i*10 + j) // a block of its own
			}
		}
		reqs = append(reqs, TraceRequest{Timestamp: int64(i), InputLength: n * TraceBlockTokens, OutputLength: 1, HashIDs: ids})
	}
	inf := Ceiling(reqs)
	seen := inf.Blocks - int64(inf.DistinctBlocks)
	prev := int64(-1)
	for _, c := range []int{0, 5, 20, 60, 200, 1000} {
		opt, lru := OptimalCeiling(reqs, c), PooledCeiling(reqs, c)
		if opt.HitBlocks < lru.HitBlocks || opt.HitBlocks > seen || opt.HitBlocks < prev {
			t.Errorf("capacity %d: MIN %d blocks, LRU %d, seen before %d, smaller capacity %d", c, opt.HitBlocks, lru.HitBlocks, seen, prev)
		}
		prev = opt.HitBlocks
	}
	if prev != seen || seen <= inf.HitBlocks {
		t.Errorf("ample capacity: MIN %d blocks, want every block seen before, %d (more than the %d leading ones)", prev, seen, inf.HitBlocks)
	}
}
