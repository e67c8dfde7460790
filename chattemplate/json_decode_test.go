package chattemplate

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unsafe"
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
	shared, sharedErr := DecodeJSONShared(doc)
	if (sharedErr != nil) != (err != nil) || !reflect.DeepEqual(shared, got) {
		t.Fatalf("DecodeJSONShared(%q) = %#v, %v; DecodeJSON gave %#v, %v", doc, shared, sharedErr, got, err)
	}
	// An arena with bytes of an earlier use, and room for less than the
	// document, so that it must grow while strings point into it.
	arena := append(make([]byte, 0, 8), "earlier"...)
	inArena, arenaErr := DecodeJSONArena(doc, &arena)
	if (arenaErr != nil) != (err != nil) || !reflect.DeepEqual(inArena, got) {
		t.Fatalf("DecodeJSONArena(%q) = %#v, %v; DecodeJSON gave %#v, %v", doc, inArena, arenaErr, got, err)
	}
	if string(arena[:7]) != "earlier" {
		t.Fatalf("DecodeJSONArena(%q) overwrote the arena's bytes: %q", doc, arena[:7])
	}
}

// TestDecodeJSONArenaViews: the strings DecodeJSONArena had to decode are
// views of the arena, one after another, and plain ones of the document;
// an arena with room for them all is not reallocated.
func TestDecodeJSONArenaViews(t *testing.T) {
	long := strings.Repeat("words and more words ", 100)
	doc := []byte(`[{"content":"` + long + `"},"caf\u00e9","line\nbreak","résumé"]`)
	arena := make([]byte, 0, len(doc))
	base := unsafe.SliceData(arena)
	v, err := DecodeJSONArena(doc, &arena)
	if err != nil {
		t.Fatal(err)
	}
	within := func(s string, b []byte) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		return p >= lo && p < lo+uintptr(cap(b))
	}
	list := v.([]any)
	if c := list[0].(Object).Values["content"].(string); c != long || !within(c, doc) {
		t.Fatalf("plain content: equal %v, a view of the document %v", c == long, within(c, doc))
	}
	want := []string{"café", "line\nbreak", "résumé"}
	if unsafe.SliceData(arena) != base || string(arena) != strings.Join(want, "") {
		t.Fatalf("arena %q (reallocated: %v), want the decoded strings in order", arena, unsafe.SliceData(arena) != base)
	}
	for i, x := range list[1:] {
		if s := x.(string); s != want[i] || !within(s, arena) {
			t.Fatalf("string %d: %q (want %q), a view of the arena %v", i, s, want[i], within(s, arena))
		}
	}
}

// TestDecodeJSONSharedViews: the shared decoder's plain strings point into
// the document, and strings it had to decode do not.
func TestDecodeJSONSharedViews(t *testing.T) {
	long := strings.Repeat("words and more words ", 100)
	doc := []byte(`[{"content":"` + long + `"},"caf\u00e9","tab\there"]`)
	v, err := DecodeJSONShared(doc)
	if err != nil {
		t.Fatal(err)
	}
	list := v.([]any)
	content := list[0].(Object).Values["content"].(string)
	inside := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(doc)))
		return p >= lo && p < lo+uintptr(len(doc))
	}
	if content != long || !inside(content) {
		t.Fatalf("content: equal %v, a view of the document %v", content == long, inside(content))
	}
	for _, x := range list[1:] {
		if s := x.(string); inside(s) {
			t.Fatalf("%q, which needed decoding, points into the document", s)
		}
	}
	plain, _ := DecodeJSON(doc)
	if inside(plain.([]any)[0].(Object).Values["content"].(string)) {
		t.Fatal("DecodeJSON returned a view of the document")
	}
}

// TestPlainRun: the eight-byte check finds a control character, a high
// byte or a backslash at any position, which the byte loop then handles.
func TestPlainRun(t *testing.T) {
	for n := 0; n <= 40; n++ {
		base := []byte(strings.Repeat("a", n) + `"`)
		if end, ok := plainRun(base, 0); !ok || end != n {
			t.Fatalf("%d plain bytes: end %d ok %v", n, end, ok)
		}
		for i := 0; i < n; i++ {
			for _, c := range []byte{0x00, 0x1F, '\\', 0x7F + 1, 0xFF} {
				b := append([]byte(nil), base...)
				b[i] = c
				if _, ok := plainRun(b, 0); ok {
					t.Fatalf("byte %#x at %d of %d taken as plain", c, i, n)
				}
			}
		}
	}
	if _, ok := plainRun([]byte("no quote"), 0); ok {
		t.Fatal("a string with no closing quote taken as plain")
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
