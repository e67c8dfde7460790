package chattemplate

import (
	"testing"
	"time"
)

// TestPrepareSource checks that the rewrite touches expressions only:
// literal text, comments and raw blocks keep "|tojson" and escapes as
// written.
func TestPrepareSource(t *testing.T) {
	cases := []struct{ src, want string }{
		{"text |tojson '\\x41'", "text |tojson '\\x41'"},
		{"{# x|tojson #}", "{# x|tojson #}"},
		{"{% raw %}{{ x|tojson }}{% endraw %}", "{% raw %}{{ x|tojson }}{% endraw %}"},
		{"{{ x|tojson }}", "{{ llmgw_str(( x|llmgw_tojson )) }}"},
		{"{{- x | tojson(indent=2) -}}", "{{- llmgw_str(( x | llmgw_tojson(indent=2) )) -}}"},
		{"{% set y = x|tojson %}", "{% set y = x|llmgw_tojson %}"},
		{"{% set y = x.tojson %}", "{% set y = x.tojson %}"},
		{"{% if a == '\\x41\\r' %}", "{% if a == 'A\r' %}"},
		{"{% if a == 'it\\'s \\n' %}", "{% if a == 'it\\'s \\n' %}"},
		{"{% if a == \"q'\\u00e9\" %}", "{% if a == 'q\\'é' %}"},
		{"a\r\nb\rc\n", "a\nb\nc"},
		{"{{ '}}' }}", "{{ llmgw_str(( '}}' )) }}"},
		{"{ not a tag }", "{ not a tag }"},
		// A sum that starts with a string is printed operand by operand.
		{"{{- '<a>' + m.role + '\\n' + m['content'] | trim + f(x, y + 1) -}}",
			"{{- llmgw_str(( '<a>' )) }}{{ llmgw_str(( m.role )) }}{{ llmgw_str(( '\\n' )) }}{{ llmgw_str(( m['content'] | trim )) }}{{ llmgw_str(( f(x, y + 1) )) -}}"},
		// Anything else at the top level keeps the tag whole.
		{"{{ 'a' + x if c else 'b' }}", "{{ llmgw_str(( 'a' + x if c else 'b' )) }}"},
		{"{{ 'a' + x ~ y }}", "{{ llmgw_str(( 'a' + x ~ y )) }}"},
		{"{{ 'a' + x - 1 }}", "{{ llmgw_str(( 'a' + x - 1 )) }}"},
		{"{{ 'a' + x or y }}", "{{ llmgw_str(( 'a' + x or y )) }}"},
		{"{{ x + 'a' }}", "{{ llmgw_str(( x + 'a' )) }}"},
		{"{{ ('a' + x) }}", "{{ llmgw_str(( ('a' + x) )) }}"},
	}
	for _, c := range cases {
		got, err := prepareSource(c.src)
		if err != nil {
			t.Fatalf("%q: %v", c.src, err)
		}
		if got.src != c.want {
			t.Errorf("%q\n got %q\nwant %q", c.src, got.src, c.want)
		}
	}
	if _, err := prepareSource("{{ x "); err == nil {
		t.Error("unclosed tag accepted")
	}
}

func TestStrftime(t *testing.T) {
	tm := mustTime(t, "2024-01-05T09:03:07.123456Z")
	cases := map[string]string{
		"%Y-%m-%d":       "2024-01-05",
		"%-d/%-m %e|%j":  "5/1  5|005",
		"%I%p %H:%M:%S":  "09AM 09:03:07",
		"%a %A %b %B %y": "Fri Friday Jan January 24",
		"%f %% %Q %":     "123456 % %Q %",
		"%Z %z":          "UTC +0000",
	}
	for f, want := range cases {
		if got := strftime(f, tm); got != want {
			t.Errorf("strftime(%q) = %q, want %q", f, got, want)
		}
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}
