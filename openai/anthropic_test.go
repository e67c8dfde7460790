package openai

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// fixClock makes the ids of tool_use blocks without one deterministic.
func fixClock(t *testing.T) {
	t.Helper()
	saved := anthropicNow
	anthropicNow = func() time.Time { return time.Unix(1700000000, 0) }
	t.Cleanup(func() { anthropicNow = saved })
}

// Each want is the messages list vLLM's
// AnthropicServingMessages._convert_anthropic_to_openai_request
// (vllm/entrypoints/anthropic/serving.py at 0001948b) builds, derived by
// hand from the function named in the case, in its key order.
func TestParseAnthropicMessages(t *testing.T) {
	fixClock(t)
	tests := []struct {
		name, body, want string
	}{
		{ // _convert_system_message: a string system, then _convert_messages
			"system string",
			`{"model":"m","max_tokens":8,"system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`,
			`[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]`,
		},
		{ // _convert_system_message: text blocks joined with "", empty and
			// billing-header blocks dropped, inline system messages hoisted
			"system blocks and inline system",
			`{"max_tokens":8,"system":[{"type":"text","text":"x-anthropic-billing-header: cc=1;"},{"type":"text","text":"A"},{"type":"text","text":""},{"type":"text","text":"B"}],` +
				`"messages":[{"role":"user","content":"q"},{"role":"system","content":"C"},{"role":"system","content":[{"type":"text","text":"D"}]}]}`,
			`[{"role":"system","content":"ABCD"},{"role":"user","content":"q"}]`,
		},
		{ // no system at all, empty system string: no system message
			"empty system",
			`{"max_tokens":8,"system":"","messages":[{"role":"assistant","content":"a"}]}`,
			`[{"role":"assistant","content":"a"}]`,
		},
		{ // _convert_message_content: a single text block becomes a string
			"single text block",
			`{"max_tokens":8,"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`,
			`[{"role":"user","content":"hi"}]`,
		},
		{ // _convert_block + _convert_image_source_to_url
			"text and images",
			`{"max_tokens":8,"messages":[{"role":"user","content":[{"type":"text","text":"see"},` +
				`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAA"}},` +
				`{"type":"image","source":{"type":"url","url":"https://x/y.png"}},{"type":"image","source":{"data":"B"}}]}]}`,
			`[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAA"}},` +
				`{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,B"}}]}]`,
		},
		{ // _convert_message_content: reasoning, tool_calls, content, in
			// that order; _convert_tool_use_block: json.dumps(input)
			"assistant thinking text tool_use",
			`{"max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},` +
				`{"type":"redacted_thinking","data":"zz"},{"type":"text","text":"Let me look."},` +
				`{"type":"tool_use","id":"toolu_1","name":"get","input":{"city":"Zürich","n":2.50,"k":[true,null]}}]}]}`,
			`[{"role":"assistant","reasoning":"hm","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get",` +
				`"arguments":"{\"city\": \"Z\\u00fcrich\", \"n\": 2.5, \"k\": [true, null]}"}}],"content":"Let me look."}]`,
		},
		{ // _convert_tool_use_block: no id -> call_<unix seconds>, no input -> {}
			"tool_use without id or input",
			`{"max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f"}]}]}`,
			`[{"role":"assistant","tool_calls":[{"id":"call_1700000000","type":"function","function":{"name":"f","arguments":"{}"}}]}]`,
		},
		{ // _convert_user_tool_result: the tool message comes before the
			// user message that carried the block, which keeps its text
			"user tool_result and text",
			`{"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"22C"},{"type":"text","text":"thanks"}]}]}`,
			`[{"role":"tool","tool_call_id":"toolu_1","content":"22C"},{"role":"user","content":"thanks"}]`,
		},
		{ // _convert_user_tool_result with list content: texts joined by
			// "\n", images in a user message, tool references in a second
			// tool message; the user message itself has no content: dropped
			"user tool_result blocks",
			`{"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[` +
				`{"type":"text","text":"a"},{"type":"image","source":{"type":"base64","media_type":"image/gif","data":"G"}},` +
				`{"type":"text","text":"b"},{"type":"tool_reference","tool_name":"search"},{"type":"tool_reference","name":"other"}]}]}]}`,
			`[{"role":"tool","tool_call_id":"t","content":"a\nb"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/gif;base64,G"}}]},` +
				`{"role":"tool","tool_call_id":"t","content":[{"type":"tool_reference","name":"search"},{"type":"tool_reference","name":"other"}]}]`,
		},
		{ // _convert_user_tool_result: no content, no tool_use_id
			"empty user tool_result",
			`{"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result"}]}]}`,
			`[{"role":"tool","tool_call_id":"","content":""}]`,
		},
		{ // _convert_tool_result_block for a non-user role: str(content)
			"assistant tool_result",
			`{"max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_result","content":[{"type":"text","text":"it's"}]}]}]}`,
			`[{"role":"assistant","content":"Tool result: [{'type': 'text', 'text': \"it's\"}]"}]`,
		},
		{ // _convert_messages: an assistant message with nothing converted
			// stays, with its role only; an empty user message is dropped
			"empty blocks",
			`{"max_tokens":8,"messages":[{"role":"user","content":[]},{"role":"assistant","content":[{"type":"text","text":""}]}]}`,
			`[{"role":"assistant"}]`,
		},
		{ // AnthropicMessage.normalize_role: ctx and msg are user
			"claude code roles",
			`{"max_tokens":8,"messages":[{"role":"ctx","content":"c"},{"role":"msg","content":"m"}]}`,
			`[{"role":"user","content":"c"},{"role":"user","content":"m"}]`,
		},
		{ // the last occurrence of a key wins, as in pydantic
			"duplicate keys",
			`{"max_tokens":8,"messages":[{"role":"user","content":"x"}],"messages":[{"role":"user","content":"y","role":"assistant"}]}`,
			`[{"role":"assistant","content":"y"}]`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseAnthropic([]byte(tc.body))
			if err != nil {
				t.Fatalf("ParseAnthropic: %v", err)
			}
			if string(r.Messages) != tc.want {
				t.Errorf("Messages\n got %s\nwant %s", r.Messages, tc.want)
			}
		})
	}
}

// TestParseAnthropicFields checks the fields read as they are and the
// tools conversion (_convert_tools, AnthropicTool.validate_input_schema).
func TestParseAnthropicFields(t *testing.T) {
	body := `{"model":"claude-x","max_tokens":1024.0,"stream":true,"chat_template_kwargs":{"enable_thinking":true},` +
		`"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"get","description":"Get it.","input_schema":{"properties":{}}},` +
		`{"name":"put","input_schema":{"type":"object"},"defer_loading":true,"strict":null}]}`
	r, err := ParseAnthropic([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "claude-x" || !r.Stream || !r.IncludeUsage || r.MaxTokens == nil || *r.MaxTokens != 1024 {
		t.Errorf("got Model %q Stream %v IncludeUsage %v MaxTokens %v", r.Model, r.Stream, r.IncludeUsage, r.MaxTokens)
	}
	if string(r.ChatTemplateKwargs) != `{"enable_thinking":true}` {
		t.Errorf("ChatTemplateKwargs = %s", r.ChatTemplateKwargs)
	}
	wantTools := `[{"type":"function","function":{"name":"get","description":"Get it.","parameters":{"properties":{},"type":"object"}}},` +
		`{"type":"function","function":{"name":"put","parameters":{"type":"object"},"defer_loading":true}}]`
	if string(r.Tools) != wantTools {
		t.Errorf("Tools\n got %s\nwant %s", r.Tools, wantTools)
	}
}

func TestParseAnthropicErrors(t *testing.T) {
	tests := []struct{ name, body, param, msg string }{
		{"not json", `{"messages":`, "", "malformed JSON"},
		{"not an object", `[1]`, "", "must be a JSON object"},
		{"invalid utf8", "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "", "UTF-8"},
		{"too deep", `{"max_tokens":1,"messages":[],"x":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, "", "exceeded max depth"},
		{"no messages", `{"max_tokens":1}`, "messages", "must be an array"},
		{"no max_tokens", `{"messages":[]}`, "max_tokens", "field required"},
		{"zero max_tokens", `{"max_tokens":0,"messages":[]}`, "max_tokens", "positive"},
		{"fractional max_tokens", `{"max_tokens":1.5,"messages":[]}`, "max_tokens", "integer"},
		{"stream type", `{"max_tokens":1,"messages":[],"stream":"yes"}`, "stream", "boolean"},
		{"bad role", `{"max_tokens":1,"messages":[{"role":"tool","content":"x"}]}`, "messages", "messages[0].role"},
		{"content number", `{"max_tokens":1,"messages":[{"role":"user","content":1}]}`, "messages", "messages[0].content"},
		{"bad block type", `{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"video"}]}]}`, "messages", "messages[0].content[0].type"},
		{"text not string", `{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":3}]}]}`, "messages", "content[0].text"},
		{"input not object", `{"max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","input":[1]}]}]}`, "messages", "input"},
		{"result item not object", `{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","content":["x"]}]}]}`, "messages", "content[0]"},
		{"system number", `{"max_tokens":1,"messages":[],"system":5}`, "system", "string or an array"},
		{"system block", `{"max_tokens":1,"messages":[],"system":[{"type":"text","text":false}]}`, "system", "system[0].text"},
		{"tool schema", `{"max_tokens":1,"messages":[],"tools":[{"name":"f"}]}`, "tools", "input_schema"},
		{"tool name", `{"max_tokens":1,"messages":[],"tools":[{"input_schema":{}}]}`, "tools", "name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAnthropic([]byte(tc.body))
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RequestError", err)
			}
			if re.Param != tc.param || !strings.Contains(re.Error(), tc.msg) {
				t.Errorf("err = %v (param %q), want param %q and %q", err, re.Param, tc.param, tc.msg)
			}
			if re.Offset < 0 || re.Offset > len(tc.body) {
				t.Errorf("offset %d outside the body", re.Offset)
			}
		})
	}
}
