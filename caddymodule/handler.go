package caddymodule

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/earlyreject"
	"github.com/llmgw/caddy-llmgw/internal/spanattr"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

func init() {
	caddy.RegisterModule(new(Admission))
}

// Request vars shared between the handler and the selection policy (the
// reverse proxy's cloned request shares the vars map, see
// caddyhttp.GetVar).
const (
	varRequest     = "llm.request"      // *openai.Request
	varReservation = "llm.reservation"  // *upstreams.Reservation
	varPool        = "llm.pool"         // string
	varPlacement   = "llm.placement"    // *fleet.Placement: where admission counted the request
	varQueueWait   = "llm.queue_waited" // time.Duration the request was parked (debug_headers)
)

// DefaultMaxBody is max_body's default: room for a chat with a base64
// image of about 6 MiB (see Admission.MaxBody for the memory it bounds).
const DefaultMaxBody = 8 << 20

// Admission is the `llm_admission` HTTP handler: engine-wide admission
// control in front of reverse_proxy. It reads the request body once (bounded),
// extracts model and stream, and admits the request while some engine of the
// target pool is below its limits according to the engine's own gauges (so it
// sees every gateway and direct caller), with local accounting between
// scrapes. Otherwise it parks the request in a priority band — streaming
// clients get `: keep-alive` SSE comments while they wait — and answers 503
// with a computed Retry-After when parking runs out. When the engines' state
// is unknown it admits (fail-open) unless configured otherwise.
//
// A request for a model no engine of the pool serves is answered 404
// model_not_found. When the pool is routed by lb_policy llm, a request
// whose prompt the placement tokenized and which, with its max_tokens,
// does not fit the smallest max_model_len the model's engines report is
// answered vLLM's 400 before it waits (see contextLengthError).
//
// The parsed request is left in the request vars for the llm selection
// policy; {http.vars.llm.band} and {http.vars.llm.queue_wait} are set for
// logs.
//
// EXPERIMENTAL: Subject to change.
type Admission struct {
	// Largest request body read, in bytes. Larger bodies get 413.
	// After a 413, 408 or 400 on HTTP/1.x the rest of the body is read and
	// discarded, up to 4 × max_body (within 1–64 MiB) for at most 5s, so
	// that clients sending the whole body first read the answer.
	// The default admits a chat with a base64 image of about 6 MiB (base64
	// adds a third). A body is held in memory from its read until it has
	// been proxied, so request bodies can take up to max_body × the
	// requests being read, parked or proxied at once (8 GiB for 1,000
	// requests at the default): lower it, or bound the concurrency
	// (max_inflight, the server's connection limits) where images are sent.
	// Default: 8 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// Deadline for reading the request body (slow clients get 408).
	// Default: 30s.
	BodyTimeout caddy.Duration `json:"body_timeout,omitempty"`

	// An engine whose vllm:kv_cache_usage_perc is at or above this is full.
	// Default: 0.90.
	KVLimit float64 `json:"kv_limit,omitempty"`

	// Limit on running + waiting + dispatched-since-scrape requests per
	// engine, for engines without their own max_inflight in the llm app.
	// Default: 0, which treats an engine reporting waiting requests as full.
	MaxInflight int `json:"max_inflight,omitempty"`

	// The engines' prefill speed in uncached prompt tokens per second,
	// against which a wait at a request's prefix holder is weighed and a
	// long prompt's hold on its engine is timed (see the README's
	// cache-aware admission). Negative: never queue at a full holder.
	// Default: 0, each engine's own rate derived from its vLLM counters
	// (10000 until one is known).
	PrefillRate float64 `json:"prefill_rate,omitempty"`

	// Uncached prompt tokens above which a request occupies its engine for
	// its prefill (uncached tokens ÷ prefill_rate): the engine takes no
	// other request meanwhile. Negative: off. Default: 16384.
	LongPrefill int `json:"long_prefill,omitempty"`

	// Requests an engine at its max_inflight may still take, to wait in
	// its own queue: vLLM refills a freed slot from that queue at its
	// next step, where a request parked here reaches the engine only
	// after the finished stream's end comes back, about a step later.
	// 1 is enough for a saturated fleet (see the README). Needs
	// max_inflight. Default: 0, an engine at max_inflight is full.
	EngineQueue int `json:"engine_queue,omitempty"`

	// Longest a request stays parked before 503. Default: 120s.
	MaxPark caddy.Duration `json:"max_park,omitempty"`

	// Parked requests per band; a full band answers 503 at once.
	// Default: 1024.
	QueueSize int `json:"queue_size,omitempty"`

	// Interval of `: keep-alive` comments to parked streaming clients.
	// Default: 15s.
	Heartbeat caddy.Duration `json:"heartbeat,omitempty"`

	// A request parked this long is served as high priority, so that low
	// is not starved. Default: 10s.
	Aging caddy.Duration `json:"aging,omitempty"`

	// Header choosing the band: high, normal or low. Default: X-Priority.
	PriorityHeader string `json:"priority_header,omitempty"`

	// Header that, when "true", puts the request in the low band (cache
	// warm-up traffic). Default: X-Warmup.
	WarmupHeader string `json:"warmup_header,omitempty"`

	// Forward the band headers upstream. Default: false (removed).
	ForwardBandHeaders bool `json:"forward_band_headers,omitempty"`

	// Pool name. Requests of one pool share a queue; the llm selection
	// policy of the same route tells the pool's engines. Name pools when a
	// config has several. Default: "default".
	Pool string `json:"pool,omitempty"`

	// The engines (dial addresses) of this pool, overriding what the
	// policy learned. Default: learned, else every engine the llm app knows.
	Engines []string `json:"engines,omitempty"`

	// Only requests for these models are gated; others pass straight
	// through. Default: all models.
	Models []string `json:"models,omitempty"`

	// Reject (503) instead of admitting when every engine's state is
	// unknown or stale. Default: false (fail open: a metrics outage must not
	// become an inference outage).
	FailClosed bool `json:"fail_closed,omitempty"`

	// Ignore this gateway's local accounting when deciding whether an engine
	// has room: admission then trusts only the engines' last scraped gauges,
	// so a burst between two scrapes can overshoot max_inflight by the
	// whole burst. For comparison and debugging; leave it off. Default:
	// false (requests dispatched since the last scrape count against the
	// limit).
	DisableLocalAccounting bool `json:"disable_local_accounting,omitempty"`

	fleet  *fleet.Fleet
	logger *zap.Logger
	models map[string]bool
}

// CaddyModule returns the Caddy module information.
func (*Admission) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_admission",
		New: func() caddy.Module { return new(Admission) },
	}
}

// Provision sets up the handler.
func (h *Admission) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.setDefaults()
	app, err := appFromContext(ctx)
	if err != nil {
		return err
	}
	h.fleet = app.fleet
	return nil
}

// setDefaults fills the unset tunables.
func (h *Admission) setDefaults() {
	if h.MaxBody == 0 {
		h.MaxBody = DefaultMaxBody
	}
	if h.BodyTimeout == 0 {
		h.BodyTimeout = caddy.Duration(30 * time.Second)
	}
	if h.KVLimit == 0 {
		h.KVLimit = 0.90
	}
	if h.MaxPark == 0 {
		h.MaxPark = caddy.Duration(120 * time.Second)
	}
	if h.QueueSize == 0 {
		h.QueueSize = 1024
	}
	if h.Heartbeat == 0 {
		h.Heartbeat = caddy.Duration(15 * time.Second)
	}
	if h.Aging == 0 {
		h.Aging = caddy.Duration(10 * time.Second)
	}
	if h.PriorityHeader == "" {
		h.PriorityHeader = "X-Priority"
	}
	if h.WarmupHeader == "" {
		h.WarmupHeader = "X-Warmup"
	}
	if h.Pool == "" {
		h.Pool = "default"
	}
	if len(h.Models) > 0 {
		h.models = make(map[string]bool, len(h.Models))
		for _, m := range h.Models {
			h.models[m] = true
		}
	}
}

// Validate checks the configuration.
func (h *Admission) Validate() error {
	switch {
	case h.MaxBody < 0:
		return fmt.Errorf("max_body must not be negative")
	case h.KVLimit <= 0 || h.KVLimit > 1:
		return fmt.Errorf("kv_limit must be in (0, 1], got %v", h.KVLimit)
	case h.MaxInflight < 0:
		return fmt.Errorf("max_inflight must not be negative")
	case h.EngineQueue < 0:
		return fmt.Errorf("engine_queue must not be negative")
	case h.MaxPark < 0 || h.Heartbeat <= 0 || h.BodyTimeout < 0:
		return fmt.Errorf("max_park, heartbeat and body_timeout must be positive")
	case h.QueueSize < 0:
		return fmt.Errorf("queue_size must not be negative")
	case math.IsNaN(h.PrefillRate) || math.IsInf(h.PrefillRate, 0):
		return fmt.Errorf("prefill_rate must be a finite number, got %v", h.PrefillRate)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Admission) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !openai.IsInference(r) {
		return next.ServeHTTP(w, r)
	}
	req, fb, err := h.prepare(w, r)
	if req == nil {
		return err // answered
	}
	// The band headers are read and removed before anything else sees the
	// request, whether or not it is gated.
	band := h.band(r)
	if h.models != nil && !h.models[req.Model] {
		return next.ServeHTTP(w, r)
	}
	caddyhttp.SetVar(r.Context(), "llm.band", band.String())
	if _, notFound := h.fleet.Serving(req.Model, h.dials()); notFound {
		// Before NotePoolModel: a made-up name must not become one of
		// the pool's models.
		return modelNotFound(w, r, band.String(), cmp.Or(req.Alias, req.Model))
	}
	h.fleet.NotePoolModel(h.Pool, req.Model)

	a, done := h.admit(w, r, band, req)
	if !done && a.notFound {
		h.lateNotFound(w, r, cmp.Or(req.Alias, req.Model), &a)
		done = true
	}
	if !done && a.pinGone {
		lateResponseGone(w, req.PreviousResponseID, &a)
		done = true
	}
	spanattr.SetAdmission(trace.SpanFromContext(r.Context()), spanattr.Admission{Request: req, Pool: h.Pool, Band: band.String(),
		Outcome: a.outcome, Order: a.order.String(), Parked: a.waited, FailOpen: a.failOpen, Placement: a.place})
	if done {
		return nil
	}
	if a.res != nil {
		caddyhttp.SetVar(r.Context(), varReservation, a.res)
		if a.place != nil {
			caddyhttp.SetVar(r.Context(), varPlacement, a.place)
		}
		res := a.res
		fb.onSend = func() { h.fleet.Proxied(servedBy(r)).Follow(res) }
		fb.onSent = res.Sent
		// Released however the proxy ends, panics (http.ErrAbortHandler)
		// included; the release wakes parked requests.
		defer a.res.Done()
	}
	admittedTotal.WithLabelValues(band.String(), a.order.String()).Inc()
	if a.place != nil && a.place.Reason != "" {
		placedTotal.WithLabelValues(a.place.Reason).Inc()
	}
	if a.failOpen {
		failOpenTotal.Inc()
	}
	caddyhttp.SetVar(r.Context(), "llm.queue_wait", a.waited.String())
	caddyhttp.SetVar(r.Context(), varQueueWait, a.waited)
	// The metrics' model label is bounded: a name the fleet does not know
	// (admitted fail-open on engines whose models are unknown) is "other".
	model := h.fleet.ModelLabel(req.Model)
	return h.proxy(w, r, next, proxied{model: model, body: fb, sseSent: a.sseSent, res: a.res, record: responseRecorder(h.fleet, r, req)})
}

// prepare reads and parses the body, reinstalls it for the proxy and
// leaves the parsed request in the vars. A nil request means the client
// was answered (the error is the handler's result).
func (h *Admission) prepare(w http.ResponseWriter, r *http.Request) (*openai.Request, *followingBody, error) {
	body, status, err := h.readBody(w, r)
	if err != nil {
		// The client may still be sending its body: earlyreject drains it,
		// bounded, after the answer so that the client can read it.
		earlyreject.Refuse(w, r, h.MaxBody, func() { _ = writeJSONError(w, r, status, err.Error()) })
		return nil, nil, nil
	}
	req, body, err := parseRequest(h.fleet, openai.EndpointOf(r.URL.Path), body) // a model alias rewritten
	if err != nil {
		return nil, nil, writeRequestError(w, r, err)
	}
	fb := &followingBody{Reader: bytes.NewReader(body)}
	r.Body = fb
	setBodyLength(r, len(body))
	caddyhttp.SetVar(r.Context(), varRequest, req)
	caddyhttp.SetVar(r.Context(), varBody, &keptBody{body})
	caddyhttp.SetVar(r.Context(), varPool, h.Pool)
	return req, fb, nil
}

// varBody holds the *keptBody llm_admission read, for the length check of
// lb_policy llm on requests admission does not gate.
const varBody = "llm.body"

// keptBody is a request body kept in the vars; a pointer, so that a
// placeholder naming the var does not print the body.
type keptBody struct{ b []byte }

// admittedBody is the body llm_admission kept for r, nil if none.
func admittedBody(r *http.Request) []byte {
	if kb, ok := caddyhttp.GetVar(r.Context(), varBody).(*keptBody); ok && kb != nil {
		return kb.b
	}
	return nil
}

// contextLengthError is vLLM's 400 message for a request whose prompt,
// with the output budget its body asks for, does not fit the context of
// its model on the engines of dials serving it
// (fleet.ContextLimit): the engine would refuse it after a trip, and a
// parked one after its wait. It is "" when the request fits, or when the
// prompt's length (tokens 0: not tokenized) or the context's is unknown.
// Without a body (not kept) the prompt alone is checked, which every engine
// refuses whatever the budget (see openai.ContextLengthMessage).
func contextLengthError(f *fleet.Fleet, dials []string, p sizedPrompt) string {
	if p.req == nil || p.tokens <= 0 || !onePrompt(p.req) {
		return ""
	}
	limit := f.ContextLimit(p.req.Model, dials)
	if limit <= 0 {
		return ""
	}
	var budget int64
	if p.body != nil {
		budget = openai.OutputBudget(p.body, p.req.Messages != nil)
	}
	return openai.ContextLengthMessage(limit, p.tokens, budget)
}

// sizedPrompt is a request whose prompt the gateway counted: tokens of it
// (0: not tokenized), and its body (nil: not kept), where its output
// budget is read.
type sizedPrompt struct {
	req    *openai.Request
	tokens int
	body   []byte
}

// onePrompt reports whether req has one prompt, whose tokens the gateway
// counts as the engine does: a chat, or a completion whose prompt is a
// string or a flat list of token ids. vLLM checks each prompt of a batch
// on its own, so the tokens of a batch, however counted, say nothing.
func onePrompt(req *openai.Request) bool {
	if req.Messages != nil {
		return true
	}
	p := bytes.TrimSpace(req.Prompt)
	if len(p) == 0 {
		return false
	}
	if p[0] == '"' {
		return true
	}
	if p[0] != '[' {
		return false
	}
	p = bytes.TrimSpace(p[1:])
	return len(p) > 0 && p[0] >= '0' && p[0] <= '9'
}

// proxied is an admitted request on its way to the engine.
type proxied struct {
	model   string // the metrics' label (fleet.ModelLabel)
	body    *followingBody
	sseSent bool                   // parked as a stream: the SSE 200 is out
	res     *upstreams.Reservation // nil when the pool had no engine to count on
	record  func(id string)        // records a stored response's id (responseRecorder); nil for others
}

// firstToken is what happens at a stream's first token: the request's
// prefill is over on its engine, and the routing prediction made for it,
// if any, is compared with the time it took.
func firstToken(res *upstreams.Reservation) func() {
	return func() {
		res.Prefilled()
		if ttft, at, ok := res.Predicted(); ok {
			ttftErrorSeconds.WithLabelValues(res.Engine().Dial()).Observe(ttft - time.Since(at).Seconds())
		}
	}
}

// proxy runs the rest of the chain for an admitted request, observes the
// response, reports the engine's outcome to the breaker, and turns an
// upstream failure into an answer the client can read.
func (h *Admission) proxy(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, p proxied) error {
	ow := newObservingWriter(w, r, p.sseSent, time.Now(), p.model)
	ow.onResponse, ow.onFirst, ow.record = p.body.onSend, firstToken(p.res), p.record
	var err error
	ow.aborted, err = serveNext(next, ow, r)
	if p.sseSent {
		trailDebugHeaders(w.Header(), ow.hdr)
	}
	ow.finish()
	if ow.obs != nil {
		// The stream's token gaps are the engine's step time as this
		// gateway sees it, which sizes its scrape lead.
		st := ow.obs.Stats()
		p.res.Streamed(st.ITLSum, st.ITLCount)
	}
	if r.Context().Err() == nil { // a client that left says nothing about the engine
		outcome := err
		if ow.aborted {
			outcome = errUpstreamAborted
		}
		h.fleet.Proxied(servedBy(r)).Outcome(outcome, ow.status)
	}
	if ow.aborted && !ow.streaming() {
		// A non-streaming body cut short: aborting the connection is the
		// only honest signal left.
		panic(http.ErrAbortHandler)
	}
	if p.sseSent || ow.aborted {
		// Headers are out: an upstream failure can only be told in-band, and
		// returning an error would make Caddy write into the open stream.
		if err != nil || ow.aborted || ow.status >= 400 {
			h.streamError(w, r, ow, err)
		}
		return nil
	}
	if err != nil && ow.status == 0 && r.Context().Err() == nil {
		// Nothing was sent (no engine reachable, timeouts): answer in the
		// API's error format instead of Caddy's empty error page, naming no
		// internal address; the cause is logged as Caddy would.
		st := errStatus(err)
		h.logger.Error("upstream failed", zap.Int("status", st), zap.Error(err))
		return writeJSONError(w, r, st, "no engine could serve the request: "+strings.ToLower(http.StatusText(st)))
	}
	return err
}

// trailDebugHeaders sends the policy's debug headers (X-LLM-*) of a
// request that was parked with its stream open as trailers: its headers
// went out with the first keep-alive, before the policy chose an engine,
// and the upstream's headers are kept off the wire (observingWriter).
// net/http sends keys with http.TrailerPrefix after the body, over
// HTTP/1.1's chunked encoding and HTTP/2 alike.
func trailDebugHeaders(out, upstream http.Header) {
	for k, v := range upstream {
		if strings.HasPrefix(k, "X-Llm-") {
			out[http.TrailerPrefix+k] = v
		}
	}
}

// streamError ends an open SSE stream with an `event: error` telling why
// the upstream failed.
func (h *Admission) streamError(w http.ResponseWriter, r *http.Request, ow *observingWriter, err error) {
	msg := "upstream error"
	switch {
	case ow.aborted:
		msg = "upstream stream ended abruptly"
	case err != nil:
		// The cause (with internal addresses) goes to the log only.
		msg = "upstream error: " + strings.ToLower(http.StatusText(errStatus(err)))
	case ow.errBody.Len() > 0:
		msg = fmt.Sprintf("upstream error (%d): %s", ow.status, bytes.TrimSpace(ow.errBody.Bytes()))
	}
	st := ow.status
	if st < 400 {
		st = http.StatusBadGateway
	}
	ev := errorEvent(r, msg, st)
	if ow.aborted {
		// The cut may have fallen inside an event: end it first (a blank
		// line without data is no event).
		ev = append([]byte("\n\n"), ev...)
	}
	_, _ = ow.ResponseWriterWrapper.Write(ev)
	flush(w)
	if c := h.logger.Check(zapcore.DebugLevel, "upstream failed after SSE headers"); c != nil {
		c.Write(zap.Int("status", ow.status), zap.Error(err))
	}
}

// errUpstreamAborted is what the circuit breaker is told of an upstream
// response that failed after it started.
var errUpstreamAborted = errors.New("upstream response aborted")

// serveNext runs the rest of the chain. reverse_proxy panics with
// http.ErrAbortHandler when the upstream body fails after the response
// started; that is recovered so a stream can still end with an error event.
func serveNext(next caddyhttp.Handler, w http.ResponseWriter, r *http.Request) (aborted bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			aborted = true
		}
	}()
	return false, next.ServeHTTP(w, r)
}

// errStatus is the HTTP status of a handler error; 502 when it has none.
func errStatus(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode >= 400 {
		return he.StatusCode
	}
	return http.StatusBadGateway
}

// admitted is how a request got through the gate.
type admitted struct {
	band     admission.Band         // its priority band
	res      *upstreams.Reservation // nil when the pool had no engine to count on
	place    *fleet.Placement       // nil when not placed (no llm policy, a cache key)
	failOpen bool                   // admitted on unknown or stale engine state
	sseSent  bool                   // parked as a stream: the SSE 200 is out
	waited   time.Duration
	order    admission.Order // how the gate admitted it
	outcome  string          // "" when admitted, else why not (for the span)
	notFound bool            // let out of the gate because no engine serves its model
	pin      string          // the engine that stored its previous response, "" for none
	pinGone  bool            // let out of the gate because pin restarted or left while it waited
	prev     string          // the previous_response_id pin stored
}

// refused counts a request not admitted, for its reason.
func (a *admitted) refused(band admission.Band, reason string) {
	a.outcome = reason
	rejectedTotal.WithLabelValues(band.String(), reason).Inc()
}

// admit passes the request through the pool's gate, parking it while no
// engine has room. done reports that the request was answered (refused) or
// its client left, and must not be proxied.
func (h *Admission) admit(w http.ResponseWriter, r *http.Request, band admission.Band, req *openai.Request) (a admitted, done bool) {
	a.band = band
	dials := h.dials()
	serving, _ := h.fleet.Serving(req.Model, dials)
	lim := h.limits()
	if lim.FailClosed && !h.fleet.AnyKnown(serving) {
		// Nothing to wait for: parking would only delay the same answer.
		a.refused(band, "state_unknown")
		h.reject(w, r, rejection{band: band, position: 1, reason: "state_unknown"})
		return a, true
	}
	if h.pinResponse(w, req, serving, &a) {
		return a, true
	}
	a.place = h.place(r, req, dials, a.pin)
	if msg := h.contextLength(r, req, a.place, serving); msg != "" {
		// Before the gate: no wait makes the prompt shorter.
		a.outcome = "context_length_exceeded"
		_ = writeContextLength(w, r, band, msg)
		return a, true
	}
	try := h.try(req.Model, lim, &a)
	// Requests only some engines serve wait apart from the others (see
	// fleet.ModelGate): a full model must not hold back an idle one's.
	gate := h.fleet.ModelGate(h.Pool, dials, serving, admission.Config{QueueSize: h.QueueSize, Aging: time.Duration(h.Aging)})
	waiter, err := enterGate(gate, band, a.place != nil || a.pin != "", try)
	if errors.Is(err, admission.ErrQueueFull) {
		a.refused(band, "queue_full")
		h.reject(w, r, rejection{gate: gate, band: band, reason: "queue_full"})
		return a, true
	}
	if err != nil {
		a.outcome = "error"
		_ = writeJSONError(w, r, http.StatusInternalServerError, err.Error())
		return a, true
	}
	select {
	case <-waiter.Ready():
		a.order = waiter.Order()
		return a, false
	default:
	}
	return a, h.waitParked(w, r, parking{waiter: waiter, gate: gate, stream: req.Stream}, &a)
}

// parking is a request waiting in its gate.
type parking struct {
	waiter *admission.Waiter
	gate   *admission.Gate
	stream bool // its client asked for a stream: SSE keep-alives while it waits
}

// waitParked parks the request until its gate admits it, its client
// leaves or max_park ends, and reports whether it was answered (refused)
// or its client left instead of being admitted.
func (h *Admission) waitParked(w http.ResponseWriter, r *http.Request, p parking, a *admitted) (done bool) {
	parkedTotal.WithLabelValues(a.band.String()).Inc()
	out, sseSent := h.park(w, r, p.waiter, p.stream)
	a.sseSent, a.waited = sseSent, p.waiter.Waited()
	parkSeconds.WithLabelValues(a.band.String()).Observe(a.waited.Seconds())
	switch out {
	case parkAdmitted:
		a.order = p.waiter.Order()
		return false
	case parkClientGone:
		a.refused(a.band, "client_gone")
		if a.res != nil {
			a.res.Done() // admitted as the client left: hand the room back
		}
		return true
	}
	a.refused(a.band, "max_park")
	if sseSent {
		_, _ = w.Write(errorEvent(r, "no engine capacity within max_park; retry later", http.StatusServiceUnavailable))
		flush(w)
		return true
	}
	h.reject(w, r, rejection{gate: p.gate, band: a.band, position: p.waiter.Position(), reason: "max_park"})
	return true
}

// contextLength is contextLengthError for a placed request, whose
// placement tokenized its prompt; "" when it was not placed.
func (h *Admission) contextLength(r *http.Request, req *openai.Request, place *fleet.Placement, serving []string) string {
	if place == nil {
		return ""
	}
	return contextLengthError(h.fleet, serving, sizedPrompt{req, place.PromptTokens(), admittedBody(r)})
}

// try is the gate's try function for a request for model, which writes
// its outcome into a. It runs under the gate's lock, at Enter or from a
// Kick (a poll result or a completion); what it writes is read after
// Ready is closed or Leave returned, both ordered after it.
func (h *Admission) try(model string, lim fleet.Limits, a *admitted) admission.PlacedFunc {
	return func(pass admission.Pass) bool {
		if _, nf := h.fleet.Serving(model, h.dials()); nf {
			// The engines' models were learned after the request came
			// in, and none serves it: waiting would not change that.
			// Let it out, without a reservation, to be answered 404.
			a.notFound = true
			return true
		}
		if a.pin != "" {
			if dial, _ := h.fleet.PreviousResponse(a.prev); dial != a.pin {
				// Its engine restarted or left while it waited:
				// waiting longer would not bring the response back.
				a.pinGone = true
				return true
			}
		}
		rr, fo, ok := h.reserve(model, a, lim, pass)
		if ok {
			a.res, a.failOpen = rr, fo
		}
		return ok
	}
}

// reserve is one try at admitting a request for model: on the engine it
// is pinned to (a.pin, the one that stored its previous response) when it
// is, whatever the pass, as that engine is the only one it may go to; on
// its placement (a.place) when it has one; else on the engine serving
// model with the most room (an unplaced request enters the gate without a
// preferred pass, see enterGate).
func (h *Admission) reserve(model string, a *admitted, lim fleet.Limits, pass admission.Pass) (*upstreams.Reservation, bool, bool) {
	switch {
	case a.pin != "":
		return h.fleet.TryReserveModel(model, []string{a.pin}, lim)
	case a.place != nil:
		return a.place.Reserve(h.dials(), lim, pass)
	case pass == admission.PassPreferred:
		return nil, false, false
	}
	return h.fleet.TryReserveModel(model, h.dials(), lim)
}

// enterGate asks the gate for admission; a placed (or pinned) request may
// go ahead of its band when its prefix holder (or pinned engine) has room
// (admission.Gate.EnterPlaced).
func enterGate(gate *admission.Gate, band admission.Band, placed bool, try admission.PlacedFunc) (*admission.Waiter, error) {
	if placed {
		return gate.EnterPlaced(band, try)
	}
	return gate.Enter(band, func() bool { return try(admission.PassAny) })
}

// band picks the priority band from the request headers, and strips them
// unless they are to be forwarded.
func (h *Admission) band(r *http.Request) admission.Band {
	b := admission.Normal
	if v := r.Header.Get(h.PriorityHeader); v != "" {
		if pb, ok := admission.ParseBand(v); ok {
			b = pb
		}
	}
	if strings.EqualFold(r.Header.Get(h.WarmupHeader), "true") {
		b = admission.Low
	}
	if !h.ForwardBandHeaders {
		r.Header.Del(h.PriorityHeader)
		r.Header.Del(h.WarmupHeader)
	}
	return b
}

// place computes where the request should go when the pool is routed by
// lb_policy llm, which then sends it where admission counted it: nil for
// other policies (they route on their own, and a request queued at its
// prefix holder would land elsewhere) and for requests the policy pins by
// their cache key or to pin, the engine that stored their previous
// response.
func (h *Admission) place(r *http.Request, req *openai.Request, dials []string, pin string) *fleet.Placement {
	s, ok := h.fleet.PolicyOf(h.Pool)
	if !ok {
		return nil
	}
	pl := h.fleet.Place(r.Context(), fleet.Query{Request: req, Dials: dials, Settings: s, CacheKey: cacheKey(r, s.CacheKeyHeader), Pin: pin})
	if pl != nil {
		observeTokenize(pl.Tokenize) // the policy does not tokenize again
	}
	return pl
}

func (h *Admission) dials() []string {
	if len(h.Engines) > 0 {
		return h.fleet.EngineKeys(h.Engines) // an address with ranks: its ranks
	}
	return h.fleet.PoolDials(h.Pool)
}

// limits are the handler's; an llm pool's honor the breaker, as its policy does.
func (h *Admission) limits() fleet.Limits {
	_, llm := h.fleet.PolicyOf(h.Pool)
	return fleet.Limits{KV: h.KVLimit, MaxInflight: h.MaxInflight, FailClosed: h.FailClosed, IgnoreDispatched: h.DisableLocalAccounting,
		PrefillRate: h.PrefillRate, LongPrefill: h.LongPrefill, HonorBreaker: llm, EngineQueue: h.EngineQueue}
}

// parkOutcome is how parking ended.
type parkOutcome int

const (
	parkAdmitted   parkOutcome = iota
	parkClientGone             // context done or the connection failed
	parkTimedOut               // max_park passed
)

// park waits for admission. Streaming clients get the SSE response headers
// and keep-alive comments meanwhile. It waits on the request's own context,
// never the module's (cancelled by every config reload while requests
// continue). It returns how parking ended and whether SSE headers were sent.
// A waiter admitted in a race with its client leaving or its deadline
// passing counts as admitted only for the deadline: the caller still owns
// the reservation either way.
func (h *Admission) park(w http.ResponseWriter, r *http.Request, waiter *admission.Waiter, stream bool) (out parkOutcome, sseSent bool) {
	timer := time.NewTimer(time.Duration(h.MaxPark))
	defer timer.Stop()
	var tick <-chan time.Time
	if stream {
		hdr := w.Header()
		hdr.Set("Content-Type", "text/event-stream")
		hdr.Set("Cache-Control", "no-cache")
		hdr.Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		sseSent = true
		if _, err := w.Write(openai.KeepAlive); err != nil {
			waiter.Leave()
			return parkClientGone, sseSent
		}
		flush(w)
		t := time.NewTicker(time.Duration(h.Heartbeat))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-waiter.Ready():
			return parkAdmitted, sseSent
		case <-r.Context().Done():
			waiter.Leave()
			return parkClientGone, sseSent
		case <-timer.C:
			if waiter.Leave() {
				return parkAdmitted, sseSent
			}
			return parkTimedOut, sseSent
		case <-tick:
			_, err := w.Write(openai.KeepAlive)
			if err == nil {
				err = http.NewResponseController(w).Flush()
			}
			if err != nil {
				waiter.Leave()
				return parkClientGone, sseSent
			}
		}
	}
}

// rejection is why and where in the queue a request is refused.
type rejection struct {
	gate     *admission.Gate // its gate; nil when it never entered one
	band     admission.Band
	position int    // its place in the queue; 0: a newcomer's place in band
	reason   string // the llmgw_admission_rejected_total reason
}

// reject answers 503 with a Retry-After computed from the pool's observed
// drain rate and the request's queue position, in the format of r's API.
func (h *Admission) reject(w http.ResponseWriter, r *http.Request, rej rejection) {
	ra := h.fleet.RetryAfter(h.dials(), rej.gate, rej.band, rej.position, time.Duration(h.MaxPark))
	w.Header().Set("Retry-After", strconv.Itoa(int((ra+time.Second-1)/time.Second)))
	msg := "all engines are at capacity"
	switch rej.reason {
	case "queue_full":
		msg = "admission queue is full"
	case "state_unknown":
		msg = "the engines' load is unknown (metrics unavailable) and admission fails closed"
	}
	_ = writeJSONError(w, r, http.StatusServiceUnavailable, msg+"; retry later")
}

// lateNotFound answers a request the gate let out because no engine
// serves its model (see admit): 404 model_not_found, or, when it parked
// as a stream and the SSE 200 is out, the same error as an event.
func (h *Admission) lateNotFound(w http.ResponseWriter, r *http.Request, model string, a *admitted) {
	a.outcome = "model_not_found"
	if !a.sseSent {
		_ = modelNotFound(w, r, a.band.String(), model)
		return
	}
	rejectedTotal.WithLabelValues(a.band.String(), "model_not_found").Inc()
	_, _ = w.Write(errorEvent(r, "The model `"+model+"` does not exist.", http.StatusNotFound))
	flush(w)
}

// servedBy is the engine reverse_proxy used last, whatever its policy: the
// upstream's address, or the engine key of the data-parallel rank behind
// it that lb_policy llm picked (noteRank).
func servedBy(r *http.Request) string {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return ""
	}
	addr := repl.ReplaceAll("{http.reverse_proxy.upstream.hostport}", "")
	if p, ok := caddyhttp.GetVar(r.Context(), varRank).(rankPick); ok && p.addr == addr {
		return p.key
	}
	return addr
}

func flush(w http.ResponseWriter) { _ = http.NewResponseController(w).Flush() }

// Interface guards
var (
	_ caddy.Provisioner           = (*Admission)(nil)
	_ caddy.Validator             = (*Admission)(nil)
	_ caddyhttp.MiddlewareHandler = (*Admission)(nil)
)
