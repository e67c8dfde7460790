package jsonlex

import (
	"errors"
	"strings"
	"testing"
)

// document validates b as one JSON document with the lexer, as the
// walkers do: a value between optional whitespace.
func document(b []byte, max int) error {
	i, err := Skip(b, SkipSpace(b, 0), 0, max)
	if err != nil {
		return err
	}
	if i = SkipSpace(b, i); i < len(b) {
		return Unexpected(b, i, "after top-level value")
	}
	return nil
}

// TestErrors: malformed documents fail at the exact byte, with
// encoding/json's wording.
func TestErrors(t *testing.T) {
	for _, tt := range []struct {
		doc string
		off int
		msg string
	}{
		{`"abc`, 4, "unexpected end of JSON input in string literal"},
		{"\"a\x01\"", 2, "invalid byte 0x01 in string literal"},
		{"\"a\n\"", 2, "invalid byte 0x0a in string literal"},
		{`"\x"`, 2, `invalid character 'x' in string escape code`},
		{`"\`, 2, "unexpected end of JSON input in string escape code"},
		{`"\u12g4"`, 5, `invalid character 'g' in \u hexadecimal character escape`},
		{`"\u12`, 5, `unexpected end of JSON input in \u hexadecimal character escape`},
		{`-`, 1, "unexpected end of JSON input in numeric literal"},
		{`-a`, 1, "invalid character 'a' in numeric literal"},
		{`[01]`, 2, "invalid character '1' after array element"},
		{`1.`, 2, "unexpected end of JSON input after decimal point in numeric literal"},
		{`1.e5`, 2, "invalid character 'e' after decimal point in numeric literal"},
		{`1e`, 2, "unexpected end of JSON input in exponent of numeric literal"},
		{`1e+x`, 3, "invalid character 'x' in exponent of numeric literal"},
		{`.5`, 0, "invalid character '.' looking for beginning of value"},
		{`tru`, 3, "unexpected end of JSON input in literal true (expecting 'e')"},
		{`nul1`, 3, "invalid character '1' in literal null (expecting 'l')"},
		{`fals`, 4, "unexpected end of JSON input in literal false (expecting 'e')"},
		{`x`, 0, "invalid character 'x' looking for beginning of value"},
		{``, 0, "unexpected end of JSON input looking for beginning of value"},
		{"\xff", 0, "invalid byte 0xff looking for beginning of value"},
		{`{"a" 1}`, 5, "invalid character '1' after object key"},
		{`{1:2}`, 1, "invalid character '1' looking for beginning of object key string"},
		{`{"a":1 "b"}`, 7, `invalid character '"' after object key:value pair`},
		{`{"a":1,}`, 7, "invalid character '}' looking for beginning of object key string"},
		{`[1 2]`, 3, "invalid character '2' after array element"},
		{`[1,]`, 3, "invalid character ']' looking for beginning of value"},
		{`[1`, 2, "unexpected end of JSON input after array element"},
		{`[[[[1]]]]`, 3, "exceeded max depth of 3"},
		{`{"a":{"b":{"c":{}}}}`, 15, "exceeded max depth of 3"},
		{`1 2`, 2, "invalid character '2' after top-level value"},
	} {
		err := document([]byte(tt.doc), 3)
		var e *Error
		if !errors.As(err, &e) || e.Off != tt.off || e.Msg != tt.msg {
			t.Errorf("%q: %v; want %q at %d", tt.doc, err, tt.msg, tt.off)
		}
	}
}

// TestSkipValid: valid documents pass, to the depth limit exactly.
func TestSkipValid(t *testing.T) {
	for _, doc := range []string{
		`0`, `-0`, `1e400`, `-1.5E-3`, `true`, ` null `, `""`, `"\ud800"`, `{}`, `[]`,
		`{"a":[1,{"b":null}],"c":"\u00e9\n"}`, strings.Repeat("[", 3) + strings.Repeat("]", 3),
	} {
		if err := document([]byte(doc), 3); err != nil {
			t.Errorf("%q: %v", doc, err)
		}
	}
	deep := strings.Repeat(`[{"k":`, 100) + "1" + strings.Repeat("}]", 100)
	if err := document([]byte(deep), 200); err != nil {
		t.Errorf("200 levels: %v", err)
	}
	if err := document([]byte(deep), 199); err == nil {
		t.Error("200 levels under a limit of 199: no error")
	}
}

// TestAppendString: escapes, surrogate pairs and what encoding/json
// replaces with U+FFFD.
func TestAppendString(t *testing.T) {
	for _, tt := range []struct {
		doc, want string
		exact     bool
	}{
		{`"plain"`, "plain", true},
		{`"caf\u00e9 \"q\" \\ \/ \b\f\n\r\t"`, "café \"q\" \\ / \b\f\n\r\t", true},
		{`"\ud83d\ude00"`, "😀", true},
		{`"\uD83D\uDE00x"`, "😀x", true},
		{`"\ud800"`, "\ufffd", false},
		{`"\ud800\u0041"`, "\ufffdA", false},
		{`"\udc00\ud800"`, "\ufffd\ufffd", false},
		{`"\ud800\ud800\udc00"`, "\ufffd\U00010000", false},
		{`"\ud800\n"`, "\ufffd\n", false},
		{"\"a\xffb\"", "a\ufffdb", false},
		{"\"\xe2\x82\\n\"", "\ufffd\ufffd\n", false},
		{`"\ufffd"`, "\ufffd", true},
		{`"é"`, "é", true},
	} {
		b := []byte(tt.doc)
		s, end, err := ReadString(b, 0)
		if err != nil || end != len(b) {
			t.Fatalf("%q: end %d, %v", tt.doc, end, err)
		}
		got, exact := AppendStringStrict([]byte("pre"), b, s)
		if string(got) != "pre"+tt.want || exact != tt.exact {
			t.Errorf("%q: %q exact %v; want %q exact %v", tt.doc, got[3:], exact, tt.want, tt.exact)
		}
	}
}

// TestUint: the token-id fast path.
func TestUint(t *testing.T) {
	for _, tt := range []struct {
		in  string
		v   uint64
		end int
		ok  bool
	}{
		{"0", 0, 1, true}, {"7,", 7, 1, true}, {"01", 0, 2, false}, {"", 0, 0, false}, {"-1", 0, 0, false},
		{"123abc", 123, 3, true}, {"18446744073709551615", 1<<64 - 1, 20, true},
		{"18446744073709551616", 0, 20, false}, {"99999999999999999999", 0, 20, false},
	} {
		v, end, ok := Uint([]byte(tt.in), 0)
		if v != tt.v || end != tt.end || ok != tt.ok {
			t.Errorf("Uint(%q) = %d %d %v; want %d %d %v", tt.in, v, end, ok, tt.v, tt.end, tt.ok)
		}
	}
	for in, want := range map[string]bool{"0": true, "-0": true, "-9223372036854775808": true, "9223372036854775808": false, "1.0": false, "1e2": false} {
		if _, ok := ParseInt64([]byte(in)); ok != want {
			t.Errorf("ParseInt64(%q) ok %v", in, ok)
		}
	}
}

// TestPlainEnd: the no-escape ASCII fast path agrees with ReadString.
func TestPlainEnd(t *testing.T) {
	for _, text := range []string{`abc"`, `ab\"c"`, "a\x01\"", "é\"", `abc`, strings.Repeat("x", 70) + `"`} {
		b := []byte(`"` + text)
		end, ok := PlainEnd(b, 1)
		s, next, err := ReadString(b, 0)
		want := err == nil && !s.Escaped && s.ASCII
		if ok != want || ok && (end != s.End || next != end+1) {
			t.Errorf("%q: PlainEnd %d %v; ReadString %+v %d %v", text, end, ok, s, next, err)
		}
	}
}
