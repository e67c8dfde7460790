package admission

import (
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
