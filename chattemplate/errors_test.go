package chattemplate

import (
	"errors"
	"strings"
	"testing"
)

func TestParseErrors(t *testing.T) {
	for _, src := range []string{
		`{% if x %}never closed`,
		`{{ unclosed`,
		`{% endfor %}`,
		`{% bogus %}`,
		`{{ 'bad \x4 escape' }}`,
		`{{ 'named \N{BULLET}' }}`,
		`{{ 'unterminated }}`,
	} {
		if _, err := Parse(src); err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", src)
		} else if !strings.HasPrefix(err.Error(), "chattemplate: parse: ") {
			t.Errorf("Parse(%q) error %q lacks context", src, err)
		}
	}
}

func TestRaiseException(t *testing.T) {
	tmpl, err := Parse(`{% if messages|length == 0 %}{{ raise_exception('no messages: ' ~ 3) }}{% endif %}ok`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render(Input{})
	var raised *RaiseError
	if !errors.As(err, &raised) || raised.Message != "no messages: 3" {
		t.Fatalf("error %v, want RaiseError(no messages: 3)", err)
	}
	if out, err := tmpl.Render(Input{Messages: []any{map[string]any{"role": "user"}}}); err != nil || out != "ok" {
		t.Fatalf("got %q, %v", out, err)
	}
}

func TestOutputLimit(t *testing.T) {
	tmpl, err := Parse(`{% for m in messages %}{{ m.content }}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []any{map[string]any{"role": "user", "content": strings.Repeat("x", 600)}}
	_, err = tmpl.Render(Input{Messages: msgs, MaxOutputBytes: 500})
	if !errors.Is(err, ErrOutputTooLarge) {
		t.Fatalf("error %v, want ErrOutputTooLarge", err)
	}
	if _, err := tmpl.Render(Input{Messages: msgs, MaxOutputBytes: 600}); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	// The default limit applies when none is given.
	big, err := Parse(`{% for i in range(17) %}{{ messages[0].content }}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	huge := []any{map[string]any{"role": "user", "content": strings.Repeat("y", 1<<20)}}
	if _, err := big.Render(Input{Messages: huge}); !errors.Is(err, ErrOutputTooLarge) {
		t.Fatalf("error %v, want ErrOutputTooLarge at the default limit", err)
	}
}

// TestBadInputs checks that malformed requests are errors of the right
// kind, never panics.
func TestBadInputs(t *testing.T) {
	tmpl, err := Parse(dumpTemplate)
	if err != nil {
		t.Fatal(err)
	}
	user := map[string]any{"role": "user", "content": "x"}
	cases := []struct {
		name string
		in   Input
		want error
	}{
		{"message not an object", Input{Messages: []any{"hi"}}, ErrInvalidInput},
		{"missing role", Input{Messages: []any{map[string]any{"content": "x"}}}, ErrInvalidInput},
		{"role not a string", Input{Messages: []any{map[string]any{"role": 1}}}, ErrInvalidInput},
		{"content a number", Input{Messages: []any{map[string]any{"role": "user", "content": 3}}}, ErrInvalidInput},
		{"part not an object", Input{Messages: []any{map[string]any{"role": "user", "content": []any{1}}}}, ErrInvalidInput},
		{"part without type", Input{Messages: []any{map[string]any{"role": "user", "content": []any{map[string]any{"text": "x"}}}}}, ErrInvalidInput},
		{"part type unknown", Input{Messages: []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "nope"}}}}}, ErrInvalidInput},
		{"part type not a string", Input{Messages: []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": 1}}}}}, ErrInvalidInput},
		{"part text not a string", Input{Messages: []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": 1}}}}}, ErrInvalidInput},
		{"image part", Input{Messages: []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image_url", "image_url": map[string]any{"url": "x"}}}}}}, ErrUnsupportedContent},
		{"bare image part", Input{Messages: []any{map[string]any{"role": "user", "content": []any{map[string]any{"image_url": "x"}}}}}, ErrUnsupportedContent},
		{"text part with uuid", Input{Messages: []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "x", "uuid": "u"}}}}}, ErrInvalidInput},
		{"tool_calls not a list", Input{Messages: []any{map[string]any{"role": "assistant", "tool_calls": "x"}}}, ErrInvalidInput},
		{"tool call without function", Input{Messages: []any{map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": "1"}}}}}, ErrInvalidInput},
		{"tool call not an object", Input{Messages: []any{map[string]any{"role": "assistant", "tool_calls": []any{"x"}}}}, ErrInvalidInput},
		{"reasoning not a string", Input{Messages: []any{map[string]any{"role": "assistant", "reasoning": 1}}}, ErrInvalidInput},
		{"tool not an object", Input{Messages: []any{user}, Tools: []any{"x"}}, ErrInvalidInput},
		{"tool of another type", Input{Messages: []any{user}, Tools: []any{map[string]any{"type": "custom", "function": map[string]any{"name": "f"}}}}, ErrInvalidInput},
		{"tool without name", Input{Messages: []any{user}, Tools: []any{map[string]any{"function": map[string]any{}}}}, ErrInvalidInput},
		{"tool description not a string", Input{Messages: []any{user}, Tools: []any{map[string]any{"function": map[string]any{"name": "f", "description": 1}}}}, ErrInvalidInput},
		{"tool parameters not an object", Input{Messages: []any{user}, Tools: []any{map[string]any{"function": map[string]any{"name": "f", "parameters": []any{}}}}}, ErrInvalidInput},
		{"unsupported Go type", Input{Messages: []any{map[string]any{"role": "user", "content": struct{}{}}}}, ErrInvalidInput},
		{"too deep", Input{Messages: []any{deepList(maxDepth + 5)}}, ErrInvalidInput},
		{"both prompts", Input{Messages: []any{user}, AddGenerationPrompt: true, ContinueFinalMessage: true}, ErrInvalidInput},
		{"continue without messages", Input{ContinueFinalMessage: true}, ErrInvalidInput},
		{"continue without text", Input{Messages: []any{map[string]any{"role": "assistant", "content": []any{}}}, ContinueFinalMessage: true, ContentFormat: ContentOpenAI}, ErrInvalidInput},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := tmpl.Render(c.in)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %q, %v; want %v", out, err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "chattemplate: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

// TestContinueNeedsContent checks transformers' refusals: a template that
// never mentions content, and one that drops the final message.
func TestContinueNeedsContent(t *testing.T) {
	msgs := []any{map[string]any{"role": "assistant", "content": "partial"}}
	for _, src := range []string{`{{ messages|length }}`, `{% for m in messages %}{{ m.role }}{% endfor %}{{ 'content' }}`} {
		tmpl, err := Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tmpl.Render(Input{Messages: msgs, ContinueFinalMessage: true}); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: error %v, want ErrInvalidInput", src, err)
		}
	}
}

// TestRuntimeErrors checks that errors the engine reports come back
// wrapped.
func TestRuntimeErrors(t *testing.T) {
	for _, src := range []string{`{{ nope() }}`, `{{ 'x'|nosuchfilter }}`, `{{ strftime_now() }}`, `{{ raise_exception() }}`, `{{ 'x'.rsplit('x') }}`} {
		tmpl, err := Parse(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if _, err := tmpl.Render(Input{}); err == nil || !strings.HasPrefix(err.Error(), "chattemplate: ") {
			t.Errorf("%s: error %v, want a chattemplate error", src, err)
		}
	}
}

func deepList(n int) any {
	var v any = "leaf"
	for range n {
		v = []any{v}
	}
	return v
}
