package upstreams

import (
	"math"
	"time"
)

// stepTokens is the smoothing constant of the step-time estimator, in
// output tokens: a sample of this many inter-token gaps moves the estimate
// about two thirds of the way to its own mean, one of a handful barely
// moves it.
const stepTokens = 64

// streamPrecedence is how long after the gateway last measured one of the
// engine's streams the engine's own histogram is not used (see
// stepEstimator).
const streamPrecedence = 30 * time.Second

// stepSample is one scrape's vllm:inter_token_latency_seconds _sum and
// _count, summed over the engine's series.
type stepSample struct{ secs, count float64 }

// stepEstimator derives an engine's scheduler step time from inter-token
// gaps: every output token after a request's first comes one step after
// the one before, so the mean gap is the mean step as the engine's running
// requests saw it (chunked prefill included). The poller sizes a scrape's
// lead from it (see markLead). Not safe for concurrent use (Engine.mu).
//
// It has two sources. The gateway's own measurements of the streams it
// relays ([Reservation.Streamed]) are wall time as the gateway sees it,
// which is what the lead is measured in; while one is at most
// streamPrecedence old they alone count. Otherwise (non-streaming
// traffic, or another gateway's) the deltas of the engine's
// inter-token latency histogram between scrapes serve: vLLM's are wall
// time too, but an engine that keeps another clock (the simulator at a
// TimeScale above 1) would mislead the lead.
type stepEstimator struct {
	base       stepSample // histogram totals at the start of the pending window
	haveBase   bool
	streamedAt time.Time // the latest stream measurement
	step       float64   // seconds; meaningful when have
	have       bool
}

// observe feeds one successful scrape's histogram totals, at now. A counter
// that went down (a restart) starts a new window without a sample.
func (s *stepEstimator) observe(v stepSample, now time.Time) {
	if !s.haveBase || v.secs < s.base.secs || v.count < s.base.count {
		s.base, s.haveBase = v, true
		return
	}
	dSecs, dCount := v.secs-s.base.secs, v.count-s.base.count
	if dCount < 1 {
		return // keep the window open until it holds a gap
	}
	s.base = v
	if !s.streamedAt.IsZero() && now.Sub(s.streamedAt) < streamPrecedence {
		return
	}
	s.add(dSecs/dCount, dCount)
}

// observeStream feeds the inter-token gaps the gateway measured on one
// stream from the engine: their sum and count.
func (s *stepEstimator) observeStream(sum time.Duration, count int, now time.Time) {
	if count < 1 || sum < 0 {
		return
	}
	s.streamedAt = now
	s.add(sum.Seconds()/float64(count), float64(count))
}

// add moves the estimate toward a sample of n gaps with the given mean.
func (s *stepEstimator) add(mean, n float64) {
	if math.IsNaN(mean) || math.IsInf(mean, 0) || mean < 0 {
		return
	}
	if !s.have {
		s.step, s.have = mean, true
		return
	}
	s.step += -math.Expm1(-n/stepTokens) * (mean - s.step)
}

// estimate returns the mean step time; false while no sample held a gap.
func (s *stepEstimator) estimate() (time.Duration, bool) {
	if !s.have || s.step > 3600 {
		return 0, false
	}
	return time.Duration(s.step * float64(time.Second)), true
}

// Streamed records the inter-token gaps the gateway measured on the
// request's response stream (their sum and count) as a sample of its
// engine's step time, from which the scrape lead is sized (see markLead).
// Safe on a nil Reservation.
func (r *Reservation) Streamed(gaps time.Duration, count int) {
	if r == nil || count < 1 {
		return
	}
	r.mu.Lock()
	e := r.e
	r.mu.Unlock()
	now := e.reg.now()
	e.mu.Lock()
	e.steps.observeStream(gaps, count, now)
	e.mu.Unlock()
}
