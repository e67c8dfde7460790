package openai

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// refStr is scanner.str the obvious way, a byte at a time: the reference
// the word-at-a-time str must agree with, cursor and error included.
func refStr(s *scanner) (start, end int, escaped bool, err error) {
	s.i++
	start = s.i
	b := s.b
	for {
		i := s.i
		for i < len(b) && b[i] >= 0x20 && b[i] != '"' && b[i] != '\\' {
			i++
		}
		s.i = i
		if i >= len(b) {
			return 0, 0, false, s.errf("unexpected end of JSON input in string literal")
		}
		switch b[i] {
		case '"':
			s.i++
			return start, i, escaped, nil
		case '\\':
			escaped = true
			if err := s.escape(i); err != nil {
				return 0, 0, false, err
			}
		default:
			return 0, 0, false, s.unexpected("in string literal")
		}
	}
}

// TestStrMatchesByteLoop puts quotes, escapes (good and bad), control
// bytes and the end of input at every offset of strings long enough for
// every step of str's fast path, alone and in pairs, and checks str
// returns what the byte loop does.
func TestStrMatchesByteLoop(t *testing.T) {
	pieces := []string{`"`, `\"`, `\\`, `\n`, `\u00e9`, `\u00`, `\x`, "\x01", "\x1f", "\t", "\xff", "é", `\`}
	fill := strings.Repeat("abcdefg ", 12)
	var bodies []string
	for n := 0; n <= len(fill); n++ {
		bodies = append(bodies, `"`+fill[:n]) // no closing quote
		for _, p := range pieces {
			bodies = append(bodies, `"`+fill[:n]+p+fill[n:]+`"x`)
			for _, p2 := range pieces[:5] {
				bodies = append(bodies, `"`+fill[:n]+p+fill[:len(fill)-n]+p2+fill+`"`)
			}
		}
	}
	// Past the 32-byte steps, with non-ASCII text before.
	big := strings.Repeat("abcdefg ", 20) + "é" + strings.Repeat("abcdefg ", 20)
	for _, w := range []int{64, 200} {
		for n := w - 40; n <= w+40; n++ {
			bodies = append(bodies, `"`+big[:n])
			for _, p := range pieces {
				bodies = append(bodies, `"`+big[:n]+p+big[n:]+`"x`, `"`+`\n`+big[:n]+p+big[n:]+`"x`)
			}
		}
	}
	for _, body := range bodies {
		got, want := &scanner{b: []byte(body)}, &scanner{b: []byte(body)}
		gs, ge, gx, gerr := got.str()
		ws, we, wx, werr := refStr(want)
		if gs != ws || ge != we || gx != wx || got.i != want.i || fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Fatalf("%q: str = %d %d %v cursor %d %v; byte loop %d %d %v cursor %d %v",
				body, gs, ge, gx, got.i, gerr, ws, we, wx, want.i, werr)
		}
	}
}

// TestParseRequestUTF8First: invalid UTF-8 anywhere is the error, at its
// offset, whatever else is wrong with the body, now that the body's
// longest ASCII string is not checked twice.
func TestParseRequestUTF8First(t *testing.T) {
	long := strings.Repeat("plain text ", 20)
	bodies := []string{
		`{"messages":[{"content":"` + long + `"},{"content":"` + "\xff" + `"}]}`,
		`{"model":"` + "\xc3" + `","messages":[{"content":"` + long + `"}]}`,
		`{"messages":[{"content":"` + long[:50] + "\xe2\x82" + long + `"}]}`,
		`{"messages":[{"content":"` + long + `"}]}` + " \xff",
		`{"messages":[{"content":"` + long + `"}],"` + "\xf0" + `":1}`,
		`{"messages":[{"content":"` + long + `"}]` + "\xff" + `,}`,
		`{"messages":[{"content":"` + long + `"}],x` + "\xff",
		"\xff" + `{"messages":[{"content":"` + long + `"}]}`,
		`{"messages":[{"content":"` + long + `\u00e9` + "\xc0\xaf" + `"}]}`,
	}
	for _, body := range bodies {
		want := invalidUTF8Offset([]byte(body))
		if want < 0 {
			t.Fatalf("%q: the test's body is valid UTF-8", body)
		}
		_, err := ParseRequest([]byte(body))
		var re *RequestError
		if !errors.As(err, &re) || re.Offset != want || re.Msg != "body is not valid UTF-8" {
			t.Errorf("%q: error %v; want invalid UTF-8 at %d", body, err, want)
		}
	}
}
