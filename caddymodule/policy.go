package caddymodule

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sort"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/routing"
)

func init() {
	caddy.RegisterModule(new(Policy))
}

// Policy is the `llm` reverse_proxy selection policy: it sends each request
// to the vLLM replica that already holds the longest prefix of its prompt in
// its KV cache — learned exactly from the engine's KV-cache events (precise
// tier) or, for engines without fresh events, from a prefix tree of where
// this gateway sent which text (approximate tier) — unless that replica's
// load makes another one cheaper. See package routing for the cost.
//
// Token ids come from a replica's /tokenize (cached); on failure the request
// is routed on the approximate tier, never failed. A cache-key header pins a
// session to a replica by rendezvous hashing. A replica that failed the
// request is not picked again for its retries, repeated failures open a
// per-replica circuit breaker, drained replicas get no new requests, and with
// no candidate left the policy falls back to least_conn among available
// upstreams.
//
// EXPERIMENTAL: Subject to change.
type Policy struct {
	// The cost weights and thresholds; see routing.Config for each field
	// and its default.
	routing.Config

	// Request header whose value pins requests to a replica (rendezvous
	// hashing over available upstreams: the same key lands on the same
	// replica; a leaving replica moves only its own keys). Default: none.
	CacheKeyHeader string `json:"cache_key_header,omitempty"`

	// Pool name shared with llm_admission in the same route, so admission
	// knows which engines serve it. Default: "default".
	Pool string `json:"pool,omitempty"`

	// Tokens per KV block, for engines that have not reported theirs.
	// Default: 16.
	BlockSize int `json:"block_size,omitempty"`

	// Route on the approximate tier only, never calling /tokenize.
	// Default: false.
	DisableTokenize bool `json:"disable_tokenize,omitempty"`

	// Largest body the policy reads itself when llm_admission did not run.
	// Default: 1 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// Consecutive failures that open a replica's circuit breaker.
	// Default: 5.
	BreakerFailures int `json:"breaker_failures,omitempty"`

	// How long an open breaker keeps a replica out before one probe.
	// Default: 10s.
	BreakerCooldown caddy.Duration `json:"breaker_cooldown,omitempty"`

	// Add X-LLM-Upstream and X-LLM-Tier response headers naming the chosen
	// replica and tier. Default: false.
	DebugHeaders bool `json:"debug_headers,omitempty"`

	fleet  *fleet
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*Policy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.llm",
		New: func() caddy.Module { return new(Policy) },
	}
}

// Provision sets up the policy.
func (p *Policy) Provision(ctx caddy.Context) error {
	p.logger = ctx.Logger()
	p.Config.SetDefaults()
	if p.Pool == "" {
		p.Pool = "default"
	}
	if p.BlockSize == 0 {
		p.BlockSize = 16
	}
	if p.MaxBody == 0 {
		p.MaxBody = 1 << 20
	}
	if p.BreakerFailures == 0 {
		p.BreakerFailures = 5
	}
	if p.BreakerCooldown == 0 {
		p.BreakerCooldown = caddy.Duration(10 * time.Second)
	}
	app, err := appFromContext(ctx)
	if err != nil {
		return err
	}
	p.fleet = app.fleet
	p.fleet.setBreaker(routing.BreakerConfig{Failures: p.BreakerFailures, Cooldown: time.Duration(p.BreakerCooldown)})
	p.fleet.setPolicy(p.Pool, p.settings())
	return nil
}

// Validate checks the configuration.
func (p *Policy) Validate() error {
	if err := p.Config.Validate(); err != nil {
		return err
	}
	if p.BlockSize < 0 || p.MaxBody < 0 || p.BreakerFailures < 0 || p.BreakerCooldown < 0 {
		return fmt.Errorf("block_size, max_body, breaker_failures and breaker_cooldown must not be negative")
	}
	return nil
}

func (p *Policy) settings() routeSettings {
	return routeSettings{cost: p.Config, blockSize: p.BlockSize, tokenize: !p.DisableTokenize}
}

// Select implements reverseproxy.Selector. w may be nil.
func (p *Policy) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	ctx := r.Context()
	req := p.request(r)

	tried, _ := caddyhttp.GetVar(ctx, varTried).(map[string]bool)
	if tried == nil {
		tried = make(map[string]bool)
		caddyhttp.SetVar(ctx, varTried, tried)
	} else if last, _ := caddyhttp.GetVar(ctx, "llm.last").(string); last != "" {
		// Select runs again for the same request only when the last
		// attempt failed.
		p.fleet.breakerFailure(last)
	}

	now := time.Now()
	all := make([]string, 0, len(pool))
	var cands []*reverseproxy.Upstream
	for _, u := range pool {
		if u == nil {
			continue
		}
		all = append(all, u.Dial)
		if !u.Available() || tried[u.Dial] || p.fleet.isDrained(u.Dial) || !p.fleet.breakerAllow(u.Dial, now) {
			continue
		}
		cands = append(cands, u)
	}
	p.fleet.learnPool(p.Pool, sortedCopy(all))

	var chosen *reverseproxy.Upstream
	var tier string
	if key := p.cacheKey(r); key != "" && len(cands) > 0 {
		dials := make([]string, len(cands))
		for i, u := range cands {
			dials[i] = u.Dial
		}
		chosen, tier = cands[routing.Rendezvous(key, dials)], routing.CacheKey.String()
		prefixDecisions.WithLabelValues(tier, routing.Hit.String()).Inc()
	} else if len(cands) > 0 && req != nil {
		dials := make([]string, len(cands))
		for i, u := range cands {
			dials[i] = u.Dial
		}
		res := p.fleet.route(ctx, req, dials, p.settings(), false)
		if res.decision.Index >= 0 {
			chosen = cands[res.decision.Index]
			tier = res.decision.Tier.String()
			prefixDecisions.WithLabelValues(tier, res.decision.Outcome.String()).Inc()
			prefixShare.Observe(res.decision.Share)
			p.fleet.approx.Insert(res.text, chosen.Dial)
		}
	}
	if chosen == nil {
		// No request to route on, or every candidate excluded: least_conn
		// among what is available, rather than nil while any upstream is.
		chosen = leastConn(cands)
		if chosen == nil {
			chosen = leastConn(availableOnly(pool, tried))
		}
		if chosen == nil {
			return nil
		}
		tier = routing.LoadOnly.String()
		prefixDecisions.WithLabelValues(tier, routing.Miss.String()).Inc()
	}

	for _, u := range cands {
		if u != chosen {
			p.fleet.breakerRelease(u.Dial) // hand back half-open probes not used
		}
	}
	tried[chosen.Dial] = true
	caddyhttp.SetVar(ctx, "llm.last", chosen.Dial)
	caddyhttp.SetVar(ctx, "llm.tier", tier)
	p.fleet.account(r, chosen.Dial)
	if p.DebugHeaders && w != nil {
		w.Header().Set("X-LLM-Upstream", chosen.Dial)
		w.Header().Set("X-LLM-Tier", tier)
	}
	return chosen
}

// request returns the parsed request left by llm_admission, or parses the
// body itself (bounded, restored) when that handler did not run.
func (p *Policy) request(r *http.Request) *admission.Request {
	if req, ok := caddyhttp.GetVar(r.Context(), varRequest).(*admission.Request); ok {
		return req
	}
	if r.Body == nil || r.Method != http.MethodPost {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, p.MaxBody+1))
	if err != nil || int64(len(body)) > p.MaxBody {
		// Give the proxy back what was read, followed by the rest.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	req, err := admission.ParseRequest(body)
	if err != nil {
		return nil
	}
	caddyhttp.SetVar(r.Context(), varRequest, req)
	return req
}

func (p *Policy) cacheKey(r *http.Request) string {
	if p.CacheKeyHeader == "" {
		return ""
	}
	return r.Header.Get(p.CacheKeyHeader)
}

// leastConn is Caddy's least_conn: fewest requests in flight through this
// Caddy, ties broken by position (callers pass a stable order).
func leastConn(ups []*reverseproxy.Upstream) *reverseproxy.Upstream {
	var best *reverseproxy.Upstream
	for _, u := range ups {
		if best == nil || u.NumRequests() < best.NumRequests() {
			best = u
		}
	}
	return best
}

// availableOnly lists the available upstreams this request has not tried,
// ignoring drains and breakers: the last resort before "no upstream".
func availableOnly(pool reverseproxy.UpstreamPool, tried map[string]bool) []*reverseproxy.Upstream {
	var out []*reverseproxy.Upstream
	for _, u := range pool {
		if u != nil && u.Available() && !tried[u.Dial] {
			out = append(out, u)
		}
	}
	return out
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Policy)(nil)
	_ caddy.Validator       = (*Policy)(nil)
	_ reverseproxy.Selector = (*Policy)(nil)
)
