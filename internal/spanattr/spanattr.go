// Package spanattr puts the gateway's admission and routing decisions on
// a request's OpenTelemetry span (the one Caddy's tracing handler starts;
// without it the span is a no-op and nothing is built).
//
// Names follow the GenAI semantic conventions where they apply —
// gen_ai.operation.name, gen_ai.request.model, gen_ai.provider.name (the
// successor of the deprecated gen_ai.system; "vllm" is not one of its
// well-known values, which the conventions allow) — and are llmgw.*
// otherwise. Durations are in seconds, as doubles.
package spanattr

import (
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
)

// Attribute keys.
const (
	OperationName = attribute.Key("gen_ai.operation.name")
	RequestModel  = attribute.Key("gen_ai.request.model")
	ProviderName  = attribute.Key("gen_ai.provider.name")

	Pool             = attribute.Key("llmgw.pool")
	Band             = attribute.Key("llmgw.band")
	AdmissionOutcome = attribute.Key("llmgw.admission.outcome")
	AdmissionOrder   = attribute.Key("llmgw.admission.order")
	ParkedSeconds    = attribute.Key("llmgw.admission.parked_seconds")
	FailOpen         = attribute.Key("llmgw.admission.fail_open")
	PlacementReason  = attribute.Key("llmgw.placement.reason")
	PlacementEngine  = attribute.Key("llmgw.placement.engine")

	Tier          = attribute.Key("llmgw.route.tier")
	RouteOutcome  = attribute.Key("llmgw.route.outcome")
	Pick          = attribute.Key("llmgw.route.pick")
	MatchedBlocks = attribute.Key("llmgw.route.matched_blocks")
	Share         = attribute.Key("llmgw.route.share")
	PromptTokens  = attribute.Key("llmgw.route.prompt_tokens")

	Tokenizer       = attribute.Key("llmgw.tokenizer")
	TokenizeCached  = attribute.Key("llmgw.tokenize.cached")
	TokenizeSeconds = attribute.Key("llmgw.tokenize.seconds")
	TokenizeFailed  = attribute.Key("llmgw.tokenize.failed")
)

// RouteEvent is the span event recorded at every pick, so that the
// attempts of a retried request all show (the attributes keep the last).
const RouteEvent = "llmgw.route"

// Admission is what llm_admission decided about a request.
type Admission struct {
	Request *openai.Request // nil: nothing about the model is known
	Pool    string
	Band    string
	// Outcome is "" when the request was admitted, else why not: a reason
	// of llmgw_admission_rejected_total (queue_full, max_park,
	// state_unknown, client_gone) or "error".
	Outcome string
	Order   string        // how the gate admitted it (immediate, fifo, ...)
	Parked  time.Duration // time spent parked

	FailOpen  bool
	Placement *fleet.Placement // nil when not placed
}

// SetAdmission puts a's attributes on span.
func SetAdmission(span trace.Span, a Admission) {
	if span == nil || !span.IsRecording() {
		return
	}
	outcome := a.Outcome
	if outcome == "" {
		outcome = "admitted"
	}
	kv := append(requestAttrs(a.Request),
		Pool.String(a.Pool), Band.String(a.Band), AdmissionOutcome.String(outcome),
		ParkedSeconds.Float64(a.Parked.Seconds()), FailOpen.Bool(a.FailOpen))
	if a.Outcome == "" && a.Order != "" {
		kv = append(kv, AdmissionOrder.String(a.Order)) // a refused request has none
	}
	if p := a.Placement; p != nil {
		kv = append(kv, Tier.String(p.Tier.String()))
		if p.Reason != "" {
			kv = append(kv, PlacementReason.String(p.Reason))
		}
		if p.Engine != "" {
			kv = append(kv, PlacementEngine.String(p.Engine))
		}
		kv = append(kv, tokenizeAttrs(p.Tokenize)...)
	}
	span.SetAttributes(kv...)
}

// SetRoute puts a routing decision and its pick (the upstream's dial
// address) on span, as attributes and as a RouteEvent. req may be nil.
func SetRoute(span trace.Span, req *openai.Request, d fleet.Decision, pick string) {
	if span == nil || !span.IsRecording() {
		return
	}
	kv := []attribute.KeyValue{Tier.String(d.Tier.String()), RouteOutcome.String(d.Outcome.String()),
		Pick.String(pick), Share.Float64(finite(d.Share))}
	if d.Tokens > 0 {
		kv = append(kv, PromptTokens.Int(d.Tokens))
		if d.BlockSize > 0 {
			// Share is the matched part of the prompt's full blocks.
			blocks := float64(d.Tokens / d.BlockSize)
			kv = append(kv, MatchedBlocks.Int(int(math.Round(finite(d.Share)*blocks))))
		}
	}
	kv = append(kv, tokenizeAttrs(d.Tokenize)...)
	span.AddEvent(RouteEvent, trace.WithAttributes(kv...))
	span.SetAttributes(append(requestAttrs(req), kv...)...)
}

// requestAttrs are the GenAI attributes of a parsed request.
func requestAttrs(req *openai.Request) []attribute.KeyValue {
	if req == nil {
		return nil
	}
	op := "text_completion"
	if req.Messages != nil {
		op = "chat"
	}
	kv := []attribute.KeyValue{OperationName.String(op), ProviderName.String("vllm")}
	if req.Model != "" {
		kv = append(kv, RequestModel.String(req.Model))
	}
	return kv
}

// tokenizeAttrs say how the prompt's tokens were had: "local" (the
// model's tokenizer in process), "remote" (an engine's /tokenize, or its
// cache), or "none" (not tokenized: approximate tier).
func tokenizeAttrs(t fleet.TokenizeResult) []attribute.KeyValue {
	switch {
	case t.Local:
		return []attribute.KeyValue{Tokenizer.String("local"), TokenizeSeconds.Float64(t.Took.Seconds())}
	case !t.Called:
		return []attribute.KeyValue{Tokenizer.String("none")}
	}
	kv := []attribute.KeyValue{Tokenizer.String("remote"), TokenizeCached.Bool(t.Cached), TokenizeFailed.Bool(t.Err != nil)}
	if !t.Cached {
		kv = append(kv, TokenizeSeconds.Float64(t.Took.Seconds()))
	}
	return kv
}

// finite replaces NaN and infinities, which OTLP exporters may reject, by 0.
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}
