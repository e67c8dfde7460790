package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func boolp(v bool) *bool { return &v }

func TestParseRequestValid(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Request
	}{
		{
			name: "chat",
			body: `{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
			want: Request{Model: "llama", Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`)},
		},
		{
			name: "completions string prompt, streaming with usage",
			body: ` {"prompt" : "Hello" , "stream":true, "stream_options":{"include_usage":true,"continuous_usage_stats":false},"model":"m"}
`,
			want: Request{Model: "m", Stream: true, IncludeUsage: true, Prompt: json.RawMessage(`"Hello"`)},
		},
		{
			name: "array prompt of token ids",
			body: `{"prompt":[[1,2,3],[4]],"stream":false}`,
			want: Request{Prompt: json.RawMessage(`[[1,2,3],[4]]`)},
		},
		{
			name: "stream_options without include_usage",
			body: `{"stream":true,"stream_options":{"continuous_usage_stats":true}}`,
			want: Request{Stream: true},
		},
		{
			name: "nulls are absent",
			body: `{"model":null,"stream":null,"stream_options":null,"prompt":null,"messages":null,"add_generation_prompt":null,"chat_template":null,"chat_template_kwargs":null,"tools":null,"cache_salt":null}`,
			want: Request{},
		},
		{
			name: "include_usage null",
			body: `{"stream_options":{"include_usage":null}}`,
			want: Request{},
		},
		{
			name: "template controls",
			body: `{"messages":[],"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":false,"chat_template":"{{ x }}","chat_template_kwargs":{"enable_thinking":false},"tools":[{"type":"function"}],"cache_salt":"s3cr3t"}`,
			want: Request{
				Messages:            json.RawMessage(`[]`),
				AddGenerationPrompt: boolp(false), ContinueFinalMessage: boolp(true), AddSpecialTokens: boolp(false),
				ChatTemplate: "{{ x }}", ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":false}`),
				Tools: json.RawMessage(`[{"type":"function"}]`), CacheSalt: "s3cr3t",
			},
		},
		{
			name: "escaped strings and keys",
			body: `{"mod\u0065l":"caf\u00e9 \"q\" \ud83d\ude00","cache_salt":"a\/b\n"}`,
			want: Request{Model: "café \"q\" 😀", CacheSalt: "a/b\n"},
		},
		{
			name: "duplicate keys: last wins",
			body: `{"model":"a","stream":true,"model":"b","stream":false,"stream_options":{"include_usage":true},"stream_options":{}}`,
			want: Request{Model: "b"},
		},
		{
			name: "duplicate key with null: last wins",
			body: `{"model":"a","model":null}`,
			want: Request{},
		},
		{
			name: "keys are case-sensitive, like vLLM",
			body: `{"Model":"a","STREAM":"yes"}`,
			want: Request{},
		},
		{
			name: "unknown fields of any type are skipped",
			body: `{"n":1,"temperature":-0.5e+3,"stop":["\u0000"],"logit_bias":{"1":-100},"echo":false,"user":null,"x":{"y":[{"z":[]}]}}`,
			want: Request{},
		},
		{
			name: "non-ASCII UTF-8 content",
			body: `{"messages":[{"content":"日本語 ✓"}],"model":"ü"}`,
			want: Request{Model: "ü", Messages: json.RawMessage(`[{"content":"日本語 ✓"}]`)},
		},
		{
			name: "empty object",
			body: `{}`,
			want: Request{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tt.body))
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if !requestsEqual(got, &tt.want) {
				t.Errorf("got  %s\nwant %s", dumpRequest(got), dumpRequest(&tt.want))
			}
		})
	}
}

func requestsEqual(a, b *Request) bool {
	eqb := func(x, y *bool) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	eqr := func(x, y json.RawMessage) bool { return (x == nil) == (y == nil) && bytes.Equal(x, y) }
	return a.Model == b.Model && a.Stream == b.Stream && a.IncludeUsage == b.IncludeUsage &&
		eqr(a.Prompt, b.Prompt) && eqr(a.Messages, b.Messages) &&
		eqb(a.AddGenerationPrompt, b.AddGenerationPrompt) && eqb(a.ContinueFinalMessage, b.ContinueFinalMessage) &&
		eqb(a.AddSpecialTokens, b.AddSpecialTokens) && a.ChatTemplate == b.ChatTemplate &&
		eqr(a.ChatTemplateKwargs, b.ChatTemplateKwargs) && eqr(a.Tools, b.Tools) && a.CacheSalt == b.CacheSalt
}

func dumpRequest(r *Request) string {
	b, _ := json.Marshal(r)
	return string(b)
}

func TestParseRequestErrors(t *testing.T) {
	deep := func(n int) string {
		return `{"x":` + strings.Repeat("[", n-1) + strings.Repeat("]", n-1) + `}`
	}
	tests := []struct {
		name  string
		body  string
		param string // expected RequestError.Param
		msg   string // substring of the message
	}{
		{"empty", ``, "", "empty body"},
		{"whitespace only", " \n\t", "", "empty body"},
		{"array", `[{"model":"x"}]`, "", "must be a JSON object"},
		{"string", `"hi"`, "", "must be a JSON object"},
		{"null", `null`, "", "must be a JSON object"},
		{"malformed top-level scalar", `nul`, "", "malformed JSON"},
		{"truncated", `{"model":"x"`, "", "unexpected end of JSON"},
		{"truncated in string", `{"model":"x`, "", "unexpected end of JSON"},
		{"trailing garbage", `{"model":"x"} x`, "", "after top-level value"},
		{"two objects", `{}{}`, "", "after top-level value"},
		{"trailing comma", `{"model":"x",}`, "", "beginning of object key"},
		{"single quotes", `{'model':'x'}`, "", "beginning of object key"},
		{"missing colon", `{"model" "x"}`, "", "after object key"},
		{"bad escape", `{"model":"\x"}`, "", "string escape"},
		{"bad unicode escape", `{"model":"\u12G4"}`, "", "hexadecimal"},
		{"raw newline in string", "{\"model\":\"a\nb\"}", "", "in string literal"},
		{"leading zero", `{"n":01}`, "", "after object key:value pair"},
		{"bare minus", `{"n":-}`, "", "numeric literal"},
		{"bad exponent", `{"n":1e}`, "", "exponent"},
		{"bad fraction", `{"n":1.}`, "", "decimal point"},
		{"bad literal", `{"stream":tru}`, "", "literal true"},
		{"BOM", "\ufeff{}", "", "looking for beginning of value"},
		{"NaN", `{"n":NaN}`, "", "beginning of value"},
		{"too deep", deep(129), "", "max depth of 128"},
		{"non-UTF-8", "{\"model\":\"\xff\"}", "", "not valid UTF-8"},
		{"truncated UTF-8", "{\"model\":\"\xe6\x97\"}", "", "not valid UTF-8"},
		{"UTF-16 surrogate in UTF-8", "{\"model\":\"\xed\xa0\x80\"}", "", "not valid UTF-8"},
		{"model number", `{"model":42}`, "model", "must be a string, not a number"},
		{"model object", `{"model":{}}`, "model", "must be a string, not an object"},
		{"stream string", `{"stream":"true"}`, "stream", "must be a boolean, not a string"},
		{"stream number", `{"stream":1}`, "stream", "must be a boolean"},
		{"messages object", `{"messages":{"role":"user"}}`, "messages", "must be an array, not an object"},
		{"messages string", `{"messages":"hi"}`, "messages", "must be an array, not a string"},
		{"prompt number", `{"prompt":7}`, "prompt", "must be a string or an array, not a number"},
		{"prompt object", `{"prompt":{}}`, "prompt", "must be a string or an array"},
		{"prompt bool", `{"prompt":true}`, "prompt", "must be a string or an array, not a boolean"},
		{"stream_options array", `{"stream_options":[]}`, "stream_options", "must be an object"},
		{"include_usage string", `{"stream_options":{"include_usage":"yes"}}`, "stream_options.include_usage", "must be a boolean"},
		{"add_generation_prompt", `{"add_generation_prompt":0}`, "add_generation_prompt", "must be a boolean"},
		{"continue_final_message", `{"continue_final_message":"no"}`, "continue_final_message", "must be a boolean"},
		{"add_special_tokens", `{"add_special_tokens":[]}`, "add_special_tokens", "must be a boolean"},
		{"chat_template", `{"chat_template":1}`, "chat_template", "must be a string"},
		{"chat_template_kwargs", `{"chat_template_kwargs":[]}`, "chat_template_kwargs", "must be an object"},
		{"tools", `{"tools":{}}`, "tools", "must be an array"},
		{"cache_salt", `{"cache_salt":false}`, "cache_salt", "must be a string"},
		{"syntax error inside mistyped value wins", `{"stream":"abc`, "", "unexpected end of JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest([]byte(tt.body))
			if err == nil {
				t.Fatalf("accepted: %s", dumpRequest(r))
			}
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %T %v is not a *RequestError", err, err)
			}
			if re.Param != tt.param || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("got param %q, error %q; want param %q, message containing %q", re.Param, err, tt.param, tt.msg)
			}
			if json.Valid([]byte(tt.body)) && tt.param == "" && utf8.ValidString(tt.body) &&
				!strings.Contains(tt.msg, "depth") && strings.HasPrefix(strings.TrimSpace(tt.body), "{") {
				t.Errorf("encoding/json accepts %q but the error is not a type error", tt.body)
			}
			var body map[string]map[string]any
			if err := json.Unmarshal(re.JSON(), &body); err != nil {
				t.Fatalf("JSON(): %v", err)
			}
			e := body["error"]
			if e["type"] != "invalid_request_error" || e["code"] != float64(400) || e["message"] != err.Error() {
				t.Errorf("JSON() = %s", re.JSON())
			}
			if tt.param == "" && e["param"] != nil || tt.param != "" && e["param"] != tt.param {
				t.Errorf("JSON() param = %v, want %q", e["param"], tt.param)
			}
		})
	}
	// Depth 128 itself is fine.
	if _, err := ParseRequest([]byte(deep(128))); err != nil {
		t.Errorf("depth 128: %v", err)
	}
}

func TestErrorJSON(t *testing.T) {
	got := string(ErrorJSON("queue full <&> \"now\"\n", "", 503))
	want := `{"error":{"message":"queue full <&> \"now\"\n","type":"server_error","param":null,"code":503}}`
	if got != want {
		t.Errorf("ErrorJSON = %s\nwant      %s", got, want)
	}
	if got := string(ErrorJSON("x", "invalid_request_error", 413)); got != `{"error":{"message":"x","type":"invalid_request_error","param":null,"code":413}}` {
		t.Errorf("ErrorJSON with type = %s", got)
	}
	if got := ErrorJSON("bad \xff byte", "", 400); !json.Valid(got) || !utf8.Valid(got) {
		t.Errorf("ErrorJSON with invalid UTF-8 = %q", got)
	}
	for status, typ := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
		404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error", 0: "server_error"} {
		if got := ErrorType(status); got != typ {
			t.Errorf("ErrorType(%d) = %q, want %q", status, got, typ)
		}
	}
}

func TestErrorEventAndKeepAlive(t *testing.T) {
	ev := ErrorEvent("upstream\nfailed", 502)
	want := "event: error\ndata: " + string(ErrorJSON("upstream\nfailed", "", 502)) + "\n\n"
	if string(ev) != want {
		t.Errorf("ErrorEvent = %q", ev)
	}
	o := NewStreamObserver(StreamConfig{})
	o.Write(KeepAlive)
	o.Write(ev)
	if st := o.Stats(); !st.Error || st.ErrorMessage != "upstream\nfailed" || st.Events != 1 {
		t.Errorf("observer on KeepAlive+ErrorEvent: %+v", st)
	}
	if bytes.Count(ev, []byte("\n")) != 3 {
		t.Errorf("ErrorEvent has a raw newline inside the data line: %q", ev)
	}
	if string(KeepAlive) != ": keep-alive\n\n" {
		t.Errorf("KeepAlive = %q", KeepAlive)
	}
}
