package upstreams

import (
	"math"
	"time"
)

// promptRequests is the smoothing constant of the mean-uncached-prompt
// estimator, in requests: a window of this many prefills moves the
// estimate about two thirds of the way to its own mean.
const promptRequests = 32

// Work records the uncached prompt tokens the request must prefill on its
// engine (the routing decision's figure: its prompt less the prefix the
// engine was credited with). They count in the engine's [Load.OwnPrefill]
// until the request's first token ([Reservation.Prefilled]); from then on
// until Done the request counts as decoding ([Load.OwnDecoding]). A second
// call replaces the first. No-op after Done, for nil, or for a negative
// count. Move drops the record: the caller records the request's work on
// the new engine, whose cache differs.
func (r *Reservation) Work(uncached int) {
	if r == nil || uncached < 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	e := r.e
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropWorkLocked(r)
	r.work, r.working, r.decoding, r.due = float64(uncached), true, false, time.Time{}
	e.ownPrefill += r.work
	e.ownPending++
}

// PrefillDue bounds how long the request's recorded work counts as
// prefill: d from now it counts as decoding even without
// [Reservation.Prefilled]. For a response that is not streamed the
// gateway sees no first token, and its prefill would otherwise count
// until the request ends. No-op without recorded work, after Done, for nil
// or d <= 0. The work's engine keeps the bound; Move and Work drop it.
func (r *Reservation) PrefillDue(d time.Duration) {
	if r == nil || d <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.e
	due := e.reg.now().Add(d)
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.done || !r.working || r.decoding {
		return
	}
	if e.prefillDue == nil {
		e.prefillDue = make(map[*Reservation]time.Time)
	}
	e.prefillDue[r] = due
}

// prefilledWork moves r's work from prefill to decode at its first token,
// and re-anchors the due time of the prefills still pending. r.mu held.
func (e *Engine) prefilledWork(r *Reservation) { e.endPrefill(r, false) }

// finishWork forgets r's work when the request ends. A prefill still
// pending then (a response not streamed, or one that failed) has ended by
// now, so an end before its due re-anchors the due time as a first token
// would; an end after it says nothing of when the first token came.
// r.mu held.
func (e *Engine) finishWork(r *Reservation) { e.endPrefill(r, true) }

// endPrefill ends r's prefill, at its first token or (finished) with the
// request, and re-anchors the due time of those still pending if r's was.
// r.mu held.
func (e *Engine) endPrefill(r *Reservation, finished bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	pending := r.working && !r.decoding
	if finished {
		e.dropWorkLocked(r)
	} else {
		e.prefilledLocked(r)
	}
	if pending {
		e.reanchorDueLocked(r, e.reg.now(), finished)
	}
}

// reanchorDueLocked moves the due times of the prefills still pending by
// how early or late r's first token came against r's own due, itself
// moved by the first tokens since its prediction: the requests sent while
// r was pending were predicted behind it, so its error is theirs. Without
// it, while one request or another is always pending the due time only
// ratchets: each new request is predicted to end after the last one's
// due, a due met early is never taken back, and an engine serving a
// steady stream of short hits looks busier with every request (at two
// concurrent clients, 15 ms more per request until a cold engine won).
// A request predicted to wait for a slot moves nothing: its due left that
// wait out. With byNow, the first token came at now or before: only an
// early one moves the due time. e.mu held.
func (e *Engine) reanchorDueLocked(r *Reservation, now time.Time, byNow bool) {
	if r.due.IsZero() || e.ownPending <= 0 || e.ownDue.IsZero() {
		return
	}
	late := now.Sub(r.due.Add(e.dueShift - r.shift))
	if byNow && late > 0 {
		return
	}
	e.ownDue = e.ownDue.Add(late)
	e.dueShift += late
}

// prefilledLocked moves r's work from prefill to decode. e.mu held, and
// r counts on e: its work fields are guarded by its engine's mutex.
func (e *Engine) prefilledLocked(r *Reservation) {
	delete(e.prefillDue, r)
	if !r.working || r.decoding {
		return
	}
	e.ownPrefill -= r.work
	e.ownPending--
	e.ownDecoding++
	r.decoding = true
	e.settleWorkLocked()
}

// settleDueLocked ends the prefills whose bound (PrefillDue) has passed.
// e.mu held.
func (e *Engine) settleDueLocked(now time.Time) {
	for r, due := range e.prefillDue {
		if !now.Before(due) {
			e.prefilledLocked(r)
		}
	}
}

// dropWork forgets r's work on e. r.mu held.
func (e *Engine) dropWork(r *Reservation) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropWorkLocked(r)
}

// dropWorkLocked forgets r's work on e; r.mu and e.mu held.
func (e *Engine) dropWorkLocked(r *Reservation) {
	delete(e.prefillDue, r)
	if !r.working {
		return
	}
	if r.decoding {
		e.ownDecoding--
	} else {
		e.ownPrefill -= r.work
		e.ownPending--
	}
	r.working, r.decoding = false, false
	e.settleWorkLocked()
}

// settleWorkLocked clears the float sum's rounding residue once nothing
// is pending, so that an idle engine shows exactly no work. e.mu held.
func (e *Engine) settleWorkLocked() {
	if e.ownPending <= 0 || e.ownPrefill < 0 {
		e.ownPrefill = max(e.ownPrefill, 0)
		if e.ownPending <= 0 {
			e.ownPrefill, e.ownDue, e.dueShift = 0, time.Time{}, 0
		}
	}
}

// promptSample is one scrape's cumulative counters behind the mean
// uncached prompt: prompt tokens, their cache hits, and prefills observed
// (vllm:request_prefill_time_seconds_count).
type promptSample struct{ prompt, cached, count float64 }

// promptMean derives an engine's mean uncached prompt per request from the
// deltas of its counters between scrapes, for pricing the requests that
// wait there which this gateway did not send (see [Load.MeanUncached]).
// vLLM counts a request's prompt tokens at its first token and its
// prefill time (the count) when it finishes, so a window may hold one
// without the other; windows are kept open until they hold at least one
// request, and the estimate is smoothed over promptRequests requests. Not
// safe for concurrent use (Engine.mu).
type promptMean struct {
	base     promptSample
	haveBase bool
	mean     float64 // meaningful when have
	have     bool
}

// observe feeds one successful scrape's counters. A counter that went down
// (a restart) starts a new window.
func (p *promptMean) observe(s promptSample) {
	if !p.haveBase || s.prompt < p.base.prompt || s.cached < p.base.cached || s.count < p.base.count {
		p.base, p.haveBase = s, true
		return
	}
	dCount := s.count - p.base.count
	if dCount < 1 {
		return
	}
	dTok := (s.prompt - s.cached) - (p.base.prompt - p.base.cached)
	p.base = s
	m := dTok / dCount
	if math.IsNaN(m) || math.IsInf(m, 0) || m < 0 {
		return
	}
	if !p.have {
		p.mean, p.have = m, true
		return
	}
	p.mean += -math.Expm1(-dCount/promptRequests) * (m - p.mean)
}

// estimate is the smoothed mean; 0 while unknown.
func (p *promptMean) estimate() float64 {
	if !p.have {
		return 0
	}
	return p.mean
}

// Predict records the routing decision's predicted time to first token,
// in seconds, at the moment the request is handed to its engine, so that
// whoever sees the first token can compare ([Reservation.Predicted]).
// slotWait is the part of it the request is expected to wait for a batch
// slot (0 when it has one). The engine's prefills are due without it
// (Load.OwnDue): routing predicts a new request's wait for a slot apart,
// counting every request queued for one, and a queue's wait counted in
// the due time as well would grow from each request to the next. No-op
// for nil or a prediction that is not positive.
func (r *Reservation) Predict(ttft, slotWait float64) {
	if r == nil || !(ttft > 0) {
		return
	}
	prefill := ttft - max(slotWait, 0) // NaN: no due time
	now := r.Engine().reg.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.predicted, r.predictedAt = ttft, now
	e := r.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.working && !r.decoding && !r.done && prefill > 0 {
		// The engine is busy with this gateway's prefills until the last
		// of them is predicted to be done.
		// (An hour bounds a wild prediction: time.Duration overflows.)
		due := now.Add(time.Duration(min(prefill, 3600) * float64(time.Second)))
		if due.After(e.ownDue) {
			e.ownDue = due
		}
		r.due, r.shift = time.Time{}, e.dueShift
		if !(slotWait > 0) { // a slot wait leaves the due time to others
			r.due = due
		}
	}
}

// Predicted returns the prediction Predict recorded and when; ok false
// when none was. Safe on nil.
func (r *Reservation) Predicted() (ttft float64, at time.Time, ok bool) {
	if r == nil {
		return 0, time.Time{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.predicted, r.predictedAt, r.predicted > 0
}
