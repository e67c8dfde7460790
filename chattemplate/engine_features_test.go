package chattemplate

import (
	"testing"
	"time"
)

// TestEngineFeatures checks the template features chat templates lean on
// against Python's jinja2 (3.1.6, set up as transformers sets it up:
// ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
// transformers' tojson and globals). Each want is jinja2's output for the
// same template and context.
func TestEngineFeatures(t *testing.T) {
	cases := []struct{ name, src, want string }{
		{"namespace", `{% set ns = namespace(n=0, s='') %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}`, "6 123"},
		{"loop_vars", `{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.length }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %};{% endfor %}`, "1033F;2123;3213L;"},
		{"loop_prev_next", `{% for x in [1, 2, 3] %}{{ loop.previtem is defined }}/{{ loop.nextitem|default('-') }};{% endfor %}`, "False/2;True/3;True/-;"},
		{"loop_filter", `{% for m in messages if m.role == 'user' %}{{ m.content }};{% endfor %}`, "U1;U2;"},
		{"tests", `{{ 'a' is string }} {{ {} is mapping }} {{ [] is mapping }} {{ nope is defined }} {{ messages is defined }} {{ none is none }} {{ 1 is number }} {{ 'x' is not string }} {{ false is false }} {{ [1] is iterable }} {{ 3 is odd }}`, "True True False False True True True False True True True"},
		{"string_methods", `{{ 'aXbXc'.split('X') }} {{ ' a  b '.split() }} {{ '--x--'.strip('-') }} {{ '  x  '.strip() }}|{{ '\n\nx'.lstrip('\n') }}|{{ 'x\n\n'.rstrip('\n') }}|{{ 'x  '.rstrip() }}|{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.replace('b', 'B') }} {{ 'aBc'.upper() }} {{ 'aBc'.lower() }} {{ 'abc'.find('c') }} {{ 'hello world'.title() }}`, "['a', 'b', 'c'] ['a', 'b'] x x|x|x|x|True True aBc ABC abc 2 Hello World"},
		{"split_index", `{{ '<think>r</think>\n\nanswer'.split('</think>')[-1].lstrip('\n') }}|{{ '<think>r</think>a'.split('</think>')[0].split('<think>')[-1] }}`, "answer|r"},
		{"dict_methods", `{% set d = {'b': 1, 'a': 2} %}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list }} {{ 'a' in d }}`, "b=1;a=2;2 dflt ['b', 'a'] [1, 2] True"},
		{"slicing", `{{ [1, 2, 3, 4][1:3] }} {{ [1, 2, 3][::-1] }} {{ [1, 2, 3]|reverse|list }} {{ 'abcd'[1:] }} {{ 'abc'[::-1] }} {{ [1, 2, 3][-1] }} {{ [1, 2, 3][-2:] }} {{ messages[1:]|length }} {{ [1, 2, 3, 4, 5][::2] }}`, "[2, 3] [3, 2, 1] [3, 2, 1] bcd cba 3 [2, 3] 3 [1, 3, 5]"},
		{"filters", `{{ '  x  '|trim }}|{{ [1, 2]|length }} {{ 'abc'|length }} {{ {'a': 1}|length }} {{ [3, 1, 2]|sort }} {{ ['a', 'b']|join(', ') }} {{ [1, 2]|first }} {{ [1, 2]|last }} {{ 'ab'|upper }} {{ none|default('d') }} {{ [1, 1, 2]|unique|list }} {{ 'A b'|lower }} {{ [{'a': 1}, {'a': 2}]|map(attribute='a')|join }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}`, "x|2 3 1 [1, 2, 3] a, b 1 2 AB None [1, 2] a b 12 2"},
		{"break_continue", `{% for x in [1, 2, 3, 4, 5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}`, "13"},
		{"trim_blocks", `{% if true %}
A
{% endif %}
B`, "A\nB"},
		{"lstrip_blocks", `  {% if true %}
    X
  {% endif %}
Y`, "    X\nY"},
		{"lstrip_not_midline", `a  {% if true %}b{% endif %}  c`, "a  b  c"},
		{"dash_markers", `a   {%- if true -%}   b   {%- endif -%}   c {{- ' d ' -}} e`, "abc d e"},
		{"comments", `a
  {# note #}
b {#- x -#} c`, "a\nbc"},
		{"expr_not_trimmed", `{{ 'a' }}
{{ 'b' }}
`, "a\nb"},
		{"operators", `{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 'a' ~ 1 }} {{ 'x' * 3 }} {{ not true }} {{ 1 < 2 and 'y' or 'n' }} {{ 'a' in 'abc' }} {{ 'z' not in ['a'] }} {{ 1 == 1.0 }}`, "7 3 1 a1 xxx False y True True True"},
		{"precedence", `{{ messages|length - 1 }} {{ 'a' + 'b'|upper }} {% if not nope is defined %}nd{% endif %} {{ 'x' if false else 'y' }}`, "3 aB nd y"},
		{"macro", `{% macro f(x, y='d') %}[{{ x }}{{ y }}]{% endmacro %}{{ f(1) }}{{ f(2, y='e') }}`, "[1d][2e]"},
		{"set_block", `{% set c %}in{{ 1 }}{% endset %}{{ c }}`, "in1"},
		{"scoping", `{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{% endfor %}{{ x }}{% if true %}{% set x = 'if' %}{% endif %} {{ x }}`, "outer if"},
		{"escapes", `{{ 'a\x41\u00e9\U0001F680' }}|{{ 'tab\there' }}|{{ "q'\"" }}|{{ 'cr\rx'|length }}|{{ 'a\\b' }}`, "aAé🚀|tab\there|q'\"|4|a\\b"},
		{"raw", `{% raw %}{{ not rendered|tojson }}{% endraw %}`, "{{ not rendered|tojson }}"},
		{"generation", `{% generation %}g{% endgeneration %}`, "g"},
		{"python_str", `{{ 1.0 }} {{ none }} {{ ['a', "it's", 1.5, none, true] }} {{ {'k': 'v\n', 'f': 2.0} }} {{ 1.0e20 * 10 }} {{ 10 / 4 }} {{ -0.5 }}`, "1.0 None ['a', \"it's\", 1.5, None, True] {'k': 'v\\n', 'f': 2.0} 1e+21 2.5 -0.5"},
		{"bools_print", `{{ true }} {{ false }} {{ [true, none] }}`, "True False [True, None]"},
		{"strftime", `{{ strftime_now('%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %p %I') }} {{ strftime_now('%-d %-m') }} {{ strftime_now('%d %b %Y') }}`, "2025-03-07 14:05:09 Fri Friday Mar March 066 25 PM 02 7 3 07 Mar 2025"},
		{"special_tokens", `{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}`, "<s>|</s>|False"},
		{"tools_none", `{{ tools is none }} {{ tools is defined }} {{ documents is none }}`, "True True True"},
	}
	in := Input{
		Messages: []any{
			map[string]any{"role": "system", "content": "S"},
			map[string]any{"role": "user", "content": "U1"},
			map[string]any{"role": "assistant", "content": "A"},
			map[string]any{"role": "user", "content": "U2"},
		},
		Special: map[string]string{"bos_token": "<s>", "eos_token": "</s>"},
		Now:     func() time.Time { return time.Date(2025, 3, 7, 14, 5, 9, 0, time.UTC) },
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := Parse(c.src)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Render(in)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
		})
	}
}
