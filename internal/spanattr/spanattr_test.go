package spanattr

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
)

// recorded runs f on a span of a real SDK tracer and returns the ended
// span's attributes and events.
func recorded(t *testing.T, f func(trace.Span)) (map[attribute.Key]attribute.Value, []sdktrace.Event) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	_, span := tp.Tracer("test").Start(context.Background(), "req")
	f(span)
	span.End()
	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended", len(ended))
	}
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range ended[0].Attributes() {
		m[kv.Key] = kv.Value
	}
	return m, ended[0].Events()
}

func TestSetRoute(t *testing.T) {
	req := &openai.Request{Model: "m", Messages: []byte(`[]`)}
	d := fleet.Decision{Decision: routing.Decision{Index: 1, Tier: routing.Precise, Outcome: routing.Hit, Share: 0.5},
		Tokens: 100, BlockSize: 16, Tokenize: fleet.TokenizeResult{Called: true, Took: 3 * time.Millisecond}}
	attrs, events := recorded(t, func(s trace.Span) { SetRoute(s, req, d, "10.0.0.2:8000") })
	want := map[attribute.Key]attribute.Value{
		OperationName: attribute.StringValue("chat"), RequestModel: attribute.StringValue("m"),
		ProviderName: attribute.StringValue("vllm"), Tier: attribute.StringValue("precise"),
		RouteOutcome: attribute.StringValue("hit"), Pick: attribute.StringValue("10.0.0.2:8000"),
		MatchedBlocks: attribute.IntValue(3), // half of 6 full blocks
		PromptTokens:  attribute.IntValue(100), Tokenizer: attribute.StringValue("remote"),
		TokenizeCached: attribute.BoolValue(false), TokenizeSeconds: attribute.Float64Value(0.003),
	}
	for k, v := range want {
		if attrs[k] != v {
			t.Errorf("%s = %v, want %v", k, attrs[k].Emit(), v.Emit())
		}
	}
	if len(events) != 1 || events[0].Name != RouteEvent {
		t.Errorf("events %+v, want one %s", events, RouteEvent)
	}
}

func TestSetAdmission(t *testing.T) {
	req := &openai.Request{Model: "m", Prompt: []byte(`"hi"`)}
	pl := &fleet.Placement{Tier: routing.Approximate, Reason: fleet.ReasonHit, Engine: "e:1",
		Tokenize: fleet.TokenizeResult{Local: true, Took: time.Millisecond}}
	attrs, _ := recorded(t, func(s trace.Span) {
		SetAdmission(s, Admission{Request: req, Pool: "p", Band: "high", Order: "fifo", Parked: 2 * time.Second, Placement: pl})
	})
	for k, v := range map[attribute.Key]attribute.Value{
		OperationName: attribute.StringValue("text_completion"), Band: attribute.StringValue("high"),
		AdmissionOutcome: attribute.StringValue("admitted"), AdmissionOrder: attribute.StringValue("fifo"),
		ParkedSeconds: attribute.Float64Value(2), PlacementReason: attribute.StringValue("cache_hit"),
		PlacementEngine: attribute.StringValue("e:1"), Tier: attribute.StringValue("approximate"),
		Tokenizer: attribute.StringValue("local"), Pool: attribute.StringValue("p"),
	} {
		if attrs[k] != v {
			t.Errorf("%s = %v, want %v", k, attrs[k].Emit(), v.Emit())
		}
	}

	// A refusal says why, and has no admission order.
	attrs, _ = recorded(t, func(s trace.Span) {
		SetAdmission(s, Admission{Band: "low", Outcome: "queue_full", Order: "immediate"})
	})
	if attrs[AdmissionOutcome].AsString() != "queue_full" || attrs[AdmissionOrder].Type() != attribute.INVALID {
		t.Errorf("refusal: %v", attrs)
	}
	if _, ok := attrs[RequestModel]; ok {
		t.Error("a model without a request")
	}
}

// TestOddInput: nil and no-op spans, NaN shares, failed tokenization and
// zero block sizes neither panic nor put non-finite numbers on the span.
func TestOddInput(t *testing.T) {
	SetRoute(nil, nil, fleet.Decision{}, "")
	SetAdmission(nil, Admission{})
	_, span := noop.NewTracerProvider().Tracer("").Start(context.Background(), "x")
	SetRoute(span, nil, fleet.Decision{}, "")
	d := fleet.Decision{Decision: routing.Decision{Share: math.NaN()}, Tokens: 5,
		Tokenize: fleet.TokenizeResult{Called: true, Err: errors.New("boom")}}
	attrs, _ := recorded(t, func(s trace.Span) { SetRoute(s, nil, d, "") })
	if v := attrs[Share].AsFloat64(); v != 0 {
		t.Errorf("share %v, want 0 for NaN", v)
	}
	if attrs[TokenizeFailed] != attribute.BoolValue(true) || attrs[Tokenizer].AsString() != "remote" {
		t.Errorf("failed tokenization: %v", attrs)
	}
	if _, ok := attrs[MatchedBlocks]; ok {
		t.Error("matched blocks without a block size")
	}
}
