package caddymodule

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/readahead"
	"github.com/llmgw/caddy-llmgw/internal/spanattr"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
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
// upstreams (those whose breaker is open last).
//
// For requests llm_admission did not gate, the policy answers itself a
// model no upstream serves (404 model_not_found) and a prompt that, as
// routing tokenized it, does not fit its model's smallest max_model_len
// among the upstreams (vLLM's 400).
//
// Without llm_admission in front, the policy reads the body itself (up to
// max_body, restored for the upstream and handed afresh to every attempt,
// so response-based retries work without request_buffers) and reports each
// request's final status to the breaker. It waits for the body at most
// [policyBodyWait]: a slower client's request is routed on load alone and
// proxied as its body arrives. With llm_admission, response-based
// retries need request_buffers (the handler's body is read once).
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
	// Default: 8 MiB, as llm_admission's (DefaultMaxBody).
	MaxBody int64 `json:"max_body,omitempty"`

	// Consecutive failures that open a replica's circuit breaker.
	// Default: 5.
	BreakerFailures int `json:"breaker_failures,omitempty"`

	// How long an open breaker keeps a replica out before one probe.
	// Default: 10s.
	BreakerCooldown caddy.Duration `json:"breaker_cooldown,omitempty"`

	// Add X-LLM-Upstream and X-LLM-Tier response headers naming the chosen
	// replica and tier, X-LLM-Predicted-TTFT with the routing model's
	// predicted time to first token in seconds from dispatch (absent when
	// the pick made none) and X-LLM-Queue-Wait with the seconds
	// llm_admission parked the request, so a client can measure the
	// model's calibration request by request. A streaming request parked
	// with its stream open gets them as trailers. Default: false.
	DebugHeaders bool `json:"debug_headers,omitempty"`

	fleet    *fleet.Fleet
	gen      *fleet.Generation // the config generation this policy belongs to
	logger   *zap.Logger
	bodyWait time.Duration // policyBodyWait; shorter in unit tests
	// poolWarned is set once a `dynamic llm` of another pool was logged.
	poolWarned atomic.Bool
}

// policyBodyWait bounds how long Select waits for a request body it reads
// itself. Past it the request is routed on load alone and the proxy gets
// the bytes read so far followed by the rest, as they come (the engine
// cannot start before the whole body is there anyway, so waiting costs a
// slow client little; not waiting would cost it the prefix-cache hit). A
// client that stalls for good is bounded by Caddy's read_body timeout and
// by its connection, exactly as with any other selection policy.
const policyBodyWait = 5 * time.Second

// CaddyModule returns the Caddy module information.
func (*Policy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.llm",
		New: func() caddy.Module { return new(Policy) },
	}
}

// Provision sets up the policy.
func (p *Policy) Provision(ctx caddy.Context) error {
	app, err := appFromContext(ctx)
	if err != nil {
		return err
	}
	p.gen = app.gen
	p.setup(ctx.Logger(), app.fleet)
	return nil
}

// setup applies the defaults and registers the policy's settings with the
// fleet (Provision without a Caddy context, for tests).
func (p *Policy) setup(logger *zap.Logger, f *fleet.Fleet) {
	p.logger = logger
	p.Config.SetDefaults()
	if p.Pool == "" {
		p.Pool = "default"
	}
	if p.BlockSize == 0 {
		p.BlockSize = 16
	}
	if p.MaxBody == 0 {
		p.MaxBody = DefaultMaxBody
	}
	if p.BreakerFailures == 0 {
		p.BreakerFailures = 5
	}
	if p.BreakerCooldown == 0 {
		p.BreakerCooldown = caddy.Duration(10 * time.Second)
	}
	if p.bodyWait == 0 {
		p.bodyWait = policyBodyWait
	}
	p.fleet = f
	p.fleet.SetBreaker(routing.BreakerConfig{Failures: p.BreakerFailures, Cooldown: time.Duration(p.BreakerCooldown)})
	p.fleet.SetPolicy(p.Pool, p.settings())
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

func (p *Policy) settings() fleet.Settings {
	return fleet.Settings{Cost: p.Config, BlockSize: p.BlockSize, Tokenize: !p.DisableTokenize, CacheKeyHeader: p.CacheKeyHeader}
}

// varSelect holds the policy's *selectState of a request.
const varSelect = "llm.select"

// statusPlaceholder is where reverse_proxy leaves the upstream's status.
const statusPlaceholder = "http.reverse_proxy.status_code"

// selectState is one request's routing across reverse_proxy's attempts.
// Select runs on the request's goroutine; the end-of-request report may run
// on another, hence the mutex.
type selectState struct {
	mu sync.Mutex
	// req is the request reverse_proxy passes to Select: one clone per
	// handler invocation, the same across its retries.
	req   *http.Request
	tried map[string]bool // upstreams already picked by this invocation
	// last is the latest pick's attempt, nil after a nil pick or once
	// its failure was reported.
	last   *fleet.Attempt
	report bool // no llm_admission: the policy reports outcomes
	// body is the request body when the policy read it itself, reinstalled
	// before every attempt; bodyRead says not to read again.
	body     []byte
	bodyRead bool
	// w is the writer reverse_proxy passed to the latest Select (nil
	// when it passes none): the policy's own answers go there.
	w http.ResponseWriter
	// answered: the policy answered the request itself (its model is
	// served by no engine of the pool), so later attempts write nothing.
	answered bool
	// rankSet: an attempt set the data-parallel rank header (setRank).
	rankSet bool
}

// Select implements reverseproxy.Selector. w may be nil.
//
// reverse_proxy calls Select once per attempt, so a second call for one
// request means the previous pick failed: it counts against that replica's
// circuit breaker and the replica is not picked again for this request.
func (p *Policy) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	ctx := r.Context()
	res, _ := caddyhttp.GetVar(ctx, varReservation).(*upstreams.Reservation)
	repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	st := p.attempt(r, repl, res == nil)
	if st.answered {
		return nil // the policy answered the request itself
	}
	st.w = w
	g, ok := p.gather(pool, r, st, res)
	if !ok {
		return nil
	}
	place, _ := caddyhttp.GetVar(ctx, varPlacement).(*fleet.Placement)
	t0 := time.Now()
	chosen, pick := p.choose(r, g.req, g.cands, routeHints{res: res, place: place, pin: g.pin})
	if res == nil && p.tooLong(pool, sizedPrompt{req: g.req, tokens: pick.Tokens}, st) {
		p.releaseProbes(g.cands)
		return nil
	}
	if chosen == nil {
		pick.Tier = routing.LoadOnly
		chosen = p.quietestRank(fallback(g.cands, g.spare), g.cands, g.spare)
	}
	if chosen == nil {
		return nil // no candidate: no half-open probe was claimed
	}
	up, rank := p.realUpstream(pool, chosen)
	if up == nil {
		p.releaseProbes(g.cands)
		return nil
	}
	decisionSeconds.WithLabelValues(pick.Tier.String()).Observe(time.Since(t0).Seconds())
	p.commit(r, st, committed{req: g.req, pick: pick, chosen: chosen, res: res})
	st.setRank(r, rank)
	noteRank(r, up.Dial, chosen.Dial, rank)
	return up
}

// gathered is what Select routes among: the parsed request (nil when
// there is none to route on), the candidates serving its model, those
// whose breaker is open (spare), and the engine a previous_response_id
// pins it to.
type gathered struct {
	req          *openai.Request
	cands, spare []*reverseproxy.Upstream
	pin          string
}

// gather parses the request and gathers its candidates. ok is false when
// the policy answered the request itself (no engine serves its model, or
// the engine holding its previous response is gone): Select returns nil.
func (p *Policy) gather(pool reverseproxy.UpstreamPool, r *http.Request, st *selectState, res *upstreams.Reservation) (g gathered, ok bool) {
	p.checkPool(r)
	g.req = p.request(r, st)
	g.cands, g.spare = p.candidates(pool, st)
	if g.req != nil && res == nil && p.modelNotFound(pool, g.req, st) {
		p.releaseProbes(g.cands)
		return g, false
	}
	if g.req != nil {
		// Not even least_conn may send a request to an engine of
		// another model.
		g.cands, g.spare = p.serving(g.req.Model, g.cands), p.serving(g.req.Model, g.spare)
	}
	pin, gone := previousResponse(p.fleet, g.req, upstreamUsable(g.cands, g.spare), res == nil) // llm_admission counted its own
	if gone {
		p.releaseProbes(g.cands)
		p.responseGone(g.req, st)
		return g, false
	}
	g.cands, g.pin = withPin(g.cands, g.spare, pin), pin
	return g, true
}

// committed is a pick Select is about to return.
type committed struct {
	req    *openai.Request
	pick   *fleet.Pick
	chosen *reverseproxy.Upstream
	res    *upstreams.Reservation
}

// commit records a pick: its metrics and trace attributes, the attempt
// (which hands back the half-open probes of the candidates not chosen),
// the dispatch, and the debug headers.
func (p *Policy) commit(r *http.Request, st *selectState, c committed) {
	ctx := r.Context()
	pick, dial := c.pick, c.chosen.Dial
	prefixDecisions.WithLabelValues(pick.Tier.String(), pick.Outcome.String()).Inc()
	observeMultimodal(pick.Multimodal)
	spanattr.SetRoute(trace.SpanFromContext(ctx), c.req, pick.Decision, dial)
	a := pick.Commit(dial)
	st.mu.Lock()
	st.tried[dial] = true
	st.last = a
	st.mu.Unlock()
	if repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer); repl != nil {
		// The status left by an earlier attempt must not be taken for
		// this one's.
		repl.Delete(statusPlaceholder)
	}
	caddyhttp.SetVar(ctx, "llm.tier", pick.Tier.String())
	p.dispatch(ctx, a, c.res)
	if p.DebugHeaders && st.w != nil {
		setDebugHeaders(ctx, st.w.Header(), dial, pick)
	}
}

// setDebugHeaders sets the debug_headers on h. X-LLM-Queue-Wait is the
// time llm_admission parked the request (absent without llm_admission):
// the predicted TTFT counts from dispatch, so a client timing from its
// send subtracts it to compare the two. For a request parked with a
// stream open these go out as trailers (see trailDebugHeaders).
func setDebugHeaders(ctx context.Context, h http.Header, dial string, pick *fleet.Pick) {
	h.Set("X-LLM-Upstream", dial)
	h.Set("X-LLM-Tier", pick.Tier.String())
	if t := pick.Decision.Predicted; t > 0 {
		h.Set("X-LLM-Predicted-TTFT", strconv.FormatFloat(t, 'f', 4, 64))
	}
	if w, ok := caddyhttp.GetVar(ctx, varQueueWait).(time.Duration); ok {
		h.Set("X-LLM-Queue-Wait", strconv.FormatFloat(w.Seconds(), 'f', 4, 64))
	}
}

// fallback is the upstream for a request the fleet did not route (no
// request to route on, or every candidate excluded: saturated, KV full):
// least_conn among what is left rather than nil while any upstream is
// available; replicas whose breaker is open (spare) come last. Drained
// replicas never get new requests.
func fallback(cands, spare []*reverseproxy.Upstream) *reverseproxy.Upstream {
	if u := leastConn(cands); u != nil {
		return u
	}
	return leastConn(spare)
}

// checkPool warns, once, when the route's `dynamic llm <pool>` names
// another pool than the policy's: the policy would teach its own pool
// (and so the admission of that name) the other pool's engines, and two
// such routes would take turns at it.
func (p *Policy) checkPool(r *http.Request) {
	src, ok := caddyhttp.GetVar(r.Context(), varUpstreamsPool).(string)
	if !ok || src == p.Pool || p.poolWarned.Swap(true) {
		return
	}
	p.logger.Warn("lb_policy llm and dynamic llm name different pools; name the same pool in dynamic llm, lb_policy llm and llm_admission of the route",
		zap.String("policy_pool", p.Pool), zap.String("dynamic_pool", src))
}

// dispatch counts the request on the attempt's engine: admission's
// reservation res moves there; a request llm_admission did not gate (res
// nil) is counted by a reservation of the policy's own until it ends.
func (p *Policy) dispatch(ctx context.Context, a *fleet.Attempt, res *upstreams.Reservation) {
	if res != nil {
		a.Dispatch(res)
		return
	}
	res = a.Dispatch(nil)
	caddyhttp.SetVar(ctx, varReservation, res)
	context.AfterFunc(ctx, res.Done)
}

// attempt returns the request's routing state, starting it on the first
// attempt of a reverse_proxy handler. A later attempt of the same handler
// means the previous pick failed: the breaker hears of it. report says the
// policy reports the request's outcome itself (no llm_admission).
func (p *Policy) attempt(r *http.Request, repl *caddy.Replacer, report bool) *selectState {
	ctx := r.Context()
	st, ok := caddyhttp.GetVar(ctx, varSelect).(*selectState)
	switch {
	case !ok:
		st = &selectState{req: r, tried: make(map[string]bool), report: report}
		caddyhttp.SetVar(ctx, varSelect, st)
		if st.report {
			// llm_admission did not gate this request, so nobody else
			// reports its outcome to the breaker.
			context.AfterFunc(ctx, func() { p.reportEnd(st, repl) })
		}
	case st.req != r:
		// Another reverse_proxy handler serves the same request (after
		// handle_response, in handle_errors): its attempts start afresh,
		// and the previous handler's are over.
		if st.report {
			p.reportEnd(st, repl)
		}
		st.mu.Lock()
		st.req, st.tried, st.last = r, make(map[string]bool), nil
		st.mu.Unlock()
	default:
		st.mu.Lock()
		last := st.last
		st.last = nil
		st.mu.Unlock()
		if last != nil {
			last.Failed() // its breaker, its speculative entries
		}
	}
	return st
}

// candidates are the upstreams this attempt may pick (an engine with
// data-parallel ranks as one target per rank; see expand): available, not tried
// by this request, in service (not drained nor asleep), and allowed by
// their breaker; spare are
// those refused only by their breaker. It also teaches the fleet the pool's
// upstreams, for the admission handler of the same route.
func (p *Policy) candidates(pool reverseproxy.UpstreamPool, st *selectState) (cands, spare []*reverseproxy.Upstream) {
	now := time.Now()
	b := p.fleet.Breaker()
	all := make([]string, 0, len(pool))
	cands = make([]*reverseproxy.Upstream, 0, len(pool))
	consider := func(u *reverseproxy.Upstream, available bool) {
		all = append(all, u.Dial)
		if !available || st.tried[u.Dial] || p.fleet.OutOfService(u.Dial) {
			return
		}
		if !b.Allow(u.Dial, now) {
			spare = append(spare, u)
			return
		}
		cands = append(cands, u)
	}
	for _, pu := range pool {
		if pu == nil {
			continue
		}
		available := pu.Available()
		if p.fleet.Ranks(pu.Dial) == nil {
			consider(pu, available)
			continue
		}
		for _, u := range p.expand(pu) {
			consider(u, available)
		}
	}
	sort.Strings(all)
	p.fleet.LearnPool(p.gen, p.Pool, all)
	return cands, spare
}

// modelNotFound answers 404 model_not_found, as llm_admission does, for a
// request it did not gate whose model no upstream of pool serves, and
// reports whether it did so; Select then returns nil. reverse_proxy turns
// that nil into a 503 error of its own, which finds the answer written:
// Caddy logs it and its status line is superfluous, but the client reads
// the 404, which names the model as the client named it (an alias it
// sent, or the model). Without a writer (st.w nil) the 503 is all the
// client gets; no engine is asked either way.
func (p *Policy) modelNotFound(pool reverseproxy.UpstreamPool, req *openai.Request, st *selectState) bool {
	if st.answered {
		return true
	}
	if req.Model == "" {
		return false // any engine serves a request without a model
	}
	if _, notFound := p.fleet.Serving(req.Model, p.engineDials(pool)); !notFound {
		return false
	}
	if st.w != nil {
		st.answered = true
		// No band headers are read without llm_admission: the default band.
		_ = modelNotFound(st.w, st.req, admission.Normal.String(), cmp.Or(req.Alias, req.Model))
	}
	return true
}

// tooLong answers vLLM's 400, as llm_admission does for the requests it
// places, for a request it did not gate whose prompt (tokenized by the
// routing decision: tokens 0 when not) does not fit its model's context
// on the pool's engines, and reports whether it did so; Select then
// returns nil, with the consequences modelNotFound describes. The budget
// is read from the body the policy read, or llm_admission kept.
func (p *Policy) tooLong(pool reverseproxy.UpstreamPool, sp sizedPrompt, st *selectState) bool {
	if sp.req == nil || sp.req.Model == "" || sp.tokens <= 0 {
		return false // no context to check against (fleet.ContextLimit): no dials to list
	}
	sp.body = st.body
	if sp.body == nil {
		sp.body = admittedBody(st.req)
	}
	msg := contextLengthError(p.fleet, p.engineDials(pool), sp)
	if msg == "" {
		return false
	}
	if st.w != nil {
		st.answered = true
		// No band headers are read without llm_admission: the default band.
		_ = writeContextLength(st.w, st.req, admission.Normal, msg)
	}
	return true
}

// responseGone answers a follow-up whose previous response's engine is
// gone (restarted, left, drained or failed this request) with vLLM's 404,
// with the consequences modelNotFound describes: no engine holds the
// response any more, and another would answer as if it never existed.
func (p *Policy) responseGone(req *openai.Request, st *selectState) {
	if st.w != nil {
		st.answered = true
		writeResponseNotFound(st.w, req.PreviousResponseID)
	}
}

// withPin is cands with the upstream of pin from spare added: a request
// pinned to an engine behind an open breaker goes there still, as no
// other holds its previous response.
func withPin(cands, spare []*reverseproxy.Upstream, pin string) []*reverseproxy.Upstream {
	if pin == "" || upstreamUsable(cands)(pin) {
		return cands
	}
	for _, u := range spare {
		if u.Dial == pin {
			return append(cands, u)
		}
	}
	return cands
}

// releaseProbes hands back the half-open breaker probes candidates
// claimed for an attempt that picks none of them, as Pick.Commit does for
// those it does not pick: the next request may probe them at once.
func (p *Policy) releaseProbes(cands []*reverseproxy.Upstream) {
	b, now := p.fleet.Breaker(), time.Now()
	for _, u := range cands {
		if b.State(u.Dial, now) == routing.StateHalfOpen {
			b.Release(u.Dial)
		}
	}
}

// serving is those of ups that may serve model (see fleet.Serving): ups
// itself when none is left out.
func (p *Policy) serving(model string, ups []*reverseproxy.Upstream) []*reverseproxy.Upstream {
	if model == "" || len(ups) == 0 {
		return ups
	}
	dials := make([]string, len(ups))
	for i, u := range ups {
		dials[i] = u.Dial
	}
	keep, _ := p.fleet.Serving(model, dials)
	if len(keep) == len(ups) {
		return ups
	}
	out := make([]*reverseproxy.Upstream, 0, len(keep))
	for _, u := range ups {
		if slices.Contains(keep, u.Dial) {
			out = append(out, u)
		}
	}
	return out
}

// routeHints are what the request's way so far says of where it goes:
// admission's reservation (nil: not gated) and placement (nil: not
// placed), and the engine holding its previous response ("" for none).
type routeHints struct {
	res   *upstreams.Reservation
	place *fleet.Placement
	pin   string
}

// choose asks the fleet where the request goes among cands; nil when it
// has no answer (no candidate, no request, or every candidate excluded),
// with a pick to commit to whichever upstream the caller chooses instead.
// A request llm_admission placed goes to the engine its reservation counts
// on, the decision admission made, while that engine is a candidate (not
// failed by this request, drained or behind an open breaker since). A
// request pinned to the engine that stored its previous response goes
// there (pin is among cands: Select answers the others).
func (p *Policy) choose(r *http.Request, req *openai.Request, cands []*reverseproxy.Upstream, h routeHints) (*reverseproxy.Upstream, *fleet.Pick) {
	res, place, pin := h.res, h.place, h.pin
	if len(cands) == 0 {
		return nil, p.fleet.Unrouted(req, nil)
	}
	q := fleet.Query{Request: req, Dials: make([]string, len(cands)), Settings: p.settings(), CacheKey: cacheKey(r, p.CacheKeyHeader), Pin: pin}
	for i, u := range cands {
		q.Dials[i] = u.Dial
	}
	if res != nil {
		q.Own = res.Engine().Dial()
	}
	if q.CacheKey == "" && req == nil {
		return nil, p.fleet.Unrouted(req, q.Dials)
	}
	if place != nil && q.CacheKey == "" {
		if pick, ok := place.Pick(q.Dials); ok && q.Dials[pick.Index] == q.Own {
			prefixShare.Observe(pick.Share) // as for a request the policy routes itself
			return cands[pick.Index], pick
		}
	}
	pick := p.fleet.Route(r.Context(), q)
	observeTokenize(pick.Tokenize)
	if pick.Index < 0 {
		return nil, pick
	}
	if pick.Tier != routing.CacheKey {
		prefixShare.Observe(pick.Share)
	}
	return cands[pick.Index], pick
}

// reportEnd feeds the breaker with the last attempt's result when the
// request ends, for requests llm_admission did not gate: a 5xx is a
// failure, any other status a success. Without a status (no response, or
// the client left first) nothing is reported.
func (p *Policy) reportEnd(st *selectState, repl *caddy.Replacer) {
	st.mu.Lock()
	last := st.last
	st.mu.Unlock()
	if last == nil || repl == nil {
		return
	}
	v, ok := repl.Get(statusPlaceholder)
	status, isInt := v.(int)
	if !ok || !isInt {
		return
	}
	last.Outcome(nil, status)
}

// request returns the parsed request left by llm_admission, or parses the
// body itself (bounded in size and time, and restored for the upstream)
// when that handler did not run. The body is read at most once per
// request; when the policy read it whole, every attempt gets it afresh.
func (p *Policy) request(r *http.Request, st *selectState) *openai.Request {
	if st.body != nil {
		r.Body = io.NopCloser(bytes.NewReader(st.body))
	}
	if req, ok := caddyhttp.GetVar(r.Context(), varRequest).(*openai.Request); ok && req != nil {
		return req
	}
	if st.bodyRead {
		return nil
	}
	st.bodyRead = true
	ep := openai.EndpointOf(r.URL.Path)
	if r.Method != http.MethodPost || ep == openai.EndpointOther || r.Body == nil || r.Body == http.NoBody || r.ContentLength > p.MaxBody {
		return nil
	}
	// A read with no deadline of its own would hold this request's
	// selection for as long as its client stalls: read in the background
	// and stop waiting at bodyWait. (The server's read deadline cannot
	// serve: when it fires, net/http cancels the request's context, and
	// the request could only be failed.)
	ab := readahead.New(r.Body, p.MaxBody+1, r.ContentLength)
	wait := time.NewTimer(p.bodyWait)
	defer wait.Stop()
	select {
	case <-ab.Done():
	case <-wait.C:
		p.logger.Debug("request body not received in time; routing on load alone",
			zap.Duration("waited", p.bodyWait), zap.Int("bytes_read", ab.Buffered()))
		r.Body = ab // what was read, then the rest as it comes
		return nil
	case <-r.Context().Done():
		r.Body = ab
		return nil
	}
	body, err := ab.Result()
	if err != io.EOF || int64(len(body)) > p.MaxBody {
		// A read error, or over max_body: give the proxy back what was
		// read, followed by the rest.
		r.Body = ab
		return nil
	}
	req, body, err := parseRequest(p.fleet, ep, body) // a model alias rewritten
	st.body = body
	r.Body = io.NopCloser(bytes.NewReader(body))
	if r.ContentLength >= 0 && r.ContentLength != int64(len(body)) {
		setBodyLength(r, len(body)) // rewritten; a chunked body stays chunked
	}
	if err != nil {
		return nil
	}
	caddyhttp.SetVar(r.Context(), varRequest, req)
	return req
}

// cacheKey is the request's cache_key_header value: the policy pins such
// requests, and admission leaves them unplaced. No header has an empty
// name, so it is "" when none is configured.
func cacheKey(r *http.Request, header string) string { return r.Header.Get(header) }

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

// Interface guards
var (
	_ caddy.Provisioner     = (*Policy)(nil)
	_ caddy.Validator       = (*Policy)(nil)
	_ reverseproxy.Selector = (*Policy)(nil)
)
