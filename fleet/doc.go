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
// A request's life in the fleet is a chain of values, each step a method
// of what the step before returned, so the order is what the compiler
// allows: [Fleet.Place] and [Placement.Reserve] admit it, [Fleet.Route]
// (or [Placement.Pick]) picks its engine, [Pick.Commit] records the pick,
// and the [Attempt] it returns is dispatched and hears how the request
// ended. See [Pick] for the whole life in order.
//
// The package knows nothing of Caddy: caddymodule adapts it to Caddy's
// modules, and the fleet simulation in bench drives the same code against
// simulated engines.
package fleet
