package routing

import (
	"slices"
	"sync"
	"time"
)

// Breaker defaults.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerWindow   = time.Minute
	DefaultBreakerCooldown = 10 * time.Second
)

// Breaker states, as returned by Breaker.State.
const (
	StateClosed   = "closed"
	StateOpen     = "open"
	StateHalfOpen = "half_open"
)

// BreakerConfig configures a Breaker. Zero or negative fields take their
// defaults.
type BreakerConfig struct {
	// Failures is how many consecutive failures open the breaker.
	// Default 5.
	Failures int
	// Window bounds a failure streak: failures count as consecutive only
	// while the streak is younger than Window, so rare failures of a
	// lightly used replica do not add up. Default 1 minute.
	Window time.Duration
	// Cooldown is how long an open breaker rejects traffic before letting
	// a single probe through (half-open). It also bounds how long a probe
	// may stay unanswered before another one is allowed. Default 10s.
	Cooldown time.Duration
}

// Breaker is a per-replica circuit breaker keyed by dial. It is safe for
// concurrent use. Time is passed in by the caller, which keeps it
// deterministic under test. Memory is proportional to the number of dials
// that are failing or open: a closed breaker with no failures has no entry.
type Breaker struct {
	cfg BreakerConfig

	mu    sync.Mutex
	dials map[string]*breakerEntry
}

type breakerEntry struct {
	fails     int       // consecutive failures in the current streak
	firstFail time.Time // start of the streak
	open      bool
	openedAt  time.Time
	probing   bool // a half-open probe is out
	probeAt   time.Time
}

// NewBreaker returns a Breaker with cfg's zero fields defaulted.
func NewBreaker(cfg BreakerConfig) *Breaker {
	if cfg.Failures <= 0 {
		cfg.Failures = DefaultBreakerFailures
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultBreakerWindow
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = DefaultBreakerCooldown
	}
	return &Breaker{cfg: cfg, dials: make(map[string]*breakerEntry)}
}

// state must be called with b.mu held.
func (b *Breaker) state(e *breakerEntry, now time.Time) string {
	switch {
	case e == nil || !e.open:
		return StateClosed
	case now.Sub(e.openedAt) < b.cfg.Cooldown:
		return StateOpen
	}
	return StateHalfOpen
}

// Allow reports whether a request may go to dial: always when closed; never
// while open; when half-open (cooldown over) it lets exactly one probe
// through and claims it, until the probe reports Success or Failure, is
// handed back with Release, or goes unanswered for a Cooldown.
func (b *Breaker) Allow(dial string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.dials[dial]
	ok, probe := b.admitsLocked(e, now)
	if probe {
		e.probing, e.probeAt = true, now
	}
	return ok
}

// Admits reports whether Allow would let a request go to dial now, without
// claiming the half-open probe: admission asks it to count room only where
// the policy may route. probe says the answer holds for one request only
// (half-open, no probe out), so a caller counting slots counts one.
func (b *Breaker) Admits(dial string, now time.Time) (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.admitsLocked(b.dials[dial], now)
}

// admitsLocked is the rule Allow and Admits share: closed lets everything
// through, open nothing, half-open one probe while none is out (or the one
// out went unanswered for a Cooldown). b.mu held.
func (b *Breaker) admitsLocked(e *breakerEntry, now time.Time) (ok, probe bool) {
	switch b.state(e, now) {
	case StateClosed:
		return true, false
	case StateOpen:
		return false, false
	}
	if e.probing && now.Sub(e.probeAt) < b.cfg.Cooldown {
		return false, false
	}
	return true, true
}

// Release hands back a probe claimed by Allow that was not used (the
// policy picked another replica), so the next request may probe at once.
func (b *Breaker) Release(dial string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.dials[dial]; e != nil {
		e.probing = false
	}
}

// Success records a successful request to dial. It closes a half-open
// breaker and ends a failure streak. While the breaker is open (cooldown
// running) it is ignored: it comes from a request sent before the breaker
// opened and says little about the replica now.
func (b *Breaker) Success(dial string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.dials[dial]
	if b.state(e, now) == StateOpen {
		return
	}
	delete(b.dials, dial)
}

// Failure records a failed request to dial. The Failures-th consecutive
// failure within Window opens the breaker; a failure while half-open opens
// it again for another Cooldown. Failures while open are ignored, so
// stragglers do not extend the cooldown.
func (b *Breaker) Failure(dial string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.dials[dial]
	switch b.state(e, now) {
	case StateOpen:
		return
	case StateHalfOpen:
		e.openedAt, e.probing = now, false
		return
	}
	if e == nil {
		e = &breakerEntry{}
		b.dials[dial] = e
	}
	if e.fails == 0 || now.Sub(e.firstFail) > b.cfg.Window {
		e.fails, e.firstFail = 0, now
	}
	e.fails++
	if e.fails >= b.cfg.Failures {
		*e = breakerEntry{open: true, openedAt: now}
	}
}

// Reset forgets dial's failures and closes its breaker: the replica
// restarted, so the failures were the previous process's — all the
// requests in flight when it went down fail together, which says nothing
// of the new one. It reports whether the breaker was open or half-open.
func (b *Breaker) Reset(dial string, now time.Time) (wasOpen bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.dials[dial]
	delete(b.dials, dial)
	return b.state(e, now) != StateClosed
}

// Open returns, sorted, the dials whose breaker is not closed (open or
// half-open), for metrics and the admin API.
func (b *Breaker) Open(now time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for dial, e := range b.dials {
		if b.state(e, now) != StateClosed {
			out = append(out, dial)
		}
	}
	slices.Sort(out)
	return out
}

// State returns "closed", "open" or "half_open" for dial at now.
func (b *Breaker) State(dial string, now time.Time) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state(b.dials[dial], now)
}
