package upstreams

import (
	"math"
	"time"
)

// stepTokens is the smoothing constant of the step-time estimator, in
// output tokens: a scrape window that saw this many inter-token gaps moves
// the estimate about two thirds of the way to its own mean, one that saw a
// handful barely moves it.
const stepTokens = 64

// stepSample is one scrape's vllm:inter_token_latency_seconds _sum and
// _count, summed over the engine's series.
type stepSample struct{ secs, count float64 }

// stepEstimator derives an engine's scheduler step time from the deltas of
// its inter-token latency histogram between successful scrapes: every
// output token after a request's first is one gap between two steps the
// request ran in, so Δsum/Δcount is the mean step as the engine's running
// requests saw it (chunked prefill included). The poller sizes a scrape's
// lead from it (see markLead). Not safe for concurrent use (Engine.mu).
type stepEstimator struct {
	base     stepSample
	haveBase bool
	step     float64 // seconds; meaningful when have
	have     bool
}

// observe feeds one successful scrape's totals. A counter that went down
// (a restart) starts a new window without a sample.
func (s *stepEstimator) observe(v stepSample) {
	if !s.haveBase || v.secs < s.base.secs || v.count < s.base.count {
		s.base, s.haveBase = v, true
		return
	}
	dSecs, dCount := v.secs-s.base.secs, v.count-s.base.count
	if dCount < 1 {
		return // keep the window open until it holds a gap
	}
	s.base = v
	mean := dSecs / dCount
	if math.IsNaN(mean) || math.IsInf(mean, 0) {
		return
	}
	if !s.have {
		s.step, s.have = mean, true
		return
	}
	s.step += -math.Expm1(-dCount/stepTokens) * (mean - s.step)
}

// estimate returns the mean step time; false while no window held a gap.
func (s *stepEstimator) estimate() (time.Duration, bool) {
	if !s.have || !(s.step >= 0) || s.step > 3600 {
		return 0, false
	}
	return time.Duration(s.step * float64(time.Second)), true
}
