package jsonlex

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// decodeAny decodes the value at b[i] into what encoding/json's Decoder
// with UseNumber makes of it, from the lexer's tokens alone: the oracle
// compares the two.
func decodeAny(b []byte, i int) (any, int, error) {
	i = SkipSpace(b, i)
	switch {
	case i < len(b) && b[i] == '{':
		obj := map[string]any{}
		if i = SkipSpace(b, i+1); i < len(b) && b[i] == '}' {
			return obj, i + 1, nil
		}
		for {
			k, j, err := Key(b, i)
			if err != nil {
				return nil, j, err
			}
			v, j, err := decodeAny(b, j)
			if err != nil {
				return nil, j, err
			}
			obj[string(AppendString(nil, b, k))] = v
			if i, err = next(b, j, '}'); err != nil || b[i-1] == '}' {
				return obj, i, err
			}
		}
	case i < len(b) && b[i] == '[':
		arr := []any{}
		if i = SkipSpace(b, i+1); i < len(b) && b[i] == ']' {
			return arr, i + 1, nil
		}
		for {
			v, j, err := decodeAny(b, i)
			if err != nil {
				return nil, j, err
			}
			arr = append(arr, v)
			if i, err = next(b, j, ']'); err != nil || b[i-1] == ']' {
				return arr, i, err
			}
		}
	}
	return decodeScalar(b, i)
}

// next steps over the comma or closing byte after a member.
func next(b []byte, i int, closing byte) (int, error) {
	if i = SkipSpace(b, i); i < len(b) && (b[i] == ',' || b[i] == closing) {
		return i + 1, nil
	}
	return i, Unexpected(b, i, "after a member")
}

func decodeScalar(b []byte, i int) (any, int, error) {
	switch {
	case i < len(b) && b[i] == '"':
		s, end, err := ReadString(b, i)
		dec, ds, dend, derr := DecodeString([]byte("pre"), b, i)
		if ds != s || dend != end || (derr == nil) != (err == nil) || derr != nil && derr.Error() != err.Error() {
			panic(fmt.Sprintf("%q: DecodeString %+v %d %v; ReadString %+v %d %v", b[i:], ds, dend, derr, s, end, err))
		}
		if err != nil {
			return nil, end, err
		}
		v := AppendString(nil, b, s)
		if string(dec) != "pre"+string(v) {
			panic(fmt.Sprintf("%q: DecodeString %q, AppendString %q", b[i:], dec, v))
		}
		return string(v), end, nil
	case i < len(b) && (b[i] == '-' || isDigit(b[i])):
		end, _, err := Number(b, i)
		return json.Number(b[i:end]), end, err
	}
	end, err := Literal(b, i)
	if err != nil {
		return nil, end, err
	}
	return map[byte]any{'t': true, 'f': false, 'n': nil}[b[i]], end, nil
}

// FuzzLexer holds the lexer to encoding/json: the same documents are
// valid (Skip, and decodeAny on documents shallow enough for its
// recursion), they decode to the same values, strings included (the
// lexer keeps invalid UTF-8 as encoding/json does and decodes it to
// U+FFFD alike), and numbers parse alike. DecodeString is held to
// ReadString and AppendString, errors included.
func FuzzLexer(f *testing.F) {
	for _, s := range []string{
		`"\ud83d\ude00"`, `"\ud800"`, `"\udc00\ud800x"`, `"\ud800\ud800\udc00"`, `"\ud800\u"`,
		`"abc\`, `"abc\u00`, `"\u00e9"`, "\"\xff\xe2\x82\"", "\"a\tb\"", `"\/\b\f\n\r\t\"\\"`,
		`-0`, `1e400`, `-1e400`, `01`, `-01`, `1.`, `.5`, `1e`, `1E+2`, `123456789012345678901234567890`,
		`9223372036854775808`, `-9223372036854775809`, `[1,2,]`, `{"a":1,"a":2}`, `{"a" 1}`,
		strings.Repeat("[", 200) + strings.Repeat("]", 200), strings.Repeat(`{"a":`, 50) + "1" + strings.Repeat("}", 50),
		`tru`, `nul`, `null `, ` true`, `[true,false,null]`, strings.Repeat("a", 40) + `"`, `"` + strings.Repeat("é", 20) + `\n"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 0 && b[0] == '"' {
			decodeScalar(b, 0) // DecodeString agrees with ReadString, valid or not
		}
		valid := document(b, 10000) == nil
		if valid != json.Valid(b) {
			t.Fatalf("%q: lexer valid %v, json.Valid %v", b, valid, !valid)
		}
		if !valid || bytes.Count(b, []byte("["))+bytes.Count(b, []byte("{")) > 500 {
			return
		}
		got, end, err := decodeAny(b, 0)
		if err != nil || SkipSpace(b, end) != len(b) {
			t.Fatalf("%q: valid, but decodeAny stops at %d: %v", b, end, err)
		}
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var want any
		if err := d.Decode(&want); err != nil {
			t.Fatalf("%q: encoding/json: %v", b, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n got %#v\nwant %#v", b, got, want)
		}
		checkScalar(t, b)
	})
}

// checkScalar compares a top-level string's exactness and a top-level
// number's parses with encoding/json's.
func checkScalar(t *testing.T, b []byte) {
	i := SkipSpace(b, 0)
	switch {
	case b[i] == '"':
		s, _, _ := ReadString(b, i)
		if _, exact := AppendStringStrict(nil, b, s); exact && !utf8.Valid(b[s.Start:s.End]) {
			t.Fatalf("%q: invalid UTF-8 taken as exact", b)
		}
	case b[i] == '-' || isDigit(b[i]):
		end, integer, _ := Number(b, i)
		num := b[i:end]
		var f float64
		ferr := json.Unmarshal(num, &f)
		g, gerr := ParseFloat(num)
		if (ferr == nil) != (gerr == nil) || ferr == nil && f != g {
			t.Fatalf("%q: ParseFloat %v %v; encoding/json %v %v", num, g, gerr, f, ferr)
		}
		var n int64
		nerr := json.Unmarshal(num, &n)
		m, ok := ParseInt64(num)
		if ok != (nerr == nil) || ok && m != n {
			t.Fatalf("%q: ParseInt64 %d %v; encoding/json %d %v", num, m, ok, n, nerr)
		}
		if integer != !bytes.ContainsAny(num, ".eE") {
			t.Fatalf("%q: integer %v", num, integer)
		}
		if u, e, ok := Uint(num, 0); ok && e == len(num) && strconv.FormatUint(u, 10) != string(num) {
			t.Fatalf("%q: Uint %d", num, u)
		}
	}
}
