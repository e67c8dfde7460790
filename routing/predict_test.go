package routing

import (
	"math"
	"testing"
)

// TestPredict checks each part of a candidate's predicted time to first
// token against the package documentation's formula, on a 1,000-token
// prompt nobody holds.
func TestPredict(t *testing.T) {
	req := Request{PromptTokens: 1000, BlockSize: 16, TotalBlocks: 62}
	cases := []struct {
		name string
		c    Candidate
		want Prediction // the parts checked: ahead tokens, rate, slot, step, TTFT
	}{
		{"idle, cold start: the defaults", Candidate{LoadKnown: true},
			Prediction{Rate: 10000, StepSeconds: 0.025, TTFT: 0.1 + 0.025}},
		{"own pending prefill is ahead", Candidate{LoadKnown: true, Running: 1, Dispatched: 1,
			Work: Work{OwnPrefill: 3000, OwnPending: 2, PrefillRate: 5000, StepSeconds: 0.04}},
			// running 1 + dispatched 1 = 2 sequences, both ours pending: none decoding.
			Prediction{OwnAhead: 3000, Rate: 5000, StepSeconds: 0.04, TTFT: (3000+1000)/5000.0 + 0.04}},
		{"others' waiting requests at the engine's mean", Candidate{LoadKnown: true, Running: 4, Waiting: 3,
			Work: Work{OwnPending: 1, OwnPrefill: 100, MeanUncached: 2000}},
			// waiting 3, one of them ours: 2 foreign × 2000; 4 running + 3
			// waiting − 1 ours − 2 foreign = 4 decoding, a cost but no
			// part of the TTFT.
			Prediction{OwnAhead: 100, ForeignAhead: 4000, DecodeAhead: 4 * DefaultRunningWeight, Rate: 10000, StepSeconds: 0.025,
				TTFT: (100+4000+1000)/10000.0 + 0.025}},
		{"without gauges only our own work counts", Candidate{Inflight: 3,
			Work: Work{OwnPrefill: 500, OwnPending: 1, OwnDecoding: 2}},
			Prediction{OwnAhead: 500, DecodeAhead: 2 * DefaultRunningWeight, Rate: 10000, StepSeconds: 0.025, TTFT: (500+1000)/10000.0 + 0.025}},
		{"a full batch waits for slots at the drain rate", Candidate{LoadKnown: true, Running: 8, MaxInflight: 10, Dispatched: 1,
			Work: Work{OwnPending: 1, DrainRate: 4}},
			// load 9, +1 = 10, not over 10: no wait yet; 8 decoding.
			Prediction{DecodeAhead: 8 * DefaultRunningWeight, Rate: 10000, StepSeconds: 0.025, TTFT: 1000/10000.0 + 0.025}},
		{"the observed rate without the step each prefill ends with", Candidate{LoadKnown: true,
			Work: Work{PrefillRate: 5000, MeanUncached: 2000, StepSeconds: 0.04}},
			// A mean prefill took 2000 / 5000 = 0.4 s, of which one 0.04 s
			// step: 2000 tokens in 0.36 s.
			Prediction{Rate: 2000 / 0.36, StepSeconds: 0.04, TTFT: 1000/(2000/0.36) + 0.04}},
		{"half the mean prefill when it is under two steps", Candidate{LoadKnown: true,
			Work: Work{PrefillRate: 5000, MeanUncached: 300, StepSeconds: 0.04}},
			// A mean prefill took 0.06 s: 0.03 s of it is taken for the
			// step (300 tokens in 0.03 s) and added back, so a mean
			// request is predicted its 0.06 s, not 0.06 + 0.04.
			Prediction{Rate: 10000, StepSeconds: 0.03, TTFT: 1000/10000.0 + 0.03}},
		{"NaN and negative figures are unknown", Candidate{LoadKnown: true,
			Work: Work{OwnPrefill: math.NaN(), PrefillRate: -1, StepSeconds: math.Inf(1), MeanUncached: math.NaN()}},
			Prediction{Rate: 10000, StepSeconds: 0.025, TTFT: 0.125}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.Dial = "x:1"
			d := Pick(req, []Candidate{tc.c}, Config{}, true)
			got := d.Scored[0].Prediction
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
			if !near(got.OwnAhead, tc.want.OwnAhead) || !near(got.ForeignAhead, tc.want.ForeignAhead) ||
				!near(got.DecodeAhead, tc.want.DecodeAhead) || !near(got.Rate, tc.want.Rate) ||
				!near(got.SlotSeconds, tc.want.SlotSeconds) || !near(got.StepSeconds, tc.want.StepSeconds) ||
				!near(got.TTFT, tc.want.TTFT) || got.Prefill != 1000 {
				t.Fatalf("prediction %+v, want %+v", got, tc.want)
			}
			if !near(d.Predicted, got.TTFT) || d.Prefill != 1000 {
				t.Fatalf("decision predicted %v prefill %v, want the pick's %v and 1000", d.Predicted, d.Prefill, got.TTFT)
			}
			sum := got.AheadSeconds + got.PrefillSeconds + got.SlotSeconds + got.StepSeconds + got.PenaltySeconds
			if !near(sum, got.TTFT) {
				t.Fatalf("parts sum to %v, TTFT %v", sum, got.TTFT)
			}
		})
	}
}

// TestPredictSlotWait: past MaxInflight each request ahead waits one slot,
// at the engine's drain rate when known, else SlotSteps steps.
func TestPredictSlotWait(t *testing.T) {
	req := Request{PromptTokens: 1000}
	for _, tc := range []struct {
		drain, want float64
	}{{4, 2 / 4.0}, {0, 2 * DefaultSlotSteps * DefaultStepSeconds}} {
		// Load 11 (10 running + 1 dispatched) on a MaxInflight 10 engine
		// is saturated, so it is weighed through explain only.
		c := Candidate{Dial: "x:1", LoadKnown: true, Running: 9, Waiting: 2, MaxInflight: 10, Work: Work{DrainRate: tc.drain}}
		got := Pick(req, []Candidate{c}, Config{}, true).Scored[0].Prediction.SlotSeconds
		if math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("drain %v: slot wait %v, want %v", tc.drain, got, tc.want)
		}
	}
}

// TestPickSeesLongPrefills is issue 39's case: two engines with the same
// request counts, one prefilling long prompts this gateway sent it; the
// request-count rule could not tell them apart.
func TestPickSeesLongPrefills(t *testing.T) {
	req := Request{PromptTokens: 2048, Key: 42}
	busy := Candidate{Dial: "busy:1", LoadKnown: true, Running: 2, Work: Work{OwnPrefill: 2 * 2300, OwnPending: 2}}
	light := Candidate{Dial: "light:1", LoadKnown: true, Running: 2, Work: Work{OwnDecoding: 2}}
	for _, order := range [][]Candidate{{busy, light}, {light, busy}} {
		d := Pick(req, order, Config{}, false)
		if d.Index < 0 || order[d.Index].Dial != "light:1" {
			t.Fatalf("picked %d of %v, want light", d.Index, order)
		}
	}
}

// TestPredictBorrowsPeerSpeeds: a candidate whose engine has shown no
// speed of its own is predicted with its peers' median rate and step, not
// the cold-start defaults, so it ties with them instead of losing every
// request at light load (and so never showing its speed). Its own figures,
// when it has them, stay its own; without any measured peer the defaults
// apply.
func TestPredictBorrowsPeerSpeeds(t *testing.T) {
	req := Request{PromptTokens: 1000, BlockSize: 16, TotalBlocks: 62}
	fast := func(dial string, rate float64) Candidate {
		return Candidate{Dial: dial, LoadKnown: true, Work: Work{PrefillRate: rate, MeanUncached: 1000, StepSeconds: 0.01}}
	}
	cold := Candidate{Dial: "cold:1", LoadKnown: true}
	d := Pick(req, []Candidate{fast("a:1", 20000), fast("b:1", 30000), fast("c:1", 40000), cold}, Config{}, true)
	median, got := d.Scored[1].Prediction, d.Scored[3].Prediction
	if math.Abs(got.TTFT-median.TTFT) > 1e-12 || got.Rate != median.Rate || got.StepSeconds != median.StepSeconds {
		t.Fatalf("cold candidate predicted %+v, want the median peer's %+v", got, median)
	}
	// Its own step stays its own.
	cold.Work.StepSeconds = 0.05
	d = Pick(req, []Candidate{fast("a:1", 20000), cold}, Config{}, true)
	if got := d.Scored[1].Prediction; got.StepSeconds > 0.05+1e-12 || got.Rate == DefaultPrefillRate {
		t.Fatalf("cold candidate with its own step: %+v", got)
	}
	// Without measured peers: the defaults.
	d = Pick(req, []Candidate{{Dial: "x:1", LoadKnown: true}, {Dial: "y:1", LoadKnown: true}}, Config{}, true)
	if got := d.Scored[0].Prediction; got.Rate != DefaultPrefillRate || got.StepSeconds != DefaultStepSeconds {
		t.Fatalf("no measured peer: %+v, want the defaults", got)
	}
}

// TestPickPrefersPrefillAboutToEnd: of two engines each prefilling one
// prompt of this gateway's, the one whose first token is due soonest is
// the shorter wait, although the tokens pending are the same; without a
// due time the tokens decide.
func TestPickPrefersPrefillAboutToEnd(t *testing.T) {
	req := Request{PromptTokens: 2048, Key: 42}
	work := Work{OwnPrefill: 2300, OwnPending: 1, PrefillRate: 10000, StepSeconds: 0.02, MeanUncached: 2300}
	ending, starting := work, work
	ending.OwnDueSeconds, starting.OwnDueSeconds = 0.02, 0.25
	for _, order := range [][]Candidate{
		{{Dial: "ending:1", Work: ending}, {Dial: "starting:1", Work: starting}},
		{{Dial: "starting:1", Work: starting}, {Dial: "ending:1", Work: ending}},
	} {
		d := Pick(req, order, Config{}, true)
		if d.Index < 0 || order[d.Index].Dial != "ending:1" {
			t.Fatalf("picked %d of %v, want ending", d.Index, order)
		}
		for _, s := range d.Scored {
			want := 0.25
			if s.Dial == "ending:1" {
				want = 0.02
			}
			if math.Abs(s.Prediction.AheadSeconds-want) > 1e-9 {
				t.Errorf("%s: ahead %v s, want its due time %v", s.Dial, s.Prediction.AheadSeconds, want)
			}
		}
	}
	ending.OwnDueSeconds = 0
	d := Pick(req, []Candidate{{Dial: "ending:1", Work: ending}}, Config{}, true)
	if got, want := d.Scored[0].Prediction.AheadSeconds, d.Scored[0].Prediction.OwnAhead/d.Scored[0].Prediction.Rate; math.Abs(got-want) > 1e-9 {
		t.Errorf("without a due time: ahead %v, want pending tokens over the rate %v", got, want)
	}
}
