package fleet

import (
	"time"

	"github.com/llmgw/caddy-llmgw/routing"
)

// SetPolicy registers a pool's routing settings, for the explain API and
// the fleet simulation.
func (f *Fleet) SetPolicy(pool string, s Settings) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.policies == nil {
		f.policies = make(map[string]Settings)
	}
	f.policies[pool] = s
}

// PolicyOf is the settings of the pool's llm policy, ok false when no llm
// policy registered any for it.
func (f *Fleet) PolicyOf(pool string) (Settings, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.policies[pool]
	return s, ok
}

// PolicySettings are the settings of the pool's policy, or the defaults.
func (f *Fleet) PolicySettings(pool string) Settings {
	if s, ok := f.PolicyOf(pool); ok {
		return s
	}
	return DefaultSettings()
}

// SetBreaker configures the circuit breaker; a changed config starts a new
// breaker (every replica closed).
func (f *Fleet) SetBreaker(cfg routing.BreakerConfig) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.breaker == nil || f.breakerCfg != cfg {
		f.breakerCfg = cfg
		f.breaker = routing.NewBreaker(cfg)
	}
}

// Breaker is the current circuit breaker.
func (f *Fleet) Breaker() *routing.Breaker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.breaker
}

// ReportOutcome feeds the circuit breaker with the result of a proxied
// request: transport errors and 5xx count against the replica.
func (f *Fleet) ReportOutcome(dial string, err error, status int) {
	if dial == "" {
		return
	}
	b, now := f.Breaker(), time.Now()
	if err != nil || status == 0 || status >= 500 {
		b.Failure(dial, now)
		return
	}
	b.Success(dial, now)
}

// ReleaseProbe returns a half-open probe claimed by Allow for a replica
// that was not picked.
func (f *Fleet) ReleaseProbe(dial string) {
	b := f.Breaker()
	if b.State(dial, time.Now()) == routing.StateHalfOpen {
		b.Release(dial)
	}
}
