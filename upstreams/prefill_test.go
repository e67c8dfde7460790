package upstreams

import (
	"math"
	"testing"
)

func TestPrefillEstimator(t *testing.T) {
	// s builds a sample from uncached tokens and prefill seconds (cached
	// tokens are added to prompt so that the difference is what counts).
	s := func(prompt, cached, secs float64) prefillSample {
		return prefillSample{prompt: prompt, cached: cached, secs: secs}
	}
	tests := []struct {
		name    string
		samples []prefillSample
		want    float64
		tol     float64 // relative; 0 = 1e-9 (the rate goes through log and exp)
	}{
		{name: "no samples", want: 0},
		{name: "one sample is only a baseline", samples: []prefillSample{s(1000, 0, 1)}, want: 0},
		{name: "first window sets the rate directly", samples: []prefillSample{s(1000, 200, 1), s(9000, 1200, 2)}, want: 7000},
		{
			name:    "cached tokens do not count",
			samples: []prefillSample{s(0, 0, 0), s(10000, 9000, 0.5)},
			want:    2000,
		},
		{
			name:    "no new prefill keeps the rate",
			samples: []prefillSample{s(0, 0, 0), s(5000, 0, 1), s(5000, 0, 1), s(5000, 0, 1)},
			want:    5000,
		},
		{
			name: "tokens before their prefill time: the window stays open until both moved",
			// prompt tokens counted at the first token, prefill time
			// observed at finish: the pair arrives in two scrapes.
			samples: []prefillSample{s(0, 0, 0), s(4000, 0, 0), s(4000, 0, 2)},
			want:    2000,
		},
		{
			name:    "hits ahead of prompt tokens (uncached went down) keep the window open",
			samples: []prefillSample{s(1000, 0, 0), s(1000, 500, 0.1), s(3000, 500, 0.5)},
			want:    1500 / 0.5,
		},
		{
			name:    "counter reset: new baseline, no sample, rate kept",
			samples: []prefillSample{s(0, 0, 0), s(6000, 0, 1), s(100, 0, 0.01), s(100, 0, 0.01)},
			want:    6000,
		},
		{
			name:    "prefill seconds reset alone is a reset too",
			samples: []prefillSample{s(0, 0, 0), s(6000, 0, 1), s(12000, 0, 0.5), s(18000, 0, 1.5)},
			want:    6000,
		},
		{
			name: "warm-up: a request's tokens ahead of its time do not stick",
			// Four requests of 2000 uncached tokens, 0.25 s each, one after
			// another. The first scrape sees the first request's time and
			// the second's tokens; the last sees only the last request's
			// time. Pooled, the windows give the exact 8000/s.
			samples: []prefillSample{s(0, 0, 0), s(4000, 0, 0.25), s(6000, 0, 0.5), s(8000, 0, 0.75), s(8000, 0, 1)},
			want:    8000,
		},
		{
			name: "warm-up ends once the windows pooled prefillTau of prefill",
			// 10 s pooled at 10000, then 10 s at 5000 smoothed with weight
			// 1 − e^-1, where pooling would have given 7500.
			samples: []prefillSample{s(0, 0, 0), s(5e4, 0, 5), s(1e5, 0, 10), s(1.5e5, 0, 20)},
			want:    1e4 * math.Pow(0.5, 1-math.Exp(-1)),
		},
		{
			name: "after warm-up a short outlier window barely moves the rate",
			// 10 s of prefill at 10000 tok/s, then 0.01 s claiming 1000x
			// (many prompts' tokens, few of their prefill times).
			samples: []prefillSample{s(0, 0, 0), s(1e5, 0, 10), s(1e5+1e6, 0, 10.01)},
			want:    10000, tol: 0.01,
		},
		{
			name: "a long window at a new speed takes over",
			// 100 s at 10000, then 50 s (5 tau) at 5000.
			samples: []prefillSample{s(0, 0, 0), s(1e6, 0, 100), s(1.25e6, 0, 150)},
			want:    5000, tol: 0.05,
		},
		{
			name: "one tau at the new speed moves it most of the way",
			// 10 s at 10000, then 10 s at 5000: weight 1 − e^-1 on the
			// new window's log rate.
			samples: []prefillSample{s(0, 0, 0), s(1e5, 0, 10), s(1.5e5, 0, 20)},
			want:    1e4 * math.Pow(0.5, 1-math.Exp(-1)),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p prefillEstimator
			for _, smp := range tc.samples {
				p.observe(smp)
			}
			got := p.rate()
			tol := tc.tol
			if tol == 0 {
				tol = 1e-9
			}
			if math.Abs(got-tc.want) > tol*tc.want || (tc.want == 0) != (got == 0) {
				t.Fatalf("rate = %v, want %v (±%v)", got, tc.want, tc.tol)
			}
		})
	}
}

// TestPrefillRateThroughStartScrape: Load.PrefillRate follows the counters
// recorded by StartScrape, ignores garbage, survives a counter reset, and
// scrapes without the counters leave it alone.
func TestPrefillRateThroughStartScrape(t *testing.T) {
	r := NewRegistry(Options{ManualScrape: true})
	defer r.Close()
	e := r.Ensure("127.0.0.1:1")
	scrape := func(prompt, cached, secs float64) float64 {
		t.Helper()
		e.StartScrape()(Gauges{Running: 1, KVUsage: 0.1, PromptTokens: prompt, CachedTokens: cached, PrefillSeconds: secs})
		l := e.Load()
		if !l.Known {
			t.Fatalf("scrape not recorded: %+v", l)
		}
		return l.PrefillRate
	}
	steps := []struct {
		prompt, cached, secs float64
		want                 float64
	}{
		{0, 0, 0, 0},                     // callers that do not report counters: no rate
		{0, 0, 0, 0},                     // still none
		{52000, 2000, 10, 5000},          // first window: 50000 uncached in 10 s, the whole warm-up
		{52000, 2000, 10, 5000},          // idle: kept
		{math.NaN(), 2000, 11, 5000},     // garbage: as if absent
		{52000, -1, 11, 5000},            // garbage
		{52000, 2000, math.Inf(1), 5000}, // garbage
		{10, 0, 0.1, 5000},               // engine restarted: new baseline
		{10, 0, 0.1, 5000},               // nothing new
	}
	for i, st := range steps {
		if got := scrape(st.prompt, st.cached, st.secs); math.Abs(got-st.want) > 1e-9*st.want || (got == 0) != (st.want == 0) {
			t.Fatalf("step %d (%v): PrefillRate = %v, want %v", i, st, got, st.want)
		}
	}
	// After the restart the next window is measured from the new baseline:
	// 0.01 s at 2000 times the speed moves the rate only a little.
	got := scrape(10+100000, 0, 0.11)
	if !(got > 5000 && got < 5000*1.02) {
		t.Fatalf("after the restart's first window: PrefillRate = %v, want a little above 5000", got)
	}
}

// TestPrefillEstimatorPaired: with the request counts of both histograms
// each window's tokens per first token are set against its prefill seconds
// per ended request, so requests still decoding (tokens counted, prefill
// time not yet observed) do not make the engine look faster.
func TestPrefillEstimatorPaired(t *testing.T) {
	// p builds a paired sample: uncached tokens and first tokens counted,
	// prefill seconds and ended requests observed.
	p := func(tok, firsts, secs, finished float64) prefillSample {
		return prefillSample{prompt: tok, secs: secs, firsts: firsts, finished: finished, paired: true}
	}
	ttft := func(s prefillSample, secs float64) prefillSample { s.ttft = secs; return s }
	tests := []struct {
		name    string
		samples []prefillSample
		want    float64
	}{
		{
			// Ten 1000-token requests reached their first token, each
			// after 0.2 s of prefill; two have ended. Unpaired, the ratio
			// would be 10000 / 0.4 = 25000 tokens/s.
			name:    "tokens ahead of their times",
			samples: []prefillSample{p(0, 0, 0, 0), p(10000, 10, 0.4, 2)},
			want:    5000,
		},
		{
			name:    "later windows complete the same requests",
			samples: []prefillSample{p(0, 0, 0, 0), p(10000, 10, 0.4, 2), p(10000, 10, 2, 10)},
			want:    5000,
		},
		{
			name:    "without first tokens or ended requests, no rate",
			samples: []prefillSample{p(0, 0, 0, 0), p(0, 0, 0, 0)},
			want:    0,
		},
		{
			// No request has ended: the first tokens' TTFT (2.5 s for
			// ten, queueing included) stands in for their prefill time.
			name:    "before any request ends, time to first token",
			samples: []prefillSample{p(0, 0, 0, 0), ttft(p(10000, 10, 0, 0), 2.5)},
			want:    4000,
		},
		{
			name:    "the first ended request replaces it",
			samples: []prefillSample{p(0, 0, 0, 0), ttft(p(10000, 10, 0, 0), 2.5), ttft(p(10000, 10, 0.2, 1), 2.5)},
			want:    5000,
		},
		{
			// Past the warm-up, a window of 0.25 s per request at 800
			// tokens each (3200/s) moves the log rate by its weight.
			name: "smoothed past the warm-up",
			samples: []prefillSample{p(0, 0, 0, 0), p(50000, 50, 10, 50),
				p(50000+8000, 60, 10+2.5, 60)},
			want: math.Exp(math.Log(5000) + -math.Expm1(-2.5/prefillTau)*(math.Log(3200)-math.Log(5000))),
		},
		{
			// A sample without counts ends pairing for good: the plain
			// ratio of everything pooled (12000 tokens in 2 s).
			name: "counts that vanish fall back to the plain ratio",
			samples: []prefillSample{p(0, 0, 0, 0), p(10000, 10, 0.4, 2),
				{prompt: 12000, secs: 2}},
			want: 6000,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var e prefillEstimator
			for _, s := range tc.samples {
				e.observe(s)
			}
			got := e.rate()
			if math.Abs(got-tc.want) > 1e-9*tc.want || (tc.want == 0) != (got == 0) {
				t.Fatalf("rate = %v, want %v", got, tc.want)
			}
		})
	}
}
