package chattemplate

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// jsonDecodeCases are documents DecodeJSON and encoding/json must read
// alike; the invalid ones must fail in both.
var jsonDecodeCases = []string{
	`{"b": 1, "a": [true, false, null], "b": 2}`,
	`[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/ \b\f\n\r\t"}]`,
	`"lone \ud800 high, lone \udc00 low, pair after lone \ud800\ud83d\ude00"`,
	"\"invalid \xff utf-8 \xe2\x82 cut\"",
	`[0, -0, 1.5, -2e10, 3E+2, 4e-3, 12345678901234567890123]`,
	` {"deep": [[[{"x": {}}]]], "empty": [], "o": {}} `,
	`[1, 2,]`, `{"a" 1}`, `{"a": 1,}`, `[01]`, `[1.]`, `[.5]`, `[1e]`, `[-]`, `["\x"]`, `["\u12"]`,
	"[\"tab\tinside\"]", `[1] [2]`, `tru`, `nul`, ``, `   `, `{`, `["abc`, `[NaN]`, `[Infinity]`, `{1: 2}`,
}

func TestDecodeJSONMatchesEncodingJSON(t *testing.T) {
	for _, doc := range jsonDecodeCases {
		checkDecodeAgainstReference(t, []byte(doc))
	}
}

// checkDecodeAgainstReference holds DecodeJSON to encoding/json: a valid
// document decodes to the same value, an invalid one is an error.
func checkDecodeAgainstReference(t *testing.T, doc []byte) {
	t.Helper()
	got, err := DecodeJSON(doc)
	if !json.Valid(doc) {
		if err == nil {
			t.Fatalf("DecodeJSON(%q) = %v, want an error (invalid JSON)", doc, got)
		}
		return
	}
	want, refErr := referenceDecodeJSON(doc)
	if (err != nil) != (refErr != nil) {
		t.Fatalf("DecodeJSON(%q): error %v, encoding/json's %v", doc, err, refErr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("DecodeJSON(%q)\n got %#v\nwant %#v", doc, got, want)
	}
}

func TestDecodeJSONDepthLimit(t *testing.T) {
	deep := strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2)
	if _, err := DecodeJSON([]byte(deep)); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Fatalf("got %v, want the depth error", err)
	}
}

// FuzzDecodeJSON: for any bytes, DecodeJSON agrees with encoding/json
// (the reference decoder it replaced) and never panics.
func FuzzDecodeJSON(f *testing.F) {
	for _, doc := range jsonDecodeCases {
		f.Add([]byte(doc))
	}
	f.Fuzz(checkDecodeAgainstReference)
}
