// Package upstreams tracks a fleet of vLLM engines for the gateway.
//
// A [Registry] holds one [Engine] per upstream dial address. Each engine has a
// poller goroutine that scrapes the engine's Prometheus /metrics page for the
// scheduler gauges (running, waiting, KV-cache usage, cache geometry), and
// local accounting ([Engine.Reserve]) that covers the requests this gateway
// has sent since the last scrape, so admission limits are tighter than the
// poll interval alone allows. The poller also learns what each engine
// serves: its GET /v1/models every [Options.ModelsInterval] and after
// restarts ([Engine.Models], [Registry.Serving]), and from every scrape the
// LoRA adapters with requests in flight ([Engine.LoRA]). The registry is
// meant to outlive configuration reloads: the owner calls [Registry.Apply]
// on every config start, which keeps running engines (and their state)
// untouched.
//
// The engines' /tokenize client is package remotetok.
//
// Nothing in this package imports Caddy.
package upstreams
