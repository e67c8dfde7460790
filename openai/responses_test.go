package openai

import (
	"errors"
	"strings"
	"testing"
)

// Each want is the messages list vLLM's construct_input_messages
// (vllm/entrypoints/openai/responses/utils.py at 01ca842d) returns, derived
// by hand from the branch of _construct_message_from_response_item named
// in the case.
func TestParseResponsesMessages(t *testing.T) {
	tests := []struct {
		name, body, want string
		continueFinal    bool
	}{
		{ // construct_input_messages: instructions, then a string input
			"instructions and string input",
			`{"model":"m","instructions":"Be brief.","input":"hi"}`,
			`[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]`, false,
		},
		{ // empty instructions add no system message
			"empty instructions",
			`{"instructions":"","input":"hi"}`,
			`[{"role":"user","content":"hi"}]`, false,
		},
		{ // user, system and developer messages: `return item` unchanged
			"message items passed on",
			`{"input":[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"q"}]}]}`,
			`[{"role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"q"}]}]`, false,
		},
		{ // ResponseReasoningItem, then ResponseOutputMessage and
			// ResponseFunctionToolCall merged into the assistant message
			// the reasoning started; function_call_output -> tool message
			"reasoning output text tool call",
			`{"input":[{"role":"user","content":"weather?"},` +
				`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"sum"}],"content":[{"type":"reasoning_text","text":"think"}]},` +
				`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Checking.","annotations":[]},{"type":"output_text","text":"ignored"}]},` +
				`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get","arguments":"{\"c\":1}"},` +
				`{"type":"function_call","call_id":"call_2","name":"find","namespace":"maps","arguments":"{}"},` +
				`{"type":"function_call_output","call_id":"call_1","output":"sunny"}]}`,
			`[{"role":"user","content":"weather?"},{"role":"assistant","reasoning":"think","content":"Checking.","tool_calls":[` +
				`{"id":"call_1","function":{"name":"get","arguments":"{\"c\":1}"},"type":"function"},` +
				`{"id":"call_2","function":{"name":"maps__find","arguments":"{}"},"type":"function"}]},` +
				`{"role":"tool","content":"sunny","tool_call_id":"call_1"}]`, false,
		},
		{ // a function call with no assistant message before it starts
			// one, which the next output message fills in; an output
			// message or reasoning cannot merge into a message that has
			// content or reasoning already
			"no merge",
			`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":""},` +
				`{"role":"assistant","content":"a"},{"role":"assistant","content":"b"},` +
				`{"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"s"}]},{"type":"reasoning","id":"r2","summary":[]}]}`,
			`[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":""},"type":"function"}],"content":"a"},` +
				`{"role":"assistant","content":"b","reasoning":"s"},{"role":"assistant","reasoning":""}]`, false,
		},
		{ // should_continue_final_message: a final assistant message in progress
			"continue final message",
			`{"input":[{"role":"user","content":"write"},{"type":"message","role":"assistant","status":"in_progress","content":[{"type":"output_text","text":"Once"}]}]}`,
			`[{"role":"user","content":"write"},{"role":"assistant","content":"Once"}]`, true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseResponses([]byte(tc.body))
			if err != nil {
				t.Fatalf("ParseResponses: %v", err)
			}
			if string(r.Messages) != tc.want {
				t.Errorf("Messages\n got %s\nwant %s", r.Messages, tc.want)
			}
			if *r.ContinueFinalMessage != tc.continueFinal || *r.AddGenerationPrompt == tc.continueFinal {
				t.Errorf("ContinueFinalMessage %v AddGenerationPrompt %v, want continue %v", *r.ContinueFinalMessage, *r.AddGenerationPrompt, tc.continueFinal)
			}
		})
	}
}

// TestParseResponsesFields checks the fields read as they are and the
// tools conversion (construct_tool_dicts, iter_response_function_tool_dicts).
func TestParseResponsesFields(t *testing.T) {
	body := `{"model":"m","input":"x","stream":true,"store":false,"previous_response_id":"resp_1","max_output_tokens":64,` +
		`"cache_salt":"s","tools":[{"type":"function","name":"get","parameters":{"type":"object"},"strict":true},` +
		`{"type":"web_search"},{"type":"namespace","name":"maps","tools":[{"type":"function","name":"find","description":"d"},{"type":"custom","name":"x"}]}]}`
	r, err := ParseResponses([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || !r.Stream || r.Store == nil || *r.Store || r.PreviousResponseID != "resp_1" ||
		r.MaxTokens == nil || *r.MaxTokens != 64 || r.CacheSalt != "s" {
		t.Errorf("got %+v", r)
	}
	want := `[{"type":"function","function":{"name":"get","parameters":{"type":"object"},"strict":true}},` +
		`{"type":"function","function":{"name":"maps__find","description":"d"}}]`
	if string(r.Tools) != want {
		t.Errorf("Tools\n got %s\nwant %s", r.Tools, want)
	}
}

func TestParseResponsesErrors(t *testing.T) {
	tests := []struct{ name, body, param, msg string }{
		{"malformed", `{"input":"x"`, "", "malformed JSON"},
		{"no input", `{"model":"m"}`, "input", "string or an array"},
		{"input number", `{"input":3}`, "input", "string or an array"},
		{"item not object", `{"input":["x"]}`, "input", "input[0]"},
		{"function_call name", `{"input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}`, "input", "input[0].name"},
		{"encrypted reasoning", `{"input":[{"type":"reasoning","encrypted_content":"zz","summary":[]}]}`, "input", "encrypted"},
		{"assistant content", `{"input":[{"role":"assistant","content":5}]}`, "input", "input[0].content"},
		{"store type", `{"input":"x","store":"no"}`, "store", "boolean"},
		{"instructions type", `{"input":"x","instructions":[]}`, "instructions", "string"},
		{"max_output_tokens", `{"input":"x","max_output_tokens":"9"}`, "max_output_tokens", "integer"},
		{"tools type", `{"input":"x","tools":{}}`, "tools", "array"},
		{"namespace tools", `{"input":"x","tools":[{"type":"namespace","name":"n"}]}`, "tools", "tools[0].tools"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseResponses([]byte(tc.body))
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RequestError", err)
			}
			if re.Param != tc.param || !strings.Contains(re.Error(), tc.msg) {
				t.Errorf("err = %v (param %q), want param %q and %q", err, re.Param, tc.param, tc.msg)
			}
		})
	}
}

// TestParseResponsesOwnBytes checks that the converted messages and tools
// do not alias the body, which the handler may reuse.
func TestParseResponsesOwnBytes(t *testing.T) {
	body := []byte(`{"input":[{"role":"user","content":"abc"}],"tools":[{"type":"function","name":"f"}]}`)
	r, err := ParseResponses(body)
	if err != nil {
		t.Fatal(err)
	}
	msgs, tools := string(r.Messages), string(r.Tools)
	for i := range body {
		body[i] = ' '
	}
	if string(r.Messages) != msgs || string(r.Tools) != tools {
		t.Errorf("output changed with the body: %s %s", r.Messages, r.Tools)
	}
}

// An item of another type with role "assistant" is a dict vLLM passes on
// unchanged, but the next item still merges into it (prev_msg's role).
func TestParseResponsesMergeIntoPassedItem(t *testing.T) {
	body := `{"input":[{"type":"item_reference","id":"x","role":"assistant"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`
	r, err := ParseResponses([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"type":"item_reference","id":"x","role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"},"type":"function"}]}]`
	if string(r.Messages) != want {
		t.Errorf("got %s\nwant %s", r.Messages, want)
	}
}
