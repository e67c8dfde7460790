package openai

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// vllmResponses is a /v1/responses stream as vLLM sends it (abridged
// objects): response.created carries the id, response.completed the usage.
const vllmResponses = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_abc123","object":"response","status":"in_progress","output":[],"usage":null}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_abc123","status":"in_progress","usage":null}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","content":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hel","logprobs":[]}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"lo","logprobs":[]}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"!","logprobs":[]}

event: response.output_text.done
data: {"type":"response.output_text.done","sequence_number":6,"text":"Hello!"}

event: response.completed
data: {"type":"response.completed","sequence_number":7,"response":{"id":"resp_abc123","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hello!"}]}],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":15}}}

`

// vllmAnthropic is a /v1/messages stream as vLLM sends it.
const vllmAnthropic = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":12,"output_tokens":0}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}

event: message_stop
data: {"type":"message_stop"}

`

// observeEvents feeds stream's events one per write, the first at 50ms
// and the others at the given times (ms).
func observeEvents(o *StreamObserver, stream string, at []time.Duration) {
	for i, ev := range strings.SplitAfter(stream, "\n\n") {
		o.ObserveAt([]byte(ev), t0.Add(at[min(i, len(at)-1)]*time.Millisecond))
	}
}

// TestStreamObserverResponses: the first output_text.delta is the first
// token, each later one an ITL sample; the usage is response.completed's
// and the id response.created's, reported as it passes.
func TestStreamObserverResponses(t *testing.T) {
	var ids []string
	var itl []time.Duration
	o := NewStreamObserver(StreamConfig{Start: t0, OnResponseID: func(id string) { ids = append(ids, id) },
		OnITL: func(d time.Duration) { itl = append(itl, d) }})
	observeEvents(o, vllmResponses, []time.Duration{50, 60, 70, 200, 230, 290, 300, 300})
	st := o.Stats()
	if st.ContentEvents != 3 || st.TTFT != 200*time.Millisecond || st.ITLCount != 2 || st.ITLSum != 90*time.Millisecond {
		t.Errorf("content %d, TTFT %v, ITL %d/%v; want 3, 200ms, 2/90ms", st.ContentEvents, st.TTFT, st.ITLCount, st.ITLSum)
	}
	want := Usage{PromptTokens: 12, CompletionTokens: 3, TotalTokens: 15, CachedTokens: 8, HasCachedTokens: true}
	if !st.HasUsage || st.Usage != want {
		t.Errorf("usage %+v (%v), want %+v", st.Usage, st.HasUsage, want)
	}
	if len(ids) != 1 || ids[0] != "resp_abc123" || st.ResponseID != "resp_abc123" {
		t.Errorf("ids reported %q, stats %q", ids, st.ResponseID)
	}
	if len(itl) != 2 || st.Error || st.Malformed != 0 {
		t.Errorf("ITL samples %v, stats %+v", itl, st)
	}
}

// TestStreamObserverAnthropic: the first content_block_delta is the first
// token; the usage merges message_start's input tokens with message_delta's
// output tokens.
func TestStreamObserverAnthropic(t *testing.T) {
	o := NewStreamObserver(StreamConfig{Start: t0})
	observeEvents(o, vllmAnthropic, []time.Duration{50, 60, 200, 230, 290, 300})
	st := o.Stats()
	if st.ContentEvents != 3 || st.TTFT != 200*time.Millisecond || st.ITLCount != 2 {
		t.Errorf("content %d, TTFT %v, ITL %d; want 3, 200ms, 2", st.ContentEvents, st.TTFT, st.ITLCount)
	}
	if want := (Usage{PromptTokens: 12, CompletionTokens: 3}); !st.HasUsage || st.Usage != want {
		t.Errorf("usage %+v (%v), want %+v", st.Usage, st.HasUsage, want)
	}
	if st.ResponseID != "" || st.Error {
		t.Errorf("stats %+v", st)
	}
}

// TestStreamObserverAPIEvents: what counts and what does not among the
// events of the Responses and Anthropic streams.
func TestStreamObserverAPIEvents(t *testing.T) {
	tests := []struct {
		name          string
		data          string
		content, fail bool
	}{
		{"empty text delta", `{"type":"response.output_text.delta","delta":""}`, false, false},
		{"delta before type", `{"delta":"x","type":"response.output_text.delta"}`, true, false},
		{"reasoning delta", `{"type":"response.reasoning_text.delta","delta":"hm"}`, true, false},
		{"other event's delta", `{"type":"response.output_text.done","delta":"x"}`, false, false},
		{"tool input", `{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{\"a\""}}`, true, false},
		{"empty block delta", `{"type":"content_block_delta","delta":{"type":"text_delta","text":""}}`, false, false},
		{"block delta as string", `{"type":"content_block_delta","delta":"x"}`, true, false},
		{"message_delta is no token", `{"type":"message_delta","delta":{"stop_reason":"end_turn","text":"x"}}`, false, false},
		{"responses failed", `{"type":"response.failed","response":{"id":"r","error":{"message":"boom"}}}`, false, true},
		{"responses error", `{"type":"error","code":"x","message":"boom"}`, false, true},
		{"anthropic error", `{"type":"error","error":{"type":"overloaded_error","message":"boom"}}`, false, true},
		{"escaped type", `{"type":"content_block\u005fdelta","delta":{"text":"x"}}`, true, false},
	}
	for _, tt := range tests {
		o := NewStreamObserver(StreamConfig{Start: t0})
		o.ObserveAt([]byte("data: "+tt.data+"\n\n"), t0)
		st := o.Stats()
		if (st.ContentEvents > 0) != tt.content || st.Error != tt.fail || st.Malformed != 0 {
			t.Errorf("%s: content %d, error %v (%q), malformed %d; want content %v, error %v",
				tt.name, st.ContentEvents, st.Error, st.ErrorMessage, st.Malformed, tt.content, tt.fail)
		}
	}
}

// TestStreamObserverResponseIDs: only a sane id is reported, and only the
// first.
func TestStreamObserverResponseIDs(t *testing.T) {
	tests := []struct{ stream, want string }{
		{`{"type":"response.created","response":{"id":"resp_1"}}`, "resp_1"},
		{`{"type":"response.created","response":{"id":""}}`, ""},
		{`{"type":"response.created","response":{"id":7}}`, ""},
		{`{"type":"response.created","response":{"id":"a\nb"}}`, ""},
		{`{"type":"response.created","response":{"id":"` + strings.Repeat("x", MaxResponseID+1) + `"}}`, ""},
		{`{"type":"response.created","response":"resp_1"}`, ""},
		{`{"id":"resp_top"}`, ""}, // a stream's id is its response's
		{`{"type":"response.created","response":{"id":"resp_\u00e9"}}`, "resp_é"},
	}
	for _, tt := range tests {
		n := 0
		o := NewStreamObserver(StreamConfig{Start: t0, OnResponseID: func(string) { n++ }})
		o.ObserveAt([]byte("data: "+tt.stream+"\n\ndata: {\"response\":{\"id\":\"second\"}}\n\n"), t0)
		got := o.Stats().ResponseID
		if tt.want != "" && (got != tt.want || n != 1) {
			t.Errorf("%s: id %q reported %d times, want %q once", tt.stream, got, n, tt.want)
		}
		if tt.want == "" && got != "second" {
			t.Errorf("%s: id %q, want the next event's", tt.stream, got)
		}
	}
}

func TestParseUsageAPIs(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Usage
	}{
		{"responses", `{"id":"resp_1","object":"response","usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":6,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":16}}`,
			Usage{PromptTokens: 10, CompletionTokens: 6, TotalTokens: 16, CachedTokens: 4, HasCachedTokens: true}},
		{"anthropic", `{"id":"msg_1","type":"message","usage":{"input_tokens":10,"output_tokens":6}}`,
			Usage{PromptTokens: 10, CompletionTokens: 6}},
		{"chat names win", `{"usage":{"input_tokens":1,"output_tokens":2,"prompt_tokens":3,"completion_tokens":4,"input_tokens_details":{"cached_tokens":5}}}`,
			Usage{PromptTokens: 3, CompletionTokens: 4, CachedTokens: 5, HasCachedTokens: true}},
	}
	for _, tt := range tests {
		u, found, err := ParseUsage([]byte(tt.body))
		if u != tt.want || !found || err != nil {
			t.Errorf("%s: ParseUsage = %+v, %v, %v; want %+v", tt.name, u, found, err, tt.want)
		}
	}
}

func TestResponseID(t *testing.T) {
	full := `{"id":"resp_9","object":"response","output":[{"type":"message"}],"usage":{"input_tokens":1}}`
	tests := []struct {
		body string
		want string
	}{
		{full, "resp_9"},
		{full[:len(`{"id":"resp_9",`)], "resp_9"}, // the prefix is enough
		{full[:len(`{"id":"resp_`)], ""},          // cut inside the id
		{`{"object":"response","output":[{"id":"msg_1"}],"id":"resp_late"}`, "resp_late"},
		{`{"object":"response","output":[{"id":"msg_1"}`, ""}, // no top-level id yet
		{`{"id":null}`, ""},
		{`{"id":"` + strings.Repeat("x", MaxResponseID+1) + `"}`, ""},
		{`["id","resp_1"]`, ""},
		{` {"i\u0064":"resp_esc"}`, "resp_esc"},
		{``, ""},
	}
	for _, tt := range tests {
		got, ok := ResponseID([]byte(tt.body))
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("ResponseID(%q) = %q, %v; want %q", tt.body, got, ok, tt.want)
		}
	}
}

// FuzzResponseID: ResponseID never panics, and an id it finds in a valid
// object is encoding/json's top-level id.
func FuzzResponseID(f *testing.F) {
	f.Add([]byte(`{"id":"resp_9","object":"response"}`))
	f.Add([]byte(`{"object":"response","id":"r\u0041"}`))
	f.Add([]byte(`{"id":"resp_9`))
	f.Fuzz(func(t *testing.T, body []byte) {
		id, ok := ResponseID(body)
		if !ok {
			if id != "" {
				t.Fatalf("ResponseID(%q) = %q, false", body, id)
			}
			return
		}
		if id == "" || len(id) > MaxResponseID {
			t.Fatalf("ResponseID(%q) = %q", body, id)
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil || bytes.Count(bytes.ToLower(body), []byte(`"id"`)) > 1 || bytes.Contains(body, []byte(`\`)) {
			return // a prefix, duplicate or case-folded keys: encoding/json differs by design
		}
		var want string
		if json.Unmarshal(m["id"], &want) != nil || want != id {
			t.Fatalf("ResponseID(%q) = %q, encoding/json %q", body, id, want)
		}
	})
}

// FuzzStreamObserverAPIs is FuzzStreamObserver's split invariance for the
// Responses and Anthropic streams.
func FuzzStreamObserverAPIs(f *testing.F) {
	f.Add([]byte(vllmResponses), uint16(10), uint16(300))
	f.Add([]byte(vllmAnthropic), uint16(1), uint16(2))
	f.Add([]byte(strings.ReplaceAll(vllmAnthropic, "\n", "\r\n")), uint16(40), uint16(900))
	f.Fuzz(func(t *testing.T, stream []byte, a, b uint16) {
		var ids []string
		whole := NewStreamObserver(StreamConfig{Start: t0, MaxLine: 512})
		whole.ObserveAt(stream, t0)
		i, j := min(int(a), len(stream)), min(int(b), len(stream))
		if i > j {
			i, j = j, i
		}
		o := NewStreamObserver(StreamConfig{Start: t0, MaxLine: 512, OnResponseID: func(id string) { ids = append(ids, id) }})
		for _, part := range [][]byte{stream[:i], stream[i:j], stream[j:]} {
			o.ObserveAt(part, t0)
		}
		got, want := o.Stats(), whole.Stats()
		if got != want {
			t.Fatalf("split at %d,%d: %+v\nwhole: %+v", i, j, got, want)
		}
		if len(ids) > 1 || (len(ids) == 1) != (want.ResponseID != "") || len(want.ResponseID) > MaxResponseID {
			t.Fatalf("ids %q, stats %q", ids, want.ResponseID)
		}
	})
}
