package routing

import (
	"fmt"
	"math"
	"testing"
)

// prompt1000 is the package doc's example prompt: 1,000 tokens, 62 full
// blocks of 16 plus an 8-token tail.
var prompt1000 = Request{PromptTokens: 1000, BlockSize: 16, TotalBlocks: 62, Key: 42}

// prompt4000 is a prompt of exactly 250 full blocks.
var prompt4000 = Request{PromptTokens: 4000, BlockSize: 16, TotalBlocks: 250, Key: 42}

// dispatched is a holder with 2 running, the given waiting, and n requests
// sent since the last scrape.
// dispatched is a holder of matched blocks running 2 and queueing waiting
// requests, to which this gateway has sent n more since the scrape, each
// with 512 uncached tokens still to prefill (recorded as its work).
func dispatched(matched int, waiting float64, n int64) Candidate {
	c := withLoad(idle("a:1", matched), 2, waiting)
	c.Dispatched, c.Inflight = n, n
	c.Work = Work{OwnPrefill: 512 * float64(n), OwnPending: n}
	return c
}

func idle(dial string, matched int) Candidate {
	return Candidate{Dial: dial, MatchedBlocks: matched, LoadKnown: true}
}

func withLoad(c Candidate, running, waiting float64) Candidate {
	c.Running, c.Waiting = running, waiting
	return c
}

func TestPick(t *testing.T) {
	sat := withLoad(idle("a:1", 60), 3, 1)
	sat.MaxInflight = 4
	kvFull := withLoad(idle("a:1", 60), 1, 0)
	kvFull.KVUsage = 0.97
	down := idle("a:1", 60)
	down.Unavailable = "breaker_open"
	approx := idle("a:1", 40)
	approx.Tier = Approximate
	unknownBusy := Candidate{Dial: "a:1", MatchedBlocks: 10, Inflight: 6}
	unknownIdle := Candidate{Dial: "b:1", MatchedBlocks: 10}

	tests := []struct {
		name    string
		req     Request
		cands   []Candidate
		cfg     Config
		want    int
		outcome Outcome
		tier    Tier
		share   float64
		// excluded[i] is the expected Scored[i].Excluded.
		excluded map[int]string
	}{
		{
			name:    "longest prefix wins at equal load",
			req:     prompt1000,
			cands:   []Candidate{withLoad(idle("a:1", 10), 2, 0), withLoad(idle("b:1", 40), 2, 0), withLoad(idle("c:1", 20), 2, 0)},
			want:    1,
			outcome: Hit, tier: Precise, share: 40.0 / 62,
		},
		{
			name:    "more loaded holder loses when the saved prefix is small",
			req:     prompt1000,
			cands:   []Candidate{withLoad(idle("a:1", 8), 2, 2), idle("b:1", 0)},
			want:    1,
			outcome: OverriddenByLoad, tier: LoadOnly, share: 0,
		},
		{
			name:    "more loaded holder wins when the saved prefix is large",
			req:     prompt1000,
			cands:   []Candidate{withLoad(idle("a:1", 60), 2, 1), idle("b:1", 0)},
			want:    0,
			outcome: Hit, tier: Precise, share: 60.0 / 62,
		},
		{
			name:    "saturated holder spills",
			req:     prompt1000,
			cands:   []Candidate{sat, withLoad(idle("b:1", 0), 3, 0)},
			want:    1,
			outcome: OverriddenByLoad, tier: LoadOnly,
			excluded: map[int]string{0: ExcludedSaturated},
		},
		{
			name:    "holder with a full KV cache spills",
			req:     prompt1000,
			cands:   []Candidate{kvFull, idle("b:1", 0)},
			want:    1,
			outcome: OverriddenByLoad, tier: LoadOnly,
			excluded: map[int]string{0: ExcludedKVFull},
		},
		{
			name:    "unavailable holder is skipped and does not count as a hit elsewhere",
			req:     prompt1000,
			cands:   []Candidate{down, idle("b:1", 0)},
			want:    1,
			outcome: Miss, tier: LoadOnly,
			excluded: map[int]string{0: "breaker_open"},
		},
		{
			name: "bounded load excludes a hot holder",
			req:  prompt1000,
			cands: []Candidate{
				withLoad(idle("a:1", 62), 50, 0), withLoad(idle("b:1", 0), 10, 0),
				withLoad(idle("c:1", 0), 10, 0), withLoad(idle("d:1", 0), 10, 0),
			},
			cfg:     Config{ImbalanceThreshold: -1}, // isolate the bounded-load rule
			want:    -2,                             // any of 1..3
			outcome: OverriddenByLoad, tier: LoadOnly,
			excluded: map[int]string{0: ExcludedBoundedLoad},
		},
		{
			name: "bounded load boundary: just under the cap the holder keeps it",
			req:  prompt4000,
			cands: []Candidate{
				withLoad(idle("a:1", 250), 49, 0), withLoad(idle("b:1", 0), 10, 0),
				withLoad(idle("c:1", 0), 10, 0), withLoad(idle("d:1", 0), 10, 0),
			},
			cfg:     Config{ImbalanceThreshold: -1},
			want:    0, // mean (79+1)/4 = 20, cap 2.5×20 = 50, 49+1 <= 50
			outcome: Hit, tier: Precise, share: 1,
		},
		{
			name: "bounded load boundary: one more and it spills",
			req:  prompt4000,
			cands: []Candidate{
				withLoad(idle("a:1", 250), 50, 0), withLoad(idle("b:1", 0), 10, 0),
				withLoad(idle("c:1", 0), 10, 0), withLoad(idle("d:1", 0), 10, 0),
			},
			cfg:     Config{ImbalanceThreshold: -1},
			want:    -2, // mean 81/4 = 20.25, cap 50.625, 50+1 > cap
			outcome: OverriddenByLoad, tier: LoadOnly,
			excluded: map[int]string{0: ExcludedBoundedLoad},
		},
		{
			// Under the request-count rule dispatched requests cost 32
			// each here, as running; now they cost their recorded work.
			name: "dispatched since the scrape that share the prefix cost only their tails",
			req:  prompt1000,
			cands: []Candidate{func() Candidate {
				c := dispatched(40, 0, 3)
				c.Work.OwnPrefill = 3 * 40
				return c
			}(), idle("b:1", 0)},
			// TTFT (120 + 360) / 10000 + 0.025 = 0.073 s against b's 0.125 s;
			// costs add 2 decoding × 64 / 10000 and the prefill again.
			want:    0,
			outcome: Hit, tier: Precise, share: 40.0 / 62,
		},
		{
			// The case the request-count rule got wrong: three long
			// unique prompts just sent to the holder put 4,800 tokens
			// ahead of the request there.
			name: "dispatched long prefills outweigh a held prefix",
			req:  prompt1000,
			cands: []Candidate{func() Candidate {
				c := dispatched(40, 0, 3)
				c.Work.OwnPrefill = 3 * 1600
				return c
			}(), idle("b:1", 0)},
			want:    1, // TTFT (4800 + 360) / 10000 + 0.025 = 0.541 s > 0.125 s
			outcome: OverriddenByLoad, tier: LoadOnly,
		},
		{
			name:  "dispatched since the scrape count as queued when the engine was queueing",
			req:   prompt1000,
			cands: []Candidate{dispatched(40, 1, 3), idle("b:1", 0)},
			// Tokens ahead at a: its 1 waiting request (not ours: our 3
			// are not in the gauges yet) at 512, our 3 pending at 512
			// each: TTFT (512 + 1536 + 360) / 10000 s + one step = 0.266 s
			// > b's 1000 / 10000 + 0.025 = 0.125 s; costs add the 2
			// decoding (64 each) and the prefills again for the fleet.
			want:    1,
			outcome: OverriddenByLoad, tier: LoadOnly,
		},
		{
			name: "bounded load leaves a lightly loaded holder alone",
			req:  prompt1000,
			cands: []Candidate{
				withLoad(idle("a:1", 62), 7, 0), idle("b:1", 0), idle("c:1", 0), idle("d:1", 0),
			},
			want:    0,
			outcome: Hit, tier: Precise, share: 1,
		},
		{
			name: "imbalance routes on load alone",
			req:  Request{PromptTokens: 4000, BlockSize: 16, TotalBlocks: 250},
			cands: []Candidate{
				withLoad(idle("a:1", 240), 40, 0), withLoad(idle("b:1", 0), 5, 0),
			},
			cfg:     Config{Epsilon: -1},
			want:    1,
			outcome: OverriddenByLoad, tier: LoadOnly,
		},
		{
			name: "without the imbalance rule the same holder keeps the request",
			req:  Request{PromptTokens: 4000, BlockSize: 16, TotalBlocks: 250},
			cands: []Candidate{
				withLoad(idle("a:1", 240), 40, 0), withLoad(idle("b:1", 0), 5, 0),
			},
			cfg:     Config{Epsilon: -1, ImbalanceThreshold: -1},
			want:    0,
			outcome: Hit, tier: Precise, share: 240.0 / 250,
		},
		{
			name:    "precise match beats an equal approximate one",
			req:     prompt1000,
			cands:   []Candidate{approx, idle("b:1", 40)},
			want:    1,
			outcome: Hit, tier: Precise, share: 40.0 / 62,
		},
		{
			name:    "approximate holder wins over nobody",
			req:     prompt1000,
			cands:   []Candidate{approx, idle("b:1", 0)},
			want:    0,
			outcome: Hit, tier: Approximate, share: 40.0 / 62,
		},
		{
			name:    "unknown load falls back to our in-flight count",
			req:     prompt1000,
			cands:   []Candidate{unknownBusy, unknownIdle},
			want:    1,
			outcome: Hit, tier: Precise, share: 10.0 / 62,
		},
		{
			name:    "cache key tier on a miss",
			req:     Request{PromptTokens: 1000, BlockSize: 16, TotalBlocks: 62, Key: 7, CacheKey: true},
			cands:   []Candidate{idle("a:1", 0), withLoad(idle("b:1", 0), 1, 0)},
			want:    0,
			outcome: Miss, tier: CacheKey,
		},
		{
			name:    "match longer than the prompt is clamped",
			req:     prompt1000,
			cands:   []Candidate{idle("a:1", 500), idle("b:1", 61)},
			want:    0,
			outcome: Hit, tier: Precise, share: 1,
		},
		{
			name:    "no prompt size: matches are meaningless, load decides",
			req:     Request{},
			cands:   []Candidate{withLoad(idle("a:1", 5), 1, 0), idle("b:1", 0)},
			want:    1,
			outcome: Miss, tier: LoadOnly,
		},
		{
			name:    "share from TotalBlocks when BlockSize is unknown",
			req:     Request{PromptTokens: 1000, TotalBlocks: 10},
			cands:   []Candidate{idle("a:1", 5), idle("b:1", 2)},
			want:    0,
			outcome: Hit, tier: Precise, share: 0.5,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Pick(tc.req, tc.cands, tc.cfg, true)
			switch {
			case tc.want == -2:
				if d.Index <= 0 {
					t.Fatalf("Index = %d, want a non-holder", d.Index)
				}
			case d.Index != tc.want:
				t.Fatalf("Index = %d, want %d; scored %+v", d.Index, tc.want, d.Scored)
			}
			if d.Outcome != tc.outcome || d.Tier != tc.tier {
				t.Errorf("Outcome, Tier = %v, %v; want %v, %v", d.Outcome, d.Tier, tc.outcome, tc.tier)
			}
			if math.Abs(d.Share-tc.share) > 1e-12 {
				t.Errorf("Share = %v, want %v", d.Share, tc.share)
			}
			for i, s := range d.Scored {
				if s.Excluded != tc.excluded[i] {
					t.Errorf("Scored[%d].Excluded = %q, want %q", i, s.Excluded, tc.excluded[i])
				}
			}
			// The fast path must agree with the explained one.
			fast := Pick(tc.req, tc.cands, tc.cfg, false)
			if fast.Scored != nil || fast.Index != d.Index || fast.Outcome != d.Outcome || fast.Tier != d.Tier || fast.Share != d.Share {
				t.Errorf("fast path %+v differs from explained %+v", fast, d)
			}
		})
	}
}

// TestPickCrossover sweeps the holder's prefix against one queued request
// not of this gateway (QueueWeight 512 tokens ahead): the idle replica
// wins below the crossover, the holder above it, and the switch happens
// exactly once, where the package doc says. A saved token counts
// PrefixWeight + WorkWeight = 2 times (once in the predicted TTFT, once
// for the fleet's work), so 256 saved tokens (16 blocks) buy the 512
// queued ones; under the request-count rule it took 512 (32 blocks).
func TestPickCrossover(t *testing.T) {
	var cfg Config
	cfg.SetDefaults()
	crossTokens := cfg.QueueWeight * 1 / (cfg.PrefixWeight + cfg.WorkWeight) // one waiting request
	switched := -1
	for m := 0; m <= 62; m++ {
		cands := []Candidate{withLoad(idle("holder:1", m), 0, 1), idle("idle:1", 0)}
		d := Pick(prompt1000, cands, Config{}, true)
		saved := float64(m * 16)
		switch {
		case saved < crossTokens-cfg.TieTokens:
			if d.Index != 1 || (m > 0 && d.Outcome != OverriddenByLoad) {
				t.Fatalf("m=%d saved %v tokens: Index %d Outcome %v, want the idle replica, overridden", m, saved, d.Index, d.Outcome)
			}
		case saved > crossTokens+cfg.TieTokens:
			if d.Index != 0 || d.Outcome != Hit {
				t.Fatalf("m=%d saved %v tokens: Index %d Outcome %v, want the holder, hit", m, saved, d.Index, d.Outcome)
			}
			if switched < 0 {
				switched = m
			}
		}
		t.Logf("matched %2d blocks: holder cost %7.4f, idle cost %7.4f -> %s (%v)", m, d.Scored[0].Cost, d.Scored[1].Cost, cands[max(d.Index, 0)].Dial, d.Outcome)
	}
	if switched != 17 {
		t.Fatalf("holder first wins clearly at %d blocks, want 17 (512 tokens / 2 / 16 + 1)", switched)
	}
}

func TestPickEmptyAndAllExcluded(t *testing.T) {
	d := Pick(prompt1000, nil, Config{}, true)
	if d.Index != -1 || d.Outcome != Miss || d.Tier != LoadOnly || d.Scored != nil {
		t.Fatalf("empty: %+v", d)
	}

	full := func(dial string, matched int) Candidate {
		c := withLoad(idle(dial, matched), 8, 0)
		c.MaxInflight = 8
		return c
	}
	down := idle("c:1", 0)
	down.Unavailable = "unhealthy"
	cands := []Candidate{full("a:1", 30), full("b:1", 0), down}
	d = Pick(prompt1000, cands, Config{}, true)
	if d.Index != -1 {
		t.Fatalf("all excluded: Index %d, want -1", d.Index)
	}
	if d.Outcome != OverriddenByLoad {
		t.Errorf("a saturated holder existed: Outcome %v, want overridden_by_load", d.Outcome)
	}
	for i, s := range d.Scored {
		if s.Excluded == "" {
			t.Errorf("Scored[%d] not excluded", i)
		}
	}
	// The fallback the caller uses ignores saturation but not availability.
	if i := LeastLoaded(cands); i != 0 && i != 1 {
		t.Errorf("LeastLoaded = %d, want 0 or 1", i)
	}

	cands[0].MatchedBlocks = 0
	if d := Pick(prompt1000, cands, Config{}, false); d.Index != -1 || d.Outcome != Miss {
		t.Errorf("all excluded, no holder: %+v, want -1/miss", d)
	}
}

// TestPickColdSpread: with no prefix anywhere and equal loads, keys spread
// evenly (chi-square over 4 replicas, 3 degrees of freedom, bound at
// p = 0.001) and each key sticks to its replica.
func TestPickColdSpread(t *testing.T) {
	cands := []Candidate{idle("10.0.0.1:8000", 0), idle("10.0.0.2:8000", 0), idle("10.0.0.3:8000", 0), idle("10.0.0.4:8000", 0)}
	const n = 4000
	counts := make([]int, len(cands))
	for k := range n {
		req := prompt1000
		req.Key = uint64(k) // consecutive keys: the worst case for a weak mix
		d := Pick(req, cands, Config{}, false)
		if d.Index < 0 || d.Outcome != Miss {
			t.Fatalf("key %d: %+v", k, d)
		}
		if again := Pick(req, cands, Config{}, false); again.Index != d.Index {
			t.Fatalf("key %d: picked %d then %d", k, d.Index, again.Index)
		}
		counts[d.Index]++
	}
	exp := float64(n) / float64(len(cands))
	chi2 := 0.0
	for _, c := range counts {
		chi2 += (float64(c) - exp) * (float64(c) - exp) / exp
	}
	t.Logf("counts %v chi2 %.2f", counts, chi2)
	if chi2 > 16.27 {
		t.Fatalf("cold keys not spread: counts %v, chi2 %.2f > 16.27", counts, chi2)
	}
}

// TestPickTieTolerance: a candidate a few token-equivalents dearer still
// takes its share of cold keys; one clearly dearer never does.
func TestPickTieTolerance(t *testing.T) {
	near := idle("b:1", 0)
	near.KVUsage = 0.05 // 1024 × 0.0025 = 2.56 token-equivalents
	far := withLoad(idle("c:1", 0), 1, 0)
	cands := []Candidate{idle("a:1", 0), near, far}
	counts := make([]int, 3)
	for k := range 300 {
		req := prompt1000
		req.Key = uint64(k)
		counts[Pick(req, cands, Config{}, false).Index]++
	}
	if counts[0] == 0 || counts[1] == 0 || counts[2] != 0 {
		t.Fatalf("counts %v: want a and b to share, c (32 dearer) never", counts)
	}
	counts = make([]int, 3)
	for k := range 300 {
		req := prompt1000
		req.Key = uint64(k)
		counts[Pick(req, cands, Config{TieTokens: -1}, false).Index]++
	}
	if counts[0] != 300 {
		t.Fatalf("exact ties only: counts %v, want all on a", counts)
	}
}

// TestPickZeroConfigIsDefaults: Pick fills defaults itself, and repairs
// out-of-range values instead of misbehaving.
func TestPickZeroConfigIsDefaults(t *testing.T) {
	var def Config
	def.SetDefaults()
	bad := Config{PrefixWeight: math.NaN(), QueueWeight: -3, ApproximateWeight: 7, KVLimit: 2, BoundedLoadMin: 0.2}
	cands := []Candidate{withLoad(idle("a:1", 33), 0, 1), idle("b:1", 0), withLoad(idle("c:1", 12), 3, 0)}
	a := Pick(prompt1000, cands, Config{}, true)
	b := Pick(prompt1000, cands, def, true)
	c := Pick(prompt1000, cands, bad, true)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("zero config %+v != defaults %+v", a, b)
	}
	if c.Index != a.Index {
		t.Fatalf("repaired config picked %d, defaults %d", c.Index, a.Index)
	}
}

func TestConfig(t *testing.T) {
	var c Config
	if err := c.Validate(); err != nil {
		t.Fatalf("zero config invalid: %v", err)
	}
	c.SetDefaults()
	want := Config{1, 0.7, 512, 64, 1, 10000, 0.025, 32, 1024, 0.95, 1.5, 8, 32, 8, 8192, 0.75, 0.25}
	if c != want {
		t.Fatalf("defaults %+v, want %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	ok := []Config{{Epsilon: -1}, {KVLimit: -1}, {ImbalanceThreshold: -1}, {TieTokens: -1}, {ApproximateWeight: 1}, {BoundedLoadMin: 1},
		{CPUTierWeight: -1}, {StorageTierWeight: 1}}
	for _, c := range ok {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	bad := []Config{
		{PrefixWeight: -1}, {QueueWeight: math.NaN()}, {RunningWeight: math.Inf(1)}, {KVWeight: -0.5},
		{ApproximateWeight: 1.5}, {ApproximateWeight: -0.1}, {KVLimit: 1.2}, {BoundedLoadMin: 0.5},
		{Epsilon: math.NaN()}, {TieTokens: math.Inf(-1)}, {AdapterWeight: -1},
		{CPUTierWeight: 1.5}, {StorageTierWeight: math.NaN()},
	}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

func TestLabels(t *testing.T) {
	for v, want := range map[fmt.Stringer]string{
		Precise: "precise", Approximate: "approximate", CacheKey: "cache_key", LoadOnly: "load_only", Tier(9): "unknown",
		Hit: "hit", Miss: "miss", OverriddenByLoad: "overridden_by_load", Outcome(-1): "unknown",
		AdapterNone: "none", AdapterRunning: "running", AdapterWaiting: "waiting", AdapterFreeSlot: "free_slot",
		AdapterNoSlot: "no_slot", Adapter(9): "unknown",
	} {
		if v.String() != want {
			t.Errorf("%#v.String() = %q, want %q", v, v.String(), want)
		}
	}
}

func TestLeastLoaded(t *testing.T) {
	if LeastLoaded(nil) != -1 {
		t.Fatal("empty: want -1")
	}
	down := Candidate{Dial: "x:1", Unavailable: "breaker_open"}
	if LeastLoaded([]Candidate{down}) != -1 {
		t.Fatal("all unavailable: want -1")
	}
	tests := []struct {
		name  string
		cands []Candidate
		want  int
	}{
		{"fewest in flight", []Candidate{{Dial: "a", Inflight: 3}, {Dial: "b", Inflight: 1}, {Dial: "c", Inflight: 2}}, 1},
		{"then fewest running+waiting", []Candidate{
			{Dial: "a", Inflight: 1, Running: 5, LoadKnown: true},
			{Dial: "b", Inflight: 1, Running: 2, Waiting: 1, LoadKnown: true},
			{Dial: "c", Inflight: 2},
		}, 1},
		{"gauges ignored when unknown", []Candidate{
			{Dial: "a", Inflight: 1, Running: 5, LoadKnown: true},
			{Dial: "b", Inflight: 1, Running: 9},
		}, 1},
		{"unavailable skipped", []Candidate{down, {Dial: "b", Inflight: 7}}, 1},
	}
	for _, tc := range tests {
		if got := LeastLoaded(tc.cands); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}

	// Ties rotate with the fleet's counters instead of sticking to one.
	seen := map[int]int{}
	for k := range int64(200) {
		cands := []Candidate{{Dial: "a", Inflight: k}, {Dial: "b", Inflight: k}, {Dial: "c", Inflight: k}, {Dial: "d", Inflight: k}}
		i := LeastLoaded(cands)
		if LeastLoaded(cands) != i {
			t.Fatal("not deterministic")
		}
		seen[i]++
	}
	if len(seen) != 4 {
		t.Fatalf("ties went to %v, want all four candidates", seen)
	}
}

// TestPickShowsSpeculative: explain shows how many of a candidate's
// matched blocks are speculative; they weigh as held blocks do, and a
// clamp to the prompt cuts them first.
func TestPickShowsSpeculative(t *testing.T) {
	for _, tc := range []struct {
		name                string
		matched, spec, want int
	}{
		{"all held", 40, 0, 0},
		{"partly predicted", 40, 30, 30},
		{"all predicted", 40, 40, 40},
		{"clamped to the prompt", 70, 20, 12}, // 62 blocks: 50 held, 12 of the 20
		{"clamp within the held", 200, 20, 0},
		{"more predicted than matched", 10, 30, 10},
		{"negative", 10, -3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := idle("a:1", tc.matched)
			c.Speculative = tc.spec
			held := idle("b:1", tc.matched)
			d := Pick(prompt1000, []Candidate{c, held}, Config{}, true)
			if got := d.Scored[0].SpeculativeBlocks; got != tc.want {
				t.Fatalf("speculative blocks %d, want %d", got, tc.want)
			}
			if d.Scored[0].Cost != d.Scored[1].Cost || d.Scored[1].SpeculativeBlocks != 0 {
				t.Fatalf("speculative blocks weigh differently: %+v", d.Scored)
			}
		})
	}
}

// TestPickAdapter: among engines equal otherwise, a LoRA adapter's request
// goes where the adapter runs, then where it waits, then where a slot is
// free; a prefix held elsewhere or a clearly busier engine can outweigh
// the adapter term, and explain shows it.
func TestPickAdapter(t *testing.T) {
	idle := func(dial string, a Adapter) Candidate {
		return Candidate{Dial: dial, Adapter: a, LoadKnown: true, Tier: Precise}
	}
	req := Request{PromptTokens: 1000, BlockSize: 16, TotalBlocks: 62}
	long := Request{PromptTokens: 4000, BlockSize: 16, TotalBlocks: 250}
	cases := []struct {
		name  string
		req   Request
		cands []Candidate
		want  string
	}{
		{"running first", req, []Candidate{idle("a", AdapterNoSlot), idle("b", AdapterFreeSlot), idle("c", AdapterWaiting), idle("d", AdapterRunning)}, "d"},
		{"then waiting", req, []Candidate{idle("a", AdapterNoSlot), idle("b", AdapterFreeSlot), idle("c", AdapterWaiting)}, "c"},
		{"then a free slot", req, []Candidate{idle("a", AdapterNoSlot), idle("b", AdapterFreeSlot)}, "b"},
		{"unknown costs nothing", req, []Candidate{idle("a", AdapterNoSlot), idle("b", AdapterNone)}, "b"},
		{"a held prefix beats the adapter term", long, []Candidate{
			func() Candidate { c := idle("holder", AdapterFreeSlot); c.MatchedBlocks = 250; return c }(),
			idle("runs-it", AdapterRunning),
		}, "holder"},
		{"a busier engine loses its adapter's requests", req, []Candidate{
			func() Candidate { c := idle("runs-it", AdapterRunning); c.Running, c.Waiting = 16, 8; return c }(),
			idle("free", AdapterFreeSlot),
		}, "free"},
		{"a little busier keeps them", req, []Candidate{
			func() Candidate { c := idle("runs-it", AdapterRunning); c.Running, c.Waiting = 16, 4; return c }(),
			idle("free", AdapterFreeSlot),
		}, "runs-it"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Pick(tc.req, tc.cands, Config{}, true)
			if d.Index < 0 || tc.cands[d.Index].Dial != tc.want {
				t.Fatalf("picked %d, want %s; scored %+v", d.Index, tc.want, d.Scored)
			}
			for i, sc := range d.Scored {
				// The adapter term is in token-equivalents, shown as
				// seconds at the cold-start prefill rate.
				want := DefaultAdapterWeight * tc.cands[i].Adapter.Share() / DefaultPrefillRate
				if sc.Adapter != tc.cands[i].Adapter || sc.AdapterCost != want {
					t.Errorf("%s: explained adapter %v cost %v, want %v %v", sc.Dial, sc.Adapter, sc.AdapterCost, tc.cands[i].Adapter, want)
				}
			}
		})
	}
}
