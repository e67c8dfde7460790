package openai

import (
	"errors"
	"testing"
)

func TestParsePooling(t *testing.T) {
	tests := []struct {
		name, body                    string
		prompt, messages, query, docs string
	}{
		{"embeddings string", `{"model":"e","input":"hello"}`, `"hello"`, "", "", ""},
		{"embeddings strings", `{"input":["a","b"]}`, `["a","b"]`, "", "", ""},
		{"embeddings token ids", `{"input":[1,2,3]}`, `[1,2,3]`, "", "", ""},
		{"embeddings id arrays", `{"input":[[1,2],[3]]}`, `[[1,2],[3]]`, "", "", ""},
		{"chat embeddings", `{"messages":[{"role":"user","content":"x"}]}`, "", `[{"role":"user","content":"x"}]`, "", ""},
		{"classify", `{"input":"spam?","model":"c"}`, `"spam?"`, "", "", ""},
		// ScoreRequest's union members, in vLLM's order, then RerankRequest.
		{"score queries documents", `{"queries":"q","documents":["d1","d2"]}`, "", "", `"q"`, `["d1","d2"]`},
		{"score queries items", `{"queries":["q"],"items":["i"]}`, "", "", `["q"]`, `["i"]`},
		{"score data", `{"data_1":"a","data_2":"b"}`, "", "", `"a"`, `"b"`},
		{"score text", `{"text_1":"a","text_2":["b","c"]}`, "", "", `"a"`, `["b","c"]`},
		{"rerank", `{"query":"q","documents":["x",{"content":[]}],"top_n":1}`, "", "", `"q"`, `["x",{"content":[]}]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParsePooling([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if !r.PrefillOnly || string(r.Prompt) != tc.prompt || string(r.Messages) != tc.messages ||
				string(r.Query) != tc.query || string(r.Documents) != tc.docs {
				t.Errorf("got Prompt %s Messages %s Query %s Documents %s PrefillOnly %v",
					r.Prompt, r.Messages, r.Query, r.Documents, r.PrefillOnly)
			}
			if cap(r.Prompt) != len(r.Prompt) || cap(r.Query) != len(r.Query) {
				t.Errorf("raw values not clipped: appending would write into the body")
			}
		})
	}
}

func TestParsePoolingErrors(t *testing.T) {
	tests := []struct{ name, body, param string }{
		{"malformed", `{"input":`, ""},
		{"input number", `{"input":5}`, "input"},
		{"messages string", `{"messages":"x"}`, "messages"},
		{"model number", `{"model":1,"input":"x"}`, "model"},
	}
	for _, tc := range tests {
		_, err := ParsePooling([]byte(tc.body))
		var re *RequestError
		if !errors.As(err, &re) || re.Param != tc.param {
			t.Errorf("%s: err = %v, want a *RequestError for %q", tc.name, err, tc.param)
		}
	}
}

func TestEndpointOf(t *testing.T) {
	tests := []struct {
		path string
		want Endpoint
	}{
		{"/v1/chat/completions", EndpointChat},
		{"/v1/completions", EndpointCompletions},
		{"/v1/responses", EndpointResponses},
		{"/v1/responses/resp_1", EndpointOther},
		{"/v1/messages", EndpointMessages},
		{"/v1/messages/count_tokens", EndpointOther},
		{"/v1/embeddings", EndpointPooling},
		{"/pooling", EndpointPooling},
		{"/classify", EndpointPooling},
		{"/score", EndpointPooling},
		{"/v1/score", EndpointPooling},
		{"/rerank", EndpointPooling},
		{"/v2/rerank", EndpointPooling},
		{"/tokenize", EndpointOther},
		{"/gw/v1/chat/completions", EndpointChat},
	}
	for _, tc := range tests {
		if got := EndpointOf(tc.path); got != tc.want {
			t.Errorf("EndpointOf(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
	for e, body := range map[Endpoint]string{
		EndpointChat:      `{"messages":[]}`,
		EndpointResponses: `{"input":"x"}`,
		EndpointMessages:  `{"max_tokens":1,"messages":[]}`,
		EndpointPooling:   `{"input":"x"}`,
	} {
		if r, err := e.Parse([]byte(body)); err != nil || r == nil {
			t.Errorf("%v.Parse: %v, %v", e, r, err)
		}
	}
	if r, err := EndpointOther.Parse([]byte(`{}`)); r != nil || err != nil {
		t.Errorf("EndpointOther.Parse = %v, %v; want nil, nil", r, err)
	}
}
