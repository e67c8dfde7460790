package upstreams

import "math"

// prefillTau is the smoothing time constant of the prefill-rate estimator
// in seconds of prefill time (the histogram's _sum), not of wall time: an
// engine that prefills little keeps its estimate longer, a busy one
// follows changes within a few scrapes.
const prefillTau = 10.0

// prefillSample is one scrape's cumulative prefill counters, summed over
// the engine's series.
type prefillSample struct {
	prompt float64 // prompt tokens, cached ones included
	cached float64 // prompt tokens served from the prefix cache
	secs   float64 // seconds requests spent in the prefill phase
}

// prefillEstimator derives an engine's effective prefill speed, in uncached
// prompt tokens per second of prefill, from the deltas of its cumulative
// counters between successful scrapes. It is not safe for concurrent use
// (Engine.mu guards it).
//
// vLLM sums each request's prefill time, so concurrent prefills each count
// the whole time they shared: the result is the per-request effective
// speed, batching contention included — what "how long would a prompt's
// prefill take here" needs.
//
// Until the windows hold prefillTau seconds of prefill between them, the
// estimate is their pooled ratio: all their uncached tokens over all their
// seconds. vLLM counts a request's prompt tokens at its first token but
// observes its prefill time when it finishes, so a window may hold a
// request's tokens without its time; the pooled ratio takes that time from
// the next window, and is exact whenever no request is between its first
// token and its end. A first window that alone set the estimate could
// leave it twice too high for a long time.
//
// After that, smoothing is an exponentially weighted average of each
// window's rate, taken in log space, with weight 1 − exp(−Δseconds/prefillTau):
// a window holding a tenth of prefillTau of prefill moves the estimate a
// tenth of the way, one holding several prefillTau replaces it. In log space
// an outlier moves the estimate by a factor of (outlier/estimate)^weight: a
// 0.01 s window claiming 1000 times the speed (a scrape that saw many
// prompts' tokens but few of their prefill times, see observe) moves it by
// 0.7 %, where a linear average would double it. The price is a small bias
// toward the slower windows when windows alternate fast-short and
// slow-long; it vanishes with windows of many requests each.
type prefillEstimator struct {
	base     prefillSample // counters at the start of the pending window
	haveBase bool
	// pooledTok and pooledSec sum the windows' deltas while pooledSec is
	// below prefillTau (the warm-up); pooledTok may dip below 0 when cache
	// hits are counted ahead of their prompt tokens.
	pooledTok, pooledSec float64
	logRate              float64 // smoothed log(uncached tokens per prefill second)
	haveRate             bool
}

// observe feeds the counters of a successful scrape. It reports whether a
// counter went down since the previous sample: the engine restarted (or a
// rank left).
func (p *prefillEstimator) observe(s prefillSample) (reset bool) {
	if !p.haveBase || s.prompt < p.base.prompt || s.cached < p.base.cached || s.secs < p.base.secs {
		// First sample, or a counter went down: start a new window,
		// without a rate sample.
		reset = p.haveBase
		p.base, p.haveBase = s, true
		return reset
	}
	dTok := (s.prompt - s.cached) - (p.base.prompt - p.base.cached)
	dSec := s.secs - p.base.secs
	if p.pooledSec < prefillTau {
		p.pool(dTok, dSec)
		p.base = s
		return false
	}
	if !(dSec > 0 && dTok > 0) || math.IsInf(dTok/dSec, 0) || dTok/dSec == 0 {
		// Keep the window open rather than drop half a pair: vLLM counts a
		// request's prompt tokens at its first token but observes its
		// prefill time when it finishes, and cache hits when it is
		// scheduled, so a scrape may see one without the other.
		return false
	}
	if l := math.Log(dTok / dSec); !p.haveRate {
		// The warm-up never held both (garbage-sized counters).
		p.logRate, p.haveRate = l, true
	} else {
		w := -math.Expm1(-dSec / prefillTau) // 1 − e^(−Δs/τ)
		p.logRate += w * (l - p.logRate)
	}
	p.base = s
	return false
}

// pool adds a warm-up window to the pooled sums and, when they hold both
// tokens and time, sets the estimate to their ratio.
func (p *prefillEstimator) pool(dTok, dSec float64) {
	p.pooledTok += dTok
	p.pooledSec += dSec
	if r := p.pooledTok / p.pooledSec; p.pooledTok > 0 && p.pooledSec > 0 && r > 0 && !math.IsInf(r, 0) {
		p.logRate, p.haveRate = math.Log(r), true
	}
}

// rate returns the smoothed uncached prompt tokens per second of prefill;
// 0 while no window had both prefill time and uncached tokens.
func (p *prefillEstimator) rate() float64 {
	if !p.haveRate {
		return 0
	}
	r := math.Exp(p.logRate)
	if math.IsNaN(r) || math.IsInf(r, 0) || r <= 0 {
		return 0
	}
	return r
}
