package chattemplate

import (
	"maps"
	"slices"
	"testing"
)

// TestRenderContextNames: the render context holds only the variables the
// template can look up, with the names the source rewrite adds, and a
// template still sees every one it mentions.
func TestRenderContextNames(t *testing.T) {
	in := Input{
		Messages:            []any{map[string]any{"role": "user", "content": "hi"}},
		AddGenerationPrompt: true,
		Kwargs:              map[string]any{"enable_thinking": false, "unused_kwarg": 1},
		Special:             map[string]string{"bos_token": "<s>", "eos_token": "</s>"},
	}
	cases := []struct {
		name, src string
		keys      []string // the context's keys
		out       string
	}{
		{"outputs and a kwarg",
			"{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking is false %}!{% endif %}",
			[]string{"bos_token", "enable_thinking", "llmgw_str", "messages"}, "<s>hi!"},
		{"tojson renamed", "{% set x = messages[0] | tojson %}{{ x }}",
			[]string{"llmgw_str", "llmgw_tojson", "messages"}, `{"role": "user", "content": "hi"}`},
		{"no outputs", "{% if add_generation_prompt %}gen{% endif %}", []string{"add_generation_prompt"}, "gen"},
		{"names inside raw blocks are text", "{% raw %}{{ eos_token }}{% endraw %}", nil, "{{ eos_token }}"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tm, err := Parse(c.src)
			if err != nil {
				t.Fatal(err)
			}
			req, err := resolveRequest(in)
			if err != nil {
				t.Fatal(err)
			}
			conv, err := vllmConversation(in.Messages, tm.format)
			if err != nil {
				t.Fatal(err)
			}
			data, err := renderContext(in, req, conv, tm.names)
			if err != nil {
				t.Fatal(err)
			}
			got := slices.Sorted(maps.Keys(data))
			if !slices.Equal(got, c.keys) {
				t.Errorf("context keys %v, want %v", got, c.keys)
			}
			out, err := tm.Render(in)
			if err != nil {
				t.Fatal(err)
			}
			if out != c.out {
				t.Errorf("rendered %q, want %q", out, c.out)
			}
		})
	}
}
