package chattemplate

import (
	"errors"
	"testing"

	"github.com/ardanlabs/jinja"
)

// dumpTemplate shows what a template sees of the request.
const dumpTemplate = `{{ messages|tojson }}|{{ tools|tojson }}|{{ add_generation_prompt }}`

// decode is DecodeJSON for tests.
func decode(t *testing.T, doc string) any {
	t.Helper()
	v, err := DecodeJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func renderDump(t *testing.T, format ContentFormat, in Input) string {
	t.Helper()
	tmpl, err := Parse(dumpTemplate)
	if err != nil {
		t.Fatal(err)
	}
	in.ContentFormat = format
	out, err := tmpl.Render(in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestVLLMMessageRules checks the message rebuilding of vLLM's
// _parse_chat_message_content and _postprocess_messages.
func TestVLLMMessageRules(t *testing.T) {
	cases := []struct {
		name     string
		format   ContentFormat
		messages string
		want     string
	}{
		{"string content joins parts with newlines", ContentString,
			`[{"role": "user", "content": [{"type": "text", "text": "a"}, "b", {"type": "refusal", "refusal": "c"}, {"type": "thinking", "thinking": "d"}, {"type": "text", "text": null}]}]`,
			`[{"role": "user", "content": "a\nb\nc\nd"}]`},
		{"openai content keeps text parts", ContentOpenAI,
			`[{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "input_text", "text": "x", "extra": 1}]}]`,
			`[{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "user", "content": [{"type": "text", "text": "x"}]}]`},
		{"null content", ContentString, `[{"role": "assistant", "content": null}, {"role": "user"}]`,
			`[{"role": "assistant", "content": ""}, {"role": "user", "content": ""}]`},
		{"null content openai", ContentOpenAI, `[{"role": "assistant", "content": null}]`,
			`[{"role": "assistant", "content": []}]`},
		{"unknown fields are dropped, name and task kept", ContentString,
			`[{"role": "user", "content": "x", "name": "bob", "task": "t", "foo": 1, "reasoning": "r"}, {"role": "user", "content": "y", "name": 5}]`,
			`[{"role": "user", "content": "x", "name": "bob", "task": "t"}, {"role": "user", "content": "y"}]`},
		{"reasoning becomes reasoning_content too, reasoning_content is dropped", ContentString,
			`[{"role": "assistant", "content": "a", "reasoning": "r"}, {"role": "assistant", "content": "b", "reasoning_content": "dropped"}]`,
			`[{"role": "assistant", "content": "a", "reasoning": "r", "reasoning_content": "r"}, {"role": "assistant", "content": "b"}]`},
		{"tool call arguments are parsed in order", ContentString,
			`[{"role": "assistant", "content": "", "tool_calls": [{"id": "1", "function": {"arguments": "{\"z\": 1, \"a\": [1.0, 2]}", "name": "f"}, "type": "function"}]}]`,
			`[{"role": "assistant", "content": "", "tool_calls": [{"id": "1", "function": {"arguments": {"z": 1, "a": [1.0, 2]}, "name": "f"}, "type": "function"}]}]`},
		{"bad, empty and missing arguments become {}", ContentString,
			`[{"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": "{"}}, {"function": {"name": "b", "arguments": null}}, {"function": {"name": "c"}}, {"function": {"name": "d", "arguments": [1]}}]}]`,
			`[{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}, {"function": {"name": "c", "arguments": {}}}, {"function": {"name": "d", "arguments": [1]}}]}]`},
		{"empty and null tool_calls are dropped", ContentString,
			`[{"role": "assistant", "content": "a", "tool_calls": []}, {"role": "assistant", "content": "b", "tool_calls": null}]`,
			`[{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]`},
		{"tool messages keep tool_call_id and flatten text parts", ContentOpenAI,
			`[{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}, {"role": "tool", "content": [{"type": "tool_reference", "name": "n"}]}]`,
			`[{"role": "tool", "content": "x\ny", "tool_call_id": "c1"}, {"role": "tool", "content": [{"type": "tool_reference", "name": "n"}]}]`},
		{"developer messages carry tools", ContentString,
			`[{"role": "developer", "content": "d"}]`,
			`[{"role": "developer", "content": "d", "tools": null}]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msgs := decode(t, c.messages).([]any)
			got := renderDump(t, c.format, Input{Messages: msgs})
			if want := c.want + "|null|False"; got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

// TestVLLMToolRules checks that tools are dumped as vLLM's pydantic
// models dump them: declared fields first with defaults, then extras.
func TestVLLMToolRules(t *testing.T) {
	tools := decode(t, `[{"function": {"parameters": {"b": 1, "a": 2}, "strict": true, "name": "f"}, "x-extra": 1}, {"type": "function", "function": {"name": "g", "description": "d"}}]`).([]any)
	got := renderDump(t, ContentString, Input{Messages: []any{}, Tools: tools})
	want := `[]|[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"b": 1, "a": 2}, "strict": true}, "x-extra": 1}, {"type": "function", "function": {"name": "g", "description": "d", "parameters": null}}]|False`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	// An empty list is still tools, as in vLLM: not None, but falsy.
	got = renderDump(t, ContentString, Input{Messages: []any{}, Tools: []any{}})
	if want := `[]|[]|False`; got != want {
		t.Errorf("empty tools: got %s, want %s", got, want)
	}
}

// TestPlainMapsSortKeys documents that Go maps, having no order, are
// rendered with sorted keys; Objects keep theirs.
func TestPlainMapsSortKeys(t *testing.T) {
	msgs := []any{map[string]any{"role": "assistant", "content": "", "tool_calls": []any{
		map[string]any{"function": map[string]any{"name": "f", "arguments": map[string]any{"z": 1, "a": 2.5, "m": int64(3)}}},
	}}}
	got := renderDump(t, ContentString, Input{Messages: msgs})
	want := `[{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {"a": 2.5, "m": 3, "z": 1}, "name": "f"}}]}]|null|False`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// TestKwargs checks how chat_template_kwargs reach the template.
func TestKwargs(t *testing.T) {
	tmpl, err := Parse(`{{ bos_token }}|{{ enable_thinking }}|{{ add_generation_prompt }}|{{ tools|length }}|{{ documents }}|{{ return_dict is defined }}`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := tmpl.Render(Input{
		Messages: []any{},
		Special:  map[string]string{"bos_token": "<s>", "eos_token": ""},
		Kwargs: map[string]any{
			"bos_token": "<override>", "enable_thinking": false, "add_generation_prompt": true,
			"tools": []any{1, 2}, "documents": []any{"d"}, "return_dict": true,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := `<override>|False|True|2|['d']|False`; out != want {
		t.Errorf("got %q, want %q", out, want)
	}
	for _, k := range []string{"chat_template", "tokenize", "messages", "conversation"} {
		_, err := tmpl.Render(Input{Kwargs: map[string]any{k: "x"}})
		if !errors.Is(err, ErrInvalidInput) {
			t.Errorf("kwarg %q: error %v, want ErrInvalidInput", k, err)
		}
	}
}

// TestContinueFinalMessage checks transformers 4.x's rule (cut after the
// stripped final text) on templates that keep, trim and transform the
// final message: trailing white space of the message goes either way.
func TestContinueFinalMessage(t *testing.T) {
	msgs := func(final any) []any {
		return []any{map[string]any{"role": "user", "content": "Q"}, map[string]any{"role": "assistant", "content": final}}
	}
	cases := []struct {
		name, src string
		format    ContentFormat
		final     any
		want      string
	}{
		{"kept", `{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}`, ContentString, "Hi ", "<user>Q</s><assistant>Hi"},
		{"trimmed", `{% for m in messages %}<{{ m.role }}>{{ m.content|trim }}</s>{% endfor %}`, ContentString, "Hi \n", "<user>Q</s><assistant>Hi"},
		{"parts", `{% for m in messages %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endfor %}`, ContentOpenAI,
			[]any{map[string]any{"type": "text", "text": "a"}, map[string]any{"type": "text", "text": "b"}}, "[Q][a][b"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := Parse(c.src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Render(Input{Messages: msgs(c.final), ContinueFinalMessage: true, ContentFormat: c.format})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestContentFormatDetection(t *testing.T) {
	cases := []struct {
		src  string
		want ContentFormat
	}{
		{`{% for m in messages %}{{ m.content }}{% endfor %}`, ContentString},
		{`{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% for m in messages %}{% for c in m['content'] %}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{%- for m in messages[1:] -%}{%- for c in m["content"] | selectattr("type", "equalto", "text") -%}{%- endfor -%}{%- endfor -%}`, ContentOpenAI},
		{`{% set loop_messages = messages[1:] %}{% set msgs = loop_messages %}{% for m in msgs if m.role != 'system' %}{% for c in m.content[::-1] %}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% for m in messages|reverse %}{% for c in m.content is string %}{% endfor %}{% endfor %}`, ContentOpenAI},
		// Not vLLM's shapes: an alias of the content, or a non-slice index.
		{`{% for m in messages %}{% set c = m.content %}{% for x in c %}{% endfor %}{% endfor %}`, ContentString},
		{`{% for m in messages %}{% for x in m.content[0] %}{% endfor %}{% endfor %}`, ContentString},
		{`{% for x in messages[0].content %}{% endfor %}`, ContentString},
		// Where vLLM's AST walk fails it falls back to "string".
		{`{% set ns.m = messages %}{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}`, ContentString},
		{`{% for i, m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}`, ContentString},
		// A raw block is text.
		{`{% raw %}{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}{% endraw %}`, ContentString},
		{`{% set messages = messages[1:] %}{% set a = b %}{% set b = a %}`, ContentString},
	}
	for _, c := range cases {
		tmpl, err := Parse(c.src)
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		if got := tmpl.ContentFormat(); got != c.want {
			t.Errorf("%s: got %s, want %s", c.src, got, c.want)
		}
	}
}

// TestMessageKinds: a message reads the same whether it is an Object (as
// DecodeJSON gives it), a pointer to one, a Go map or a dict value; what
// is no object is refused; only the members vLLM keeps are converted, so
// a value the template could not hold is an error there and ignored
// elsewhere.
func TestMessageKinds(t *testing.T) {
	obj := decode(t, `{"role": "user", "content": "hi", "name": "bob"}`).(Object)
	dict, err := toValue(obj, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"role": "user", "content": "hi", "name": "bob"}]|null|False`
	for _, m := range []any{obj, &obj, map[string]any{"role": "user", "content": "hi", "name": "bob"}, dict,
		map[string]any{"role": "user", "content": "hi", "name": "bob", "extra": struct{}{}}} {
		if got := renderDump(t, ContentString, Input{Messages: []any{m}}); got != want {
			t.Errorf("%T: got %s, want %s", m, got, want)
		}
	}
	tmpl, err := Parse(dumpTemplate)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []any{"hi", nil, (*Object)(nil), 7, jinja.NewString("x"),
		map[string]any(nil), Object{}, map[string]any{"role": "user", "content": struct{}{}}} {
		if _, err := tmpl.Render(Input{Messages: []any{m}}); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("message %#v: err %v, want ErrInvalidInput", m, err)
		}
	}
}
