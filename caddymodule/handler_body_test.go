package caddymodule

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// gatewayRequest is a request to the gateway; its body is sent chunked (no
// Content-Length) when chunked is set.
func gatewayRequest(t *testing.T, ctx context.Context, method, path, contentType string, body []byte, chunked bool, header map[string]string) *http.Request {
	t.Helper()
	var rd io.Reader = bytes.NewReader(body)
	if chunked {
		rd = io.MultiReader(rd) // unknown length: Transfer-Encoding: chunked
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+gatewayAddr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return req
}

// TestAdmissionHostileBodies: bad bodies never reach the engine and never
// crash the gateway: over max_body → 413, malformed → 400, both with an
// OpenAI-style JSON error; an oversized header is refused by the server.
// A normal request still works afterwards.
func TestAdmissionHostileBodies(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{})[0]
	rec := newUpstreamRecorder(t, e)
	gateway{engines: dialEngines(rec.addr()), admission: "\t\tmax_body 1MiB\n"}.load(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	big := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("a", 2<<20) + `"}]}`)
	deep := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`)
	for _, tc := range []struct {
		name    string
		body    []byte
		chunked bool
		header  map[string]string
		status  int
		param   string // expected "param" of the error, if any
	}{
		{name: "truncated", body: []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hi"`), status: 400},
		{name: "deep nesting", body: deep, status: 400},
		{name: "deep nesting chunked", body: deep, chunked: true, status: 400},
		{name: "messages not an array", body: []byte(`{"model":"sim-model","messages":"hello"}`), status: 400, param: "messages"},
		{name: "model not a string", body: []byte(`{"model":42,"messages":[]}`), status: 400, param: "model"},
		{name: "stream not a bool", body: []byte(`{"model":"sim-model","stream":"yes","messages":[]}`), status: 400, param: "stream"},
		{name: "non-UTF-8", body: []byte("{\"model\":\"sim-\xff\xfe\",\"messages\":[]}"), status: 400},
		{name: "NUL and binary", body: []byte("\x00\x01\x02{\"model\":1}\x00"), status: 400},
		{name: "empty", body: nil, status: 400},
		{name: "array", body: []byte(`[{"model":"sim-model"}]`), status: 400},
		{name: "null", body: []byte(`null`), status: 400},
		{name: "trailing garbage", body: []byte(`{"model":"sim-model","messages":[]} {}`), status: 400},
		{name: "2 MB body", body: big, status: 413},
		{name: "2 MB body chunked", body: big, chunked: true, status: 413},
		{name: "huge header value", body: []byte(chatBody(false, "hi")), header: map[string]string{"X-Huge": strings.Repeat("h", 2<<20)}, status: 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := rec.count()
			r := do(nil, gatewayRequest(t, ctx, http.MethodPost, "/v1/chat/completions", "application/json", tc.body, tc.chunked, tc.header), nil)
			if r.err != nil {
				t.Fatalf("request failed (gateway crashed or reset?): %v", r.err)
			}
			body := r.body
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %.300s", r.status, tc.status, body)
			}
			if rec.count() != before {
				t.Errorf("a rejected body reached the upstream")
			}
			if tc.status == 431 {
				return // refused by net/http before any handler runs
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			_, typ, code := openAIError(t, body)
			if code != tc.status || typ != "invalid_request_error" {
				t.Errorf("error type %q code %d: %s", typ, code, body)
			}
			if tc.param != "" && !strings.Contains(body, `"param":"`+tc.param+`"`) {
				t.Errorf("error does not name param %q: %s", tc.param, body)
			}
		})
	}

	r := do(nil, gatewayRequest(t, ctx, http.MethodPost, "/v1/chat/completions", "application/json", []byte(chatBody(false, "still alive")), true, nil), nil)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("normal chunked request after the hostile ones: %d %v %s", r.status, r.err, r.body)
	}
	if got := rec.last(t); string(got.body) != chatBody(false, "still alive") {
		t.Errorf("upstream got body %q", got.body)
	}
}

// TestAdmissionPassThrough: requests that are not JSON inference calls are
// neither read nor gated: the upstream sees the very bytes and headers sent,
// even while the engine is at its limit.
func TestAdmissionPassThrough(t *testing.T) {
	e := slowEngine(t)
	rec := newUpstreamRecorder(t, e)
	gateway{engines: dialEngines(rec.addr()), admission: "\t\tmax_inflight 1\n\t\tmax_park 30s\n\t\tmax_body 1KiB\n"}.load(t)
	occupy(t, e, 1)
	waitBusy(t, rec.addr(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	long := strings.Repeat("not json, and longer than max_body. ", 100)
	for _, tc := range []struct {
		name, method, path, contentType, body string
	}{
		{"text body on an inference path", http.MethodPost, "/v1/chat/completions", "text/plain", long},
		{"form on an inference path", http.MethodPost, "/v1/completions", "application/x-www-form-urlencoded", "a=1&b=2"},
		{"JSON on another path", http.MethodPost, "/v1/messages/count_tokens", "application/json", `{"model":"sim-model","messages":[]` + long},
		{"GET models", http.MethodGet, "/v1/models", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r := do(nil, gatewayRequest(t, ctx, tc.method, tc.path, tc.contentType, []byte(tc.body), false, map[string]string{"X-Priority": "low"}), nil); r.err != nil {
				t.Fatal(r.err)
			}
			got := rec.last(t)
			if got.method != tc.method || got.path != tc.path || string(got.body) != tc.body || got.header.Get("X-Priority") != "low" {
				t.Errorf("upstream saw %s %s %q X-Priority=%q", got.method, got.path, got.body, got.header.Get("X-Priority"))
			}
		})
	}
	if d := queueDepth(t, ""); d != 0 {
		t.Errorf("%d requests parked", d)
	}
}

// TestAdmissionModels: with `models`, only requests for the listed models
// are gated; others pass straight through even when the engines are full.
// The engine serves the gated model too (as an alias): a model no engine
// serves is answered 404 rather than parked.
func TestAdmissionModels(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{TimeScale: 1, DecodeStepTime: 10 * time.Millisecond,
		ModelAliases: []string{"gated-model"}})[0]
	parkGateway(e, "\t\tmax_park 30s\n\t\tmodels gated-model other-gated\n").load(t)
	occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)
	parked := metricValue(t, "llmgw_admission_parked_total")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	r := waitReply(t, sendAsync(ctx, "", chatBody(false, "ungated model"), nil), 30*time.Second)
	if r.status != http.StatusOK {
		t.Fatalf("ungated model: %d %s", r.status, r.body)
	}
	if v := metricValue(t, "llmgw_admission_parked_total"); v != parked {
		t.Errorf("ungated request parked (%v -> %v)", parked, v)
	}

	gctx, gcancel := context.WithCancel(ctx)
	ch := sendAsync(gctx, "", `{"model":"gated-model","messages":[{"role":"user","content":"x"}]}`, nil)
	waitQueueDepth(t, "normal", 1)
	gcancel()
	<-ch
	waitQueueDepth(t, "", 0)
}
