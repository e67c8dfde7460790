package tokenizer

import (
	"reflect"
	"runtime"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/testutil/gcscan"
)

func TestVocabTable(t *testing.T) {
	// "ab" and "ba" share id 2: both map to it, and it maps back to the
	// smaller. Ids 4 and 5 have no token.
	vt := newVocabTable(map[string]int64{"a": 0, "b": 1, "ab": 2, "ba": 2, "héllo": 3, "x": 6})
	for _, c := range []struct {
		tok  string
		id   int32
		want bool
	}{
		{"a", 0, true}, {"b", 1, true}, {"ab", 2, true}, {"ba", 2, true}, {"héllo", 3, true}, {"x", 6, true},
		{"", 0, false}, {"c", 0, false}, {"abc", 0, false}, {"héll", 0, false}, {"A", 0, false},
	} {
		id, ok := vt.get(c.tok)
		if ok != c.want || (ok && id != c.id) {
			t.Errorf("get(%q) = %d, %v; want %d, %v", c.tok, id, ok, c.id, c.want)
		}
		idb, okb := vt.getBytes([]byte(c.tok))
		if idb != id || okb != ok {
			t.Errorf("getBytes(%q) = %d, %v; get says %d, %v", c.tok, idb, okb, id, ok)
		}
	}
	for id, want := range []string{"a", "b", "ab", "héllo", "", "", "x", ""} {
		if got := vt.idToken(id); got != want {
			t.Errorf("idToken(%d) = %q, want %q", id, got, want)
		}
	}
	if vt.idToken(-1) != "" || vt.ids() != 7 {
		t.Errorf("idToken(-1) = %q, ids() = %d", vt.idToken(-1), vt.ids())
	}
	seen := map[string]int32{}
	for tok, id := range vt.all() {
		seen[tok] = id
	}
	if want := map[string]int32{"a": 0, "b": 1, "ab": 2, "ba": 2, "héllo": 3, "x": 6}; !reflect.DeepEqual(seen, want) {
		t.Errorf("all() = %v, want %v", seen, want)
	}
	for range vt.all() {
		break // stopping early must not panic
	}
}

func TestVocabTableEmptyAndEmptyToken(t *testing.T) {
	empty := newVocabTable(nil)
	if _, ok := empty.get("a"); ok || empty.ids() != 0 || empty.idToken(0) != "" {
		t.Errorf("empty table: %+v", empty)
	}
	// An empty string is a token a malformed file may hold: it has its
	// id, and the id reads back as no token, as before the table.
	vt := newVocabTable(map[string]int64{"": 0, "a": 1})
	if id, ok := vt.get(""); !ok || id != 0 {
		t.Errorf(`get("") = %d, %v`, id, ok)
	}
	if vt.idToken(0) != "" || vt.idToken(1) != "a" {
		t.Errorf("idToken: %q %q", vt.idToken(0), vt.idToken(1))
	}
}

// TestVocabTableHoldsNoPointers: the vocabulary's slices hold no Go
// pointers, so the garbage collector does not scan them (see vocabTable).
func TestVocabTableHoldsNoPointers(t *testing.T) {
	typ := reflect.TypeOf(vocabTable{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() != reflect.Slice {
			continue
		}
		if p := gcscan.PointerIn(f.Type.Elem()); p != "" {
			t.Errorf("vocabTable.%s holds a pointer: %s", f.Name, p)
		}
	}
}

// BenchmarkTokenizerGC is the CPU one garbage collection costs with a
// real tokenizer loaded (its word cache empty), beside the benchmark's
// own small heap: a cost every collection of a gateway with a local
// tokenizer pays.
func BenchmarkTokenizerGC(b *testing.B) {
	for _, name := range []string{"qwen3", "llama3_1"} {
		b.Run(name, func(b *testing.B) {
			tk := loadReal(b, name)
			gcscan.ReportCycleCost(b)
			runtime.KeepAlive(tk)
		})
	}
}
