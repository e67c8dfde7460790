package caddymodule

import (
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/spanattr"
)

// otlpReceiver is an in-process OTLP/HTTP (protobuf) trace receiver, the
// exporter Caddy's tracing configures by default from the OTEL_* variables.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

// ServeHTTP decodes one export request and keeps its spans.
func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if r.URL.Path != "/v1/traces" || err != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// startOTLP starts a receiver and points Caddy's tracing at it. The
// variables are read when the tracing handler creates its provider, at
// the config load that follows.
func startOTLP(t *testing.T) *otlpReceiver {
	t.Helper()
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20") // ms: export at once
	return recv
}

// span is the received span of trace id, nil until it arrives.
func (o *otlpReceiver) span(id []byte) *tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.spans {
		if string(s.TraceId) == string(id) {
			return s
		}
	}
	return nil
}

// otlpAttrs indexes span attributes by key.
func otlpAttrs(kvs []*commonpb.KeyValue) map[string]*commonpb.AnyValue {
	m := make(map[string]*commonpb.AnyValue, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestTracingSpanCarriesDecisions: with Caddy's `tracing` on, exporting to
// an in-process OTLP receiver, the span of a routed request carries the
// GenAI request attributes and the admission and routing decisions — the
// same tier and pick the debug headers report.
func TestTracingSpanCarriesDecisions(t *testing.T) {
	recv := startOTLP(t)
	engines := startEngines(t, 2, vllmsim.Config{TimeScale: 50})
	gateway{patient: true, engines: kvEngines(engines...), siteExtra: "\ttracing\n", policy: "\t\t\tdebug_headers\n"}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	waitKV(t, engines...)

	// engine 1 holds the prefix: a precise hit there.
	prefix := "Traced instructions." + words("trace", 400)
	direct(t, engines[1], chat{system: prefix, user: "warm", maxTokens: 1}.body())
	waitBlocks(t, engines[1].Addr(), 400/16)
	r, traceID := tracedSend(t, chat{system: prefix, user: "traced", maxTokens: 2}.body(), map[string]string{"X-Priority": "high"})
	if r.status != http.StatusOK || r.upstream != engines[1].Addr() || r.tier != "precise" {
		t.Fatalf("traced request: %d on %s (%s), want 200 on %s (precise)", r.status, r.upstream, r.tier, engines[1].Addr())
	}

	s := recv.await(t, traceID)
	attrs := otlpAttrs(s.Attributes)
	for k, want := range map[string]string{
		string(spanattr.RequestModel): "sim-model", string(spanattr.OperationName): "chat",
		string(spanattr.ProviderName): "vllm", string(spanattr.Band): "high",
		string(spanattr.AdmissionOutcome): "admitted", string(spanattr.Tier): r.tier,
		string(spanattr.Pick): r.upstream, string(spanattr.RouteOutcome): "hit",
		string(spanattr.Tokenizer): "remote",
	} {
		if got := attrs[k].GetStringValue(); got != want {
			t.Errorf("span attribute %s = %q, want %q", k, got, want)
		}
	}
	if mb := attrs[string(spanattr.MatchedBlocks)].GetIntValue(); mb < 400/16 {
		t.Errorf("matched blocks %d, want at least the %d of the prefix", mb, 400/16)
	}
	if _, ok := attrs[string(spanattr.ParkedSeconds)].GetValue().(*commonpb.AnyValue_DoubleValue); !ok {
		t.Errorf("parked time missing: %v", attrs[string(spanattr.ParkedSeconds)])
	}
	events := 0
	for _, e := range s.Events {
		if e.Name == spanattr.RouteEvent {
			events++
		}
	}
	if events != 1 {
		t.Errorf("%d %s events, want 1 (one attempt)", events, spanattr.RouteEvent)
	}
}

// TestTracingSpanCarriesRefusal: a refused request's span says why —
// admission failing closed on engines whose state is unknown (nothing
// listens at the dial address) — and names no pick.
func TestTracingSpanCarriesRefusal(t *testing.T) {
	recv := startOTLP(t)
	gateway{engines: dialEngines("127.0.0.1:1"), siteExtra: "\ttracing\n", admission: "\t\tfail_closed\n"}.load(t)
	t.Cleanup(func() { resetGateway(t) })
	r, traceID := tracedSend(t, chatBody(false, "refused"), nil)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("fail_closed on an unknown engine: %d %s", r.status, r.body)
	}
	attrs := otlpAttrs(recv.await(t, traceID).Attributes)
	if got := attrs[string(spanattr.AdmissionOutcome)].GetStringValue(); got != "state_unknown" {
		t.Errorf("refused request's admission outcome %q, want state_unknown", got)
	}
	if got, ok := attrs[string(spanattr.Pick)]; ok {
		t.Errorf("refused request has a pick: %v", got)
	}
}

// tracedSend sends body with a traceparent header of a fresh trace id,
// which Caddy's tracing continues, and returns the reply and the id.
func tracedSend(t *testing.T, body string, header map[string]string) (reply, []byte) {
	t.Helper()
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	h := map[string]string{"traceparent": "00-" + hex.EncodeToString(id) + "-00f067aa0ba902b7-01"}
	for k, v := range header {
		h[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := send(ctx, "", body, h)
	if r.err != nil {
		t.Fatalf("traced request: %v", r.err)
	}
	return r, id
}

// await polls until the span of trace id has arrived.
func (o *otlpReceiver) await(t *testing.T, id []byte) *tracepb.Span {
	t.Helper()
	var s *tracepb.Span
	testwait.For(t, 20*time.Second, "the request's span at the OTLP receiver", func() bool {
		s = o.span(id)
		return s != nil
	})
	return s
}
