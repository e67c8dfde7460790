package httpbody

import (
	"errors"
	"strings"
	"testing"
)

func TestReadLimited(t *testing.T) {
	buf := make([]byte, 0, 4)
	b, err := ReadLimited(strings.NewReader("12345"), 5, buf)
	if err != nil || string(b) != "12345" {
		t.Fatalf("at the limit: %q %v", b, err)
	}
	if _, err := ReadLimited(strings.NewReader("123456"), 5, buf); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("past the limit: %v", err)
	}
}

func TestSnippet(t *testing.T) {
	if got := Snippet(strings.NewReader("  bad \"thing\"\n")); got != `"bad \"thing\""` {
		t.Fatalf("%s", got)
	}
	if got := Snippet(strings.NewReader(strings.Repeat("x", 1000))); len(got) != 162 {
		t.Fatalf("%d bytes: not cut at 160", len(got))
	}
}
