package fleet

import (
	"time"

	"go.uber.org/zap"

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

// onRestart closes the breaker of an engine whose scrape shows it
// restarted. A restart aborts every request the engine was running or
// queueing at once, easily the breaker's failure count, while the new
// process is up already (a scrape just succeeded): the breaker would keep
// a healthy engine out of routing for its cooldown, and the pool's load on
// fewer engines, deeper in their queues, to be lost at their own restarts.
// Should the new process fail too, its own failures open the breaker again.
//
// The responses the old process stored are gone with it: a follow-up
// naming one is answered as vLLM would (see PreviousResponse).
func (f *Fleet) onRestart(dial string) {
	f.responses.restarted(dial)
	if f.Breaker().Reset(dial, time.Now()) {
		f.logger.Info("engine restarted: circuit breaker closed", zap.String("engine", dial))
	}
}
