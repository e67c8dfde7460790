package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestAdmissionParkedStream: a parked `stream: true` request gets one 200
// response carrying `: keep-alive` comments while it waits, then the
// upstream's tokens and [DONE] — the upstream's own status line and headers
// never reach the wire a second time.
func TestAdmissionParkedStream(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 30s\n\t\theartbeat 50ms\n").load(t)
	occ := occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openStream(t, ctx, chat{user: "parked stream", maxTokens: 6, stream: true, usage: true}.body(), nil)
	if s.res.StatusCode != http.StatusOK || !strings.HasPrefix(s.res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("parked stream: %d %q", s.res.StatusCode, s.res.Header.Get("Content-Type"))
	}
	keepAlives := 0
	for keepAlives < 3 {
		l, ok := s.next(t, 10*time.Second)
		if !ok {
			t.Fatal("stream ended while parked")
		}
		switch {
		case l == ": keep-alive":
			keepAlives++
		case l == "":
		default:
			t.Fatalf("while parked got %q", l)
		}
	}
	if st := e.Stats(); st.Running+st.Waiting != 1 {
		t.Fatalf("parked stream reached the engine: %+v", st)
	}
	occ[0].release()

	rest := s.rest(t, 30*time.Second)
	var data []string
	sawUsage := false
	for _, l := range rest {
		switch {
		case l == "" || l == ": keep-alive":
		case strings.HasPrefix(l, "data: "):
			data = append(data, l)
			if strings.Contains(l, `"usage":{`) {
				sawUsage = true
			}
		default:
			t.Errorf("unexpected line %q", l)
		}
	}
	if len(data) < 7 || data[len(data)-1] != "data: [DONE]" || !sawUsage {
		t.Fatalf("after admission got %d data lines (usage %v): %q", len(data), sawUsage, data)
	}
	for _, l := range data[:len(data)-1] {
		var v map[string]any
		if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &v); err != nil {
			t.Errorf("data line is not JSON: %q", l)
		}
	}
}

// TestAdmissionParkedStreamUpstreamError: when the upstream answers a
// resumed stream with a 500 (after our 200 went out), the client gets an
// `event: error` whose data is one OpenAI-style JSON error — never the
// upstream's JSON or HTML spliced into the stream.
func TestAdmissionParkedStreamUpstreamError(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 30s\n\t\theartbeat 50ms\n").load(t)
	occ := occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openStream(t, ctx, chat{user: "parked, then the engine fails", maxTokens: 6, stream: true, usage: true}.body(), nil)
	if l, _ := s.next(t, 10*time.Second); l != ": keep-alive" {
		t.Fatalf("first line %q", l)
	}
	e.SetFaults(vllmsim.Faults{Error500: true})
	t.Cleanup(func() { e.SetFaults(vllmsim.Faults{}) })
	occ[0].release()

	rest := s.rest(t, 30*time.Second)
	var event, data string
	for i, l := range rest {
		switch {
		case l == "" || l == ": keep-alive":
		case l == "event: error" && i+1 < len(rest):
			event, data = l, rest[i+1]
		case strings.HasPrefix(l, "data: ") && event != "":
		default:
			t.Errorf("line outside SSE framing: %q", l)
		}
	}
	if event == "" || !strings.HasPrefix(data, "data: ") {
		t.Fatalf("no error event in %q", rest)
	}
	var v struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(data, "data: ")), &v); err != nil {
		t.Fatalf("error event data is not JSON: %q", data)
	}
	if v.Error.Code != 500 || v.Error.Type != "server_error" || !strings.Contains(v.Error.Message, "EngineCore") {
		t.Errorf("error event %+v", v.Error)
	}
}

// TestAdmissionParkedStreamDebugTrailers: debug_headers reach a client
// whose stream was opened while it was parked as trailers (its headers went
// out with the first keep-alive, before an engine was chosen), with the
// time it was parked; a request that did not park gets them as headers,
// its queue wait 0.
func TestAdmissionParkedStreamDebugTrailers(t *testing.T) {
	e := slowEngine(t)
	g := parkGateway(e, "\t\tmax_park 30s\n\t\theartbeat 50ms\n")
	g.policy = "\t\t\tdebug_headers\n"
	g.load(t)
	occ := occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openStream(t, ctx, chat{user: "parked, with debug headers", maxTokens: 6, stream: true, usage: true}.body(), nil)
	for keepAlives := 0; keepAlives < 2; {
		l, ok := s.next(t, 10*time.Second)
		if !ok {
			t.Fatal("stream ended while parked")
		}
		if l == ": keep-alive" {
			keepAlives++
		}
	}
	if v := s.res.Header.Get("X-LLM-Upstream"); v != "" {
		t.Fatalf("X-LLM-Upstream %q in the headers of a stream opened before routing", v)
	}
	occ[0].release()
	if rest := s.rest(t, 30*time.Second); len(rest) < 2 || rest[len(rest)-2] != "data: [DONE]" {
		t.Fatalf("stream after admission: %q", rest)
	}
	tr := s.res.Trailer
	if tr.Get("X-LLM-Upstream") != e.Addr() || tr.Get("X-LLM-Tier") == "" {
		t.Fatalf("trailers %v: want X-LLM-Upstream %s and X-LLM-Tier", tr, e.Addr())
	}
	if w, err := strconv.ParseFloat(tr.Get("X-LLM-Queue-Wait"), 64); err != nil || w < 0.05 {
		t.Errorf("X-LLM-Queue-Wait trailer %q: want the ≥ 2 heartbeats it was parked", tr.Get("X-LLM-Queue-Wait"))
	}

	r := mustSend(t, "", chatBody(true, "not parked, with debug headers"), nil)
	if r.upstream != e.Addr() || r.header.Get("X-LLM-Queue-Wait") != "0.0000" {
		t.Errorf("unparked stream's headers %v: want X-LLM-Upstream %s and X-LLM-Queue-Wait 0.0000", r.header, e.Addr())
	}
}

// TestAdmissionStreamingMetrics: streamed responses (with
// stream_options.include_usage) feed llmgw_ttft_seconds, llmgw_itl_seconds
// and llmgw_tokens_total{kind}, by exactly the usage the engine reported,
// and, routed by lb_policy llm, llmgw_ttft_prediction_error_seconds once
// each.
func TestAdmissionStreamingMetrics(t *testing.T) {
	engines := startEngines(t, 1, vllmsim.Config{})
	gateway{engines: noKVEngines(engines...)}.load(t)
	ttft0 := metricValue(t, "llmgw_ttft_seconds_count")
	pred0 := metricValue(t, "llmgw_ttft_prediction_error_seconds_count")
	itl0 := metricValue(t, "llmgw_itl_seconds_count")
	comp0 := metricValue(t, "llmgw_tokens_total", `kind="completion"`)
	prompt0 := metricValue(t, "llmgw_tokens_total", `kind="prompt"`)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var comp, prompt float64
	const n, maxTokens = 3, 5
	for i := range n {
		r := waitReply(t, sendAsync(ctx, "", chat{user: "observe me " + strings.Repeat("x", i), maxTokens: maxTokens, stream: true, usage: true}.body(), nil), 30*time.Second)
		if r.status != http.StatusOK {
			t.Fatalf("stream: %d %s", r.status, r.body)
		}
		for _, l := range sseSplit(r.body) {
			if !strings.Contains(l, `"usage":{`) {
				continue
			}
			var v struct {
				Usage struct {
					Prompt     float64 `json:"prompt_tokens"`
					Completion float64 `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &v); err != nil {
				t.Fatal(err)
			}
			comp += v.Usage.Completion
			prompt += v.Usage.Prompt
		}
	}
	if comp != n*maxTokens || prompt == 0 {
		t.Fatalf("usage chunks: completion %v prompt %v", comp, prompt)
	}
	if d := metricValue(t, "llmgw_ttft_seconds_count") - ttft0; d != n {
		t.Errorf("llmgw_ttft_seconds observations +%v, want %d", d, n)
	}
	if d := metricValue(t, "llmgw_ttft_prediction_error_seconds_count") - pred0; d != n {
		t.Errorf("llmgw_ttft_prediction_error_seconds observations +%v, want %d", d, n)
	}
	if d := metricValue(t, "llmgw_itl_seconds_count") - itl0; d != n*(maxTokens-1) {
		t.Errorf("llmgw_itl_seconds observations +%v, want %d", d, n*(maxTokens-1))
	}
	if d := metricValue(t, "llmgw_tokens_total", `kind="completion"`) - comp0; d != comp {
		t.Errorf("llmgw_tokens_total{completion} +%v, want %v", d, comp)
	}
	if d := metricValue(t, "llmgw_tokens_total", `kind="prompt"`) - prompt0; d != prompt {
		t.Errorf("llmgw_tokens_total{prompt} +%v, want %v", d, prompt)
	}
}
