package chattemplate

import (
	"math"
	"testing"
)

// The expectations below are CPython 3.11's repr and json.dumps output.

func TestPyFloatRepr(t *testing.T) {
	cases := []struct {
		f    float64
		want string
	}{
		{1.0, "1.0"}, {0.0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1.5, "1.5"}, {0.1, "0.1"},
		{1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {123456789.5, "123456789.5"},
		{1234567.0, "1234567.0"}, {1e-4, "0.0001"}, {1e-5, "1e-05"}, {1.5e-7, "1.5e-07"},
		{1e22, "1e+22"}, {2.5e-300, "2.5e-300"}, {5e-324, "5e-324"},
		{1.7976931348623157e308, "1.7976931348623157e+308"}, {-2.5, "-2.5"}, {100.0, "100.0"},
		{0.30000000000000004, "0.30000000000000004"}, {12345678901234567.0, "1.2345678901234568e+16"},
	}
	for _, c := range cases {
		if got := pyFloatRepr(c.f); got != c.want {
			t.Errorf("pyFloatRepr(%v) = %q, want %q", c.f, got, c.want)
		}
	}
	for f, want := range map[float64]string{math.Inf(1): "Infinity", math.Inf(-1): "-Infinity"} {
		if got := pyJSONFloat(f); got != want {
			t.Errorf("pyJSONFloat(%v) = %q, want %q", f, got, want)
		}
	}
	if got := pyJSONFloat(math.NaN()); got != "NaN" {
		t.Errorf("pyJSONFloat(NaN) = %q", got)
	}
}

// TestTojsonFilter runs transformers' tojson through a template, so the
// source rewrite that routes |tojson to it is covered too.
func TestTojsonFilter(t *testing.T) {
	const doc = `{"a": [1, {"b": null}], "c": {}, "d": [], "f": 1.0}`
	cases := []struct{ tmpl, want string }{
		{`{{ v|tojson }}`, `{"a": [1, {"b": null}], "c": {}, "d": [], "f": 1.0}`},
		{`{{ v|tojson(indent=2) }}`, "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {},\n  \"d\": [],\n  \"f\": 1.0\n}"},
		{`{{ v.a|tojson(indent=0) }}`, "[\n1,\n{\n\"b\": null\n}\n]"},
		{`{{ v.a|tojson(indent='\t') }}`, "[\n\t1,\n\t{\n\t\t\"b\": null\n\t}\n]"},
		{`{{ v|tojson(separators=(',', ':'), sort_keys=true) }}`, `{"a":[1,{"b":null}],"c":{},"d":[],"f":1.0}`},
		{`{{ s|tojson }}`, "\"é\u2028\x7f\\u0001\\u001f\\\"\\\\\\b\\f\\n\\r\\t🚀\""},
		{`{{ s|tojson(ensure_ascii=true) }}`, `"\u00e9\u2028\u007f\u0001\u001f\"\\\b\f\n\r\t\ud83d\ude80"`},
		{`{{ {'z': 1, 'a': 2} | tojson }}`, `{"z": 1, "a": 2}`},
		{`{{ [true, false, none, 'x<&>'] | tojson }}`, `[true, false, null, "x<&>"]`},
	}
	v, err := DecodeJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		tmpl, err := Parse(c.tmpl)
		if err != nil {
			t.Fatalf("%s: %v", c.tmpl, err)
		}
		got, err := tmpl.Render(Input{Kwargs: map[string]any{"v": v, "s": "é\u2028\x7f\x01\x1f\"\\\b\f\n\r\t🚀"}})
		if err != nil {
			t.Fatalf("%s: %v", c.tmpl, err)
		}
		if got != c.want {
			t.Errorf("%s\n got %q\nwant %q", c.tmpl, got, c.want)
		}
	}
}

func TestTojsonErrors(t *testing.T) {
	for _, src := range []string{
		`{{ missing|tojson }}`,
		`{{ 1|tojson(indent=[1]) }}`,
		`{{ 1|tojson(separators='x') }}`,
		`{{ 1|tojson(bogus=1) }}`,
		`{{ 1|tojson(1, 2, 3, 4, 5) }}`,
		`{{ raise_exception|tojson }}`,
	} {
		tmpl, err := Parse(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if out, err := tmpl.Render(Input{}); err == nil {
			t.Errorf("%s rendered %q, want an error", src, out)
		}
	}
}
