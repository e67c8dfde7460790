package upstreams

import "time"

// Occupy marks the engine as busy with this request's long prefill for d
// from now: [Load.Occupied] reports it until then, or until the
// reservation ends or moves (the hold moves with it). Admission uses it so
// that an engine prefilling a long prompt takes nothing else meanwhile:
// vLLM schedules the running prefill's chunks before any newly waiting
// request, so whatever else is sent there waits for the whole prefill.
// No-op after Done or for d <= 0.
func (r *Reservation) Occupy(d time.Duration) {
	if d <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.e.occupy(r, r.e.reg.now().Add(d))
}

// Prefilled ends the reservation's long-prefill hold: the engine has
// produced the request's first token, so its prefill is over sooner than
// Occupy's estimate said. Its recorded work ([Reservation.Work]) moves
// from prefill to decode. No-op without a hold, or for nil.
func (r *Reservation) Prefilled() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.e.unoccupy(r)
	r.e.prefilledWork(r)
}

// occupy records r's hold on e until then.
func (e *Engine) occupy(r *Reservation, until time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.occupied == nil {
		e.occupied = make(map[*Reservation]time.Time)
	}
	e.occupied[r] = until
}

// unoccupy drops r's hold on e and returns when it would have ended.
func (e *Engine) unoccupy(r *Reservation) (until time.Time, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	until, ok = e.occupied[r]
	delete(e.occupied, r)
	return until, ok
}

// occupiedLocked is the longest hold still running at now; it forgets the
// holds that have ended. e.mu held.
func (e *Engine) occupiedLocked(now time.Time) time.Duration {
	var left time.Duration
	for r, until := range e.occupied {
		d := until.Sub(now)
		if d <= 0 {
			delete(e.occupied, r)
			continue
		}
		left = max(left, d)
	}
	return left
}
