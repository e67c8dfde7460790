package caddymodule

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

func init() {
	caddy.RegisterModule(new(EngineUpstreams))
}

// EngineUpstreams provides reverse_proxy's upstreams from the engines of
// the `llm` app, so that each engine is listed once: in the app, where its
// KV events, metrics and limits are configured.
//
// The upstreams are those of the current config: a config reload that adds
// or removes engines changes them for the requests the new config serves.
// They are returned in the order the engines are configured in, which is
// stable across calls.
//
// Name the same pool in the `pool` of lb_policy llm and llm_admission of
// the route: admission gates on the engines of that pool as configured in
// the llm app until the policy's first selection confirms them.
//
// As for every dynamic upstream source, Caddy runs no active health checks
// on these upstreams; passive ones, lb_policy llm's breaker and drains
// apply as to listed upstreams.
//
// Engines found by DNS are served by Caddy's `dynamic a` and `dynamic srv`
// instead, and registered with the llm app on first use.
//
// EXPERIMENTAL: Subject to change.
type EngineUpstreams struct {
	// Only the engines whose `pool` is this name; engines without a pool
	// are in "default". Default: every engine of the llm app.
	Pool string `json:"pool,omitempty"`

	dials []string // this config's engines of the pool, in config order
}

// CaddyModule returns the Caddy module information.
func (*EngineUpstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.llm",
		New: func() caddy.Module { return new(EngineUpstreams) },
	}
}

// Provision takes the engines of the pool from the llm app of this config.
// A pool without engines is a config error rather than a route that
// answers every request 502: the pool name is most likely misspelled.
func (u *EngineUpstreams) Provision(ctx caddy.Context) error {
	app, err := appFromContext(ctx)
	if err != nil {
		return err
	}
	u.dials = poolEngines(app.Engines, u.Pool)
	if len(u.dials) > 0 {
		return nil
	}
	if u.Pool == "" {
		return fmt.Errorf("dynamic llm: the llm app has no engines; list them as `engine <host:port>` in the llm global option")
	}
	return fmt.Errorf("dynamic llm: no engine of the llm app is in pool %q; give engines `pool %s` in the llm global option", u.Pool, u.Pool)
}

// varUpstreamsPool holds the pool of a request's `dynamic llm <pool>`.
const varUpstreamsPool = "llm.upstreams_pool"

// poolEngines are the dial addresses of the engines in pool, in config
// order; every engine's when pool is "". Engines without a pool are in
// the default pool, as the fleet counts them.
func poolEngines(engines []*fleet.EngineConfig, pool string) []string {
	var dials []string
	for _, e := range engines {
		if e == nil {
			continue
		}
		p := e.Pool
		if p == "" {
			p = upstreams.DefaultPool
		}
		if pool == "" || p == pool {
			dials = append(dials, e.Dial)
		}
	}
	return dials
}

// GetUpstreams implements reverseproxy.UpstreamSource. Every call returns
// new Upstream values, as Caddy's A and SRV sources do: reverse_proxy
// provisions the returned upstreams on each call, writing their fields
// while other requests may read those of an earlier call. The state that
// must persist (requests in flight, passive health failures) lives in the
// Host that Caddy keys by dial address, and is shared by every call.
//
// It leaves its pool in the request's vars, for lb_policy llm to check
// that the route names one pool throughout.
func (u *EngineUpstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	if r != nil && u.Pool != "" {
		caddyhttp.SetVar(r.Context(), varUpstreamsPool, u.Pool)
	}
	out := make([]*reverseproxy.Upstream, len(u.dials))
	for i, d := range u.dials {
		out[i] = &reverseproxy.Upstream{Dial: d}
	}
	return out, nil
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler. Syntax:
//
//	dynamic llm [<pool>]
func (u *EngineUpstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "llm"
	args := d.RemainingArgs()
	switch len(args) {
	case 0:
	case 1:
		if args[0] == "" {
			return d.Errf("usage: dynamic llm [<pool>]: empty pool name")
		}
		u.Pool = args[0]
	default:
		return d.Errf("usage: dynamic llm [<pool>]: too many arguments")
	}
	if d.NextBlock(0) {
		return d.Errf("usage: dynamic llm [<pool>]: unexpected block (subdirective '%s')", d.Val())
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*EngineUpstreams)(nil)
	_ reverseproxy.UpstreamSource = (*EngineUpstreams)(nil)
	_ caddyfile.Unmarshaler       = (*EngineUpstreams)(nil)
)
