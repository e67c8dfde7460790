package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

// vllmChat is a chat stream as vLLM sends it with include_usage and
// --enable-prompt-tokens-details.
const vllmChat = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"lo"},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}

data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}

data: [DONE]

`

func TestStreamObserverChat(t *testing.T) {
	var samples []time.Duration
	o := NewStreamObserver(StreamConfig{Start: t0, OnITL: func(d time.Duration) { samples = append(samples, d) }})
	events := strings.SplitAfter(vllmChat, "\n\n")
	// role chunk at 50ms, tokens at 200, 230, 290ms, usage and DONE at 300ms.
	at := []time.Duration{50, 200, 230, 290, 300, 300}
	for i, ev := range events[:6] {
		o.ObserveAt([]byte(ev), t0.Add(at[i]*time.Millisecond))
	}
	st := o.Stats()
	want := StreamStats{
		TTFT: 200 * time.Millisecond, LastContent: 290 * time.Millisecond,
		Events: 5, ContentEvents: 3,
		ITLCount: 2, ITLSum: 90 * time.Millisecond, ITLMax: 60 * time.Millisecond,
		Usage:    Usage{PromptTokens: 12, CompletionTokens: 3, TotalTokens: 15, CachedTokens: 8, HasCachedTokens: true},
		HasUsage: true, Done: true, Bytes: int64(len(vllmChat)),
	}
	if st != want {
		t.Errorf("stats\n got %+v\nwant %+v", st, want)
	}
	if fmt.Sprint(samples) != fmt.Sprint([]time.Duration{30 * time.Millisecond, 60 * time.Millisecond}) {
		t.Errorf("ITL samples %v", samples)
	}
}

// TestStreamObserverSplits feeds the stream split at every position, and
// byte by byte, and expects the same result as one write.
func TestStreamObserverSplits(t *testing.T) {
	streams := map[string]string{
		"lf":   vllmChat,
		"crlf": strings.ReplaceAll(vllmChat, "\n", "\r\n"),
		"cr":   strings.ReplaceAll(vllmChat, "\n", "\r"),
	}
	for name, stream := range streams {
		whole := NewStreamObserver(StreamConfig{Start: t0})
		whole.ObserveAt([]byte(stream), t0)
		want := whole.Stats()
		if want.ContentEvents != 3 || !want.Done || !want.HasUsage {
			t.Fatalf("%s: whole stream not understood: %+v", name, want)
		}
		for i := 0; i <= len(stream); i++ {
			o := NewStreamObserver(StreamConfig{Start: t0})
			o.ObserveAt([]byte(stream[:i]), t0)
			o.ObserveAt([]byte(stream[i:]), t0)
			if got := o.Stats(); got != want {
				t.Fatalf("%s split at %d: %+v\nwant %+v", name, i, got, want)
			}
		}
		o := NewStreamObserver(StreamConfig{Start: t0})
		for i := range len(stream) {
			o.ObserveAt([]byte{stream[i]}, t0)
		}
		if got := o.Stats(); got != want {
			t.Fatalf("%s byte by byte: %+v\nwant %+v", name, got, want)
		}
	}
}

func TestStreamObserverEvents(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		check  func(t *testing.T, st StreamStats)
	}{
		{"completions text", "data: {\"choices\":[{\"text\":\"\"}]}\n\ndata: {\"choices\":[{\"text\":\" a\"}]}\n\n",
			func(t *testing.T, st StreamStats) {
				if st.ContentEvents != 1 || st.Events != 2 {
					t.Errorf("%+v", st)
				}
			}},
		{"reasoning and tool calls count as content; empty ones do not",
			"data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":null}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"reasoning\":\"x\"}}]}\n\n",
			func(t *testing.T, st StreamStats) {
				if st.ContentEvents != 3 || st.Events != 5 {
					t.Errorf("%+v", st)
				}
			}},
		{"multi-line data is joined with newlines", "data: {\"choices\":\ndata: [{\"text\":\"x\"}]}\n\n",
			func(t *testing.T, st StreamStats) {
				if st.ContentEvents != 1 || st.Malformed != 0 {
					t.Errorf("%+v", st)
				}
			}},
		{"no space after colon, comments, other fields, empty events",
			": keep-alive\n\n: ping\nid: 7\nretry: 10\ndata:{\"choices\":[{\"text\":\"x\"}]}\n\n\n\nevent: ping\n\n",
			func(t *testing.T, st StreamStats) {
				if st.ContentEvents != 1 || st.Events != 1 || st.Error {
					t.Errorf("%+v", st)
				}
			}},
		{"incomplete final event is not dispatched", "data: {\"choices\":[{\"text\":\"x\"}]}\n",
			func(t *testing.T, st StreamStats) {
				if st.Events != 0 {
					t.Errorf("%+v", st)
				}
			}},
		{"BOM at start", "\xef\xbb\xbfdata: [DONE]\n\n",
			func(t *testing.T, st StreamStats) {
				if !st.Done {
					t.Errorf("%+v", st)
				}
			}},
		{"event: error with OpenAI body", string(ErrorEvent("upstream\nfailed", 502)),
			func(t *testing.T, st StreamStats) {
				if !st.Error || st.ErrorMessage != "upstream\nfailed" || st.Events != 1 {
					t.Errorf("%+v", st)
				}
			}},
		{"event: error with non-JSON data", "event: error\ndata: boom\n\n",
			func(t *testing.T, st StreamStats) {
				if !st.Error || st.ErrorMessage != "boom" || st.Malformed != 1 {
					t.Errorf("%+v", st)
				}
			}},
		{"data error object", "data: {\"error\":{\"message\":\"The model ran out of KV cache\",\"type\":\"BadRequestError\",\"code\":400}}\n\n",
			func(t *testing.T, st StreamStats) {
				if !st.Error || st.ErrorMessage != "The model ran out of KV cache" {
					t.Errorf("%+v", st)
				}
			}},
		{"older vLLM error shape", "data: {\"object\":\"error\",\"message\":\"bad \\u00e9\",\"type\":\"BadRequestError\",\"code\":400}\n\n",
			func(t *testing.T, st StreamStats) {
				if !st.Error || st.ErrorMessage != "bad é" {
					t.Errorf("%+v", st)
				}
			}},
		{"null error and stray message are not errors", "data: {\"error\":null,\"message\":\"hi\",\"choices\":[]}\n\n",
			func(t *testing.T, st StreamStats) {
				if st.Error {
					t.Errorf("%+v", st)
				}
			}},
		{"long error message is truncated on a rune boundary",
			"data: {\"error\":{\"message\":\"" + strings.Repeat("é", 400) + "\"}}\n\n",
			func(t *testing.T, st StreamStats) {
				if !st.Error || len(st.ErrorMessage) > maxErrorMessage || st.ErrorMessage != strings.Repeat("é", maxErrorMessage/2) {
					t.Errorf("message %q (%d bytes)", st.ErrorMessage, len(st.ErrorMessage))
				}
			}},
		{"usage: last non-null wins; continuous usage stats",
			"data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n" +
				"data: {\"choices\":[{\"text\":\"b\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"prompt_tokens_details\":null}}\n\n" +
				"data: {\"choices\":[],\"usage\":null}\n\n",
			func(t *testing.T, st StreamStats) {
				if !st.HasUsage || st.Usage != (Usage{PromptTokens: 5, CompletionTokens: 2}) {
					t.Errorf("%+v", st)
				}
			}},
		{"malformed payloads are counted and ignored", "data: {\"choices\":[{\"text\":\"a\"}]\n\ndata: [1]\n\ndata: {} x\n\n",
			func(t *testing.T, st StreamStats) {
				if st.Malformed != 3 || st.ContentEvents != 0 || st.Events != 3 {
					t.Errorf("%+v", st)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewStreamObserver(StreamConfig{Start: t0})
			o.ObserveAt([]byte(tt.stream), t0)
			tt.check(t, o.Stats())
		})
	}
}

func TestStreamObserverITLBatches(t *testing.T) {
	var samples []time.Duration
	o := NewStreamObserver(StreamConfig{Start: t0, OnITL: func(d time.Duration) { samples = append(samples, d) }})
	tok := "data: {\"choices\":[{\"delta\":{\"content\":\"t\"}}]}\n\n"
	o.ObserveAt([]byte(tok+tok), t0.Add(100*time.Millisecond))     // first token and one more together
	o.ObserveAt([]byte(tok+tok+tok), t0.Add(160*time.Millisecond)) // three tokens after 60 ms
	o.ObserveAt([]byte(": keep-alive\n\n"), t0.Add(500*time.Millisecond))
	o.ObserveAt([]byte(tok), t0.Add(600*time.Millisecond))
	want := []time.Duration{0, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 440 * time.Millisecond}
	if fmt.Sprint(samples) != fmt.Sprint(want) {
		t.Errorf("samples %v, want %v", samples, want)
	}
	st := o.Stats()
	if st.ITLCount != 5 || st.ITLSum != 500*time.Millisecond || st.ITLMax != 440*time.Millisecond ||
		st.TTFT != 100*time.Millisecond || st.LastContent != 600*time.Millisecond || st.ContentEvents != 6 {
		t.Errorf("%+v", st)
	}
}

func TestStreamObserverOversizedLines(t *testing.T) {
	const limit = 100
	big := "data: {\"choices\":[{\"text\":\"" + strings.Repeat("x", 500) + "\"}]}\n"
	small := "data: {\"choices\":[{\"text\":\"y\"}]}\n\n"
	stream := small + big + "\n" + small + "data: " + strings.Repeat("z", 60) + "\ndata: " + strings.Repeat("z", 60) + "\n\n" + small
	for _, chunk := range []int{1, 7, 64, 99, 100, 101, len(stream)} {
		t.Run(fmt.Sprint("chunk=", chunk), func(t *testing.T) {
			o := NewStreamObserver(StreamConfig{Start: t0, MaxLine: limit})
			for i := 0; i < len(stream); i += chunk {
				o.ObserveAt([]byte(stream[i:min(i+chunk, len(stream))]), t0)
				if cap(o.buf) > 2*limit+chunk || len(o.buf) > limit || len(o.data) > limit {
					t.Fatalf("buffers grew: buf %d/%d data %d", len(o.buf), cap(o.buf), len(o.data))
				}
			}
			st := o.Stats()
			// The big line and the two-line event over the limit are dropped.
			if st.ContentEvents != 3 || st.SkippedLines != 2 || st.Events != 3 {
				t.Errorf("%+v", st)
			}
		})
	}
}

func TestStreamObserverWrite(t *testing.T) {
	before := time.Now()
	o := NewStreamObserver(StreamConfig{})
	in := []byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
	n, err := o.Write(in)
	if n != len(in) || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	st := o.Stats()
	if st.ContentEvents != 1 || st.TTFT < 0 || st.TTFT > time.Since(before) {
		t.Errorf("%+v", st)
	}
}

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		want  Usage
		found bool
		err   bool
	}{
		{"vLLM chat", `{"id":"x","object":"chat.completion","choices":[{"message":{"content":"{\"usage\":1}"}}],"usage":{"prompt_tokens":10,"total_tokens":14,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}},"prompt_logprobs":null}`,
			Usage{PromptTokens: 10, CompletionTokens: 4, TotalTokens: 14, HasCachedTokens: true}, true, false},
		{"no details", `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":null}}`,
			Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}, true, false},
		{"odd numbers ignored", `{"usage":{"prompt_tokens":1.5,"completion_tokens":-2,"total_tokens":1e3,"prompt_tokens_details":{"cached_tokens":99999999999999999999}}}`,
			Usage{}, true, false},
		{"no usage", `{"choices":[]}`, Usage{}, false, false},
		{"null usage", `{"usage":null}`, Usage{}, false, false},
		{"usage not an object", `{"usage":[1]}`, Usage{}, false, false},
		{"nested usage is not the top-level one", `{"x":{"usage":{"prompt_tokens":3}}}`, Usage{}, false, false},
		{"last usage wins", `{"usage":{"prompt_tokens":3},"usage":{"prompt_tokens":4}}`, Usage{PromptTokens: 4}, true, false},
		{"truncated", `{"usage":{"prompt_tokens":3}`, Usage{}, false, true},
		{"not an object", `[{"usage":{}}]`, Usage{}, false, true},
		{"trailing garbage", `{"usage":{"prompt_tokens":3}} {}`, Usage{}, false, true},
		{"empty", ``, Usage{}, false, true},
		{"too deep", `{"a":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, Usage{}, false, true},
	}
	for _, tt := range tests {
		u, found, err := ParseUsage([]byte(tt.body))
		if u != tt.want || found != tt.found || (err != nil) != tt.err {
			t.Errorf("%s: ParseUsage = %+v, %v, %v; want %+v, %v, err=%v", tt.name, u, found, err, tt.want, tt.found, tt.err)
		}
	}
}

// FuzzStreamObserver checks that the observer never panics, keeps its
// buffers bounded, and reaches the same result however the bytes are split.
func FuzzStreamObserver(f *testing.F) {
	f.Add([]byte(vllmChat), uint16(10), uint16(300))
	f.Add([]byte(strings.ReplaceAll(vllmChat, "\n", "\r\n")), uint16(1), uint16(2))
	f.Add(ErrorEvent("x", 500), uint16(5), uint16(6))
	f.Add([]byte("event: error\r\ndata: {\"object\":\"error\",\"message\":\"m\"}\r\r: c\ndata: [DONE]\n\n"), uint16(3), uint16(30))
	f.Add([]byte("data: "+strings.Repeat("a", 300)+"\n\n"), uint16(100), uint16(200))
	f.Fuzz(func(t *testing.T, stream []byte, a, b uint16) {
		const limit = 256
		whole := NewStreamObserver(StreamConfig{Start: t0, MaxLine: limit})
		whole.ObserveAt(stream, t0)
		want := whole.Stats()
		i, j := min(int(a), len(stream)), min(int(b), len(stream))
		if i > j {
			i, j = j, i
		}
		o := NewStreamObserver(StreamConfig{Start: t0, MaxLine: limit})
		for _, part := range [][]byte{stream[:i], stream[i:j], stream[j:]} {
			o.ObserveAt(part, t0)
			if len(o.buf) > limit || len(o.data) > limit {
				t.Fatalf("buffers over the limit: %d, %d", len(o.buf), len(o.data))
			}
		}
		got := o.Stats()
		if got != want {
			t.Fatalf("split at %d,%d: %+v\nwhole: %+v", i, j, got, want)
		}
		if want.ContentEvents > want.Events || want.Malformed > want.Events {
			t.Fatalf("inconsistent counts %+v", want)
		}
	})
}

// FuzzParseUsage checks that ParseUsage accepts exactly the JSON objects
// encoding/json accepts (depth permitting), agrees with it on the usage
// values, and never panics.
func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":3}}}`))
	f.Add([]byte(`{"usage":null,"choices":[{"message":{"content":"x"}}]}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":1.5}}`))
	f.Add([]byte(`{"usage":{"input_tokens":10,"output_tokens":4,"input_tokens_details":{"cached_tokens":3}}}`))
	f.Add([]byte(`[1]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		u, found, err := ParseUsage(body)
		valid := json.Valid(body) && bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) && jsonDepth(body) <= maxDepth
		if (err == nil) != valid {
			t.Fatalf("ParseUsage(%q) err = %v, encoding/json valid object = %v", body, err, valid)
		}
		if err != nil {
			return
		}
		var m struct {
			Usage *struct {
				PromptTokens        json.RawMessage `json:"prompt_tokens"`
				CompletionTokens    json.RawMessage `json:"completion_tokens"`
				TotalTokens         json.RawMessage `json:"total_tokens"`
				PromptTokensDetails *struct {
					CachedTokens json.RawMessage `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
				// The Responses and Anthropic names, which count when
				// the chat names are absent.
				InputTokens        json.RawMessage `json:"input_tokens"`
				OutputTokens       json.RawMessage `json:"output_tokens"`
				InputTokensDetails *struct {
					CachedTokens json.RawMessage `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			} `json:"usage"`
		}
		// Field matching in structs is case-insensitive and merges
		// duplicates, unlike ParseUsage; compare only simple bodies.
		lower := bytes.ToLower(body)
		if bytes.Count(lower, []byte(`"usage"`)) > 1 || bytes.Count(lower, []byte(`tokens`)) > 4 ||
			!bytes.Equal(lower, body) || bytes.Contains(body, []byte(`\`)) {
			return
		}
		if json.Unmarshal(body, &m) != nil {
			return // usage of the wrong type: encoding/json errors, ParseUsage ignores
		}
		if found != (m.Usage != nil) {
			t.Fatalf("found = %v, encoding/json usage = %v", found, m.Usage != nil)
		}
		if !found {
			return
		}
		num := func(raw json.RawMessage) int64 {
			var n int64
			if json.Unmarshal(raw, &n) != nil || n < 0 || bytes.ContainsAny(raw, ".eE") {
				return 0
			}
			return n
		}
		either := func(chat, alt json.RawMessage) int64 {
			if chat != nil {
				return num(chat)
			}
			return num(alt)
		}
		want := Usage{PromptTokens: either(m.Usage.PromptTokens, m.Usage.InputTokens),
			CompletionTokens: either(m.Usage.CompletionTokens, m.Usage.OutputTokens), TotalTokens: num(m.Usage.TotalTokens)}
		if d := m.Usage.PromptTokensDetails; d != nil {
			want.CachedTokens = num(d.CachedTokens)
		} else if d := m.Usage.InputTokensDetails; d != nil && !bytes.Contains(body, []byte(`"prompt_tokens_details"`)) {
			want.CachedTokens = num(d.CachedTokens)
		}
		if u.PromptTokens != want.PromptTokens || u.CompletionTokens != want.CompletionTokens ||
			u.TotalTokens != want.TotalTokens || u.CachedTokens != want.CachedTokens {
			t.Fatalf("ParseUsage(%q) = %+v, encoding/json %+v", body, u, want)
		}
	})
}

// TestStreamObserverOnFirst: OnFirst runs once, at the first event with
// content (not at the role-only chunk that vLLM sends first).
func TestStreamObserverOnFirst(t *testing.T) {
	var firstAt []int
	events := strings.SplitAfter(vllmChat, "\n\n")
	i := 0
	o := NewStreamObserver(StreamConfig{Start: t0, OnFirst: func() { firstAt = append(firstAt, i) }})
	for ; i < 6; i++ {
		o.ObserveAt([]byte(events[i]), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(firstAt) != 1 || firstAt[0] != 1 {
		t.Fatalf("OnFirst ran at events %v, want once at event 1 (the first content)", firstAt)
	}
}
