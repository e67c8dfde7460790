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
	// firsts counts the requests whose prompt tokens are in prompt (vLLM
	// counts both at the first token: vllm:time_to_first_token_seconds
	// _count) and finished the requests whose prefill time is in secs
	// (vllm:request_prefill_time_seconds_count, observed when a request
	// ends); paired says both are known. See prefillEstimator.
	firsts, finished float64
	paired           bool
	// ttft is vllm:time_to_first_token_seconds_sum, observed at the first
	// token with the prompt tokens: queueing included, so it bounds the
	// prefill time from above. It stands in for the prefill time until a
	// first request has ended (see pool).
	ttft float64
}

// window is the deltas between two samples, in the form the estimator
// takes a rate from.
type window struct{ tok, firsts, secs, finished, ttft float64 }

// perRequest is the window's rate: uncached tokens per prefill second.
// Paired, it is the mean uncached prompt of the requests that reached their
// first token over the mean prefill time of those that ended, so requests
// still decoding (tokens counted, time not yet) do not inflate it; 0 when
// the window holds no such request.
func (w window) rate(paired bool) float64 {
	if !paired {
		return w.tok / w.secs
	}
	if w.firsts < 1 || w.finished < 1 {
		return 0
	}
	return (w.tok / w.firsts) / (w.secs / w.finished)
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
// That lag is as long as a request's decode, seconds to minutes: an engine
// whose requests decode ten times longer than they prefill has ten
// requests' tokens counted for every prefill time observed while the
// traffic grows, and the pooled ratio stays that much too fast until
// prefillTau seconds of prefill (minutes on a lightly used engine) have
// accumulated. With the request counts of both histograms (paired
// samples), every window is instead taken as the mean uncached prompt per
// first token over the mean prefill time per ended request: two means of
// the same requests' distribution, neither waiting for the other.
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
	// pooled sums the windows' deltas while its seconds are below
	// prefillTau (the warm-up); its tokens may dip below 0 when cache hits
	// are counted ahead of their prompt tokens. paired: every sample so
	// far carried both request counts.
	pooled   window
	paired   bool
	logRate  float64 // smoothed log(uncached tokens per prefill second)
	haveRate bool
	// updates counts the windows that set or moved the estimate, so that
	// the engine can tell when its rate last took in new prefill.
	updates uint64
}

// observe feeds the counters of a successful scrape. It reports whether a
// counter went down since the previous sample: the engine restarted (or a
// rank left).
func (p *prefillEstimator) observe(s prefillSample) (reset bool) {
	if !p.haveBase || s.prompt < p.base.prompt || s.cached < p.base.cached || s.secs < p.base.secs ||
		(s.paired && p.base.paired && (s.firsts < p.base.firsts || s.finished < p.base.finished)) {
		// First sample, or a counter went down: start a new window,
		// without a rate sample.
		reset = p.haveBase
		if !p.haveBase {
			p.paired = s.paired
		}
		p.base, p.haveBase = s, true
		return reset
	}
	// Windows are paired while every sample has been: a count that
	// appears or vanishes midway leaves the plain ratio.
	p.paired = p.paired && s.paired && p.base.paired
	w := window{
		tok:      (s.prompt - s.cached) - (p.base.prompt - p.base.cached),
		secs:     s.secs - p.base.secs,
		firsts:   s.firsts - p.base.firsts,
		finished: s.finished - p.base.finished,
		ttft:     s.ttft - p.base.ttft,
	}
	if p.pooled.secs < prefillTau {
		p.pool(w)
		p.base = s
		return false
	}
	r := w.rate(p.paired)
	if !(w.secs > 0 && w.tok > 0) || math.IsInf(r, 0) || !(r > 0) {
		// Keep the window open rather than drop half a pair: vLLM counts a
		// request's prompt tokens at its first token but observes its
		// prefill time when it finishes, and cache hits when it is
		// scheduled, so a scrape may see one without the other.
		return false
	}
	if l := math.Log(r); !p.haveRate {
		// The warm-up never held both (garbage-sized counters).
		p.logRate, p.haveRate = l, true
	} else {
		wt := -math.Expm1(-w.secs / prefillTau) // 1 − e^(−Δs/τ)
		p.logRate += wt * (l - p.logRate)
	}
	p.updates++
	p.base = s
	return false
}

// pool adds a warm-up window to the pooled sums and, when they hold both
// tokens and time, sets the estimate to their ratio.
func (p *prefillEstimator) pool(w window) {
	p.pooled.tok += w.tok
	p.pooled.secs += w.secs
	p.pooled.firsts += w.firsts
	p.pooled.finished += w.finished
	p.pooled.ttft += w.ttft
	r := p.pooled.rate(p.paired)
	if p.paired && p.pooled.finished < 1 && p.pooled.firsts >= 1 {
		// No request has ended, so no prefill time is known, but first
		// tokens are: their time to first token (prefill and queueing)
		// gives a rate that is at most the engine's, where the
		// configured cold-start rate may be off by any factor. Requests
		// decode for seconds to minutes before the first prefill time
		// shows.
		r = p.pooled.tok / p.pooled.ttft
	}
	if p.pooled.tok > 0 && r > 0 && !math.IsInf(r, 0) && !math.IsNaN(r) {
		p.logRate, p.haveRate = math.Log(r), true
		if w.tok > 0 || w.secs > 0 || w.ttft > 0 {
			// Only a window with new prefill refreshes the estimate;
			// the pooled ratio is set again from every scrape.
			p.updates++
		}
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
