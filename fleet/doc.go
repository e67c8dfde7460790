// Package fleet is the gateway's core: the state of a fleet of vLLM engines
// shared by the admission handler and the routing policy, and the decisions
// made from it.
//
// A [Fleet] owns the engine registry (gauges polled from /metrics and this
// gateway's accounting), the KV-event subscriptions and the prefix index
// they feed, the approximate prefix tree, the tokenizer client, the
// admission gates by pool, drained engines and the circuit breaker. It
// follows the config of the running [Generation], so a config reload keeps
// engines, subscriptions and parked requests.
//
// The package knows nothing of Caddy: caddymodule adapts it to Caddy's
// modules, and the fleet simulation in bench drives the same code against
// simulated engines.
package fleet
