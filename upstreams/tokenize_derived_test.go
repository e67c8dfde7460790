package upstreams

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTokenizeDerived: the derived value is computed once per entry and
// tag, a hit returns it without deriving, another tag replaces it, its
// words are counted against the budget with the entry, and without a
// cache every call derives.
func TestTokenizeDerived(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
	defer tk.Close()
	ctx := context.Background()
	req := TokenizeRequest{Prompt: json.RawMessage(strconv.Quote("abcdefgh"))}
	double := func(toks []uint64) []uint64 { // cap > len on purpose
		out := make([]uint64, 0, 4*len(toks))
		for _, x := range toks {
			out = append(out, 2*x)
		}
		return out
	}
	for i := range 3 {
		toks, derived, cached, err := tk.TokenizeDerived(ctx, f.url(), nil, req, "double", double)
		if err != nil || cached != (i > 0) || len(derived) != len(toks) || derived[0] != 2*toks[0] {
			t.Fatalf("call %d: %v %v cached=%v %v", i, toks, derived, cached, err)
		}
	}
	if n := tk.derivations.Load(); n != 1 {
		t.Fatalf("derived %d times for one entry, want 1", n)
	}
	st := tk.Stats()
	if want := int64(st.CachedTokens)*8*2 + TokenizeCacheEntryOverhead; st.CachedBytes != want {
		t.Fatalf("%d bytes counted, want %d (ids, derived words clipped to their length, overhead)", st.CachedBytes, want)
	}
	if _, d, _, _ := tk.TokenizeDerived(ctx, f.url(), nil, req, "one", func(toks []uint64) []uint64 { return toks[:1] }); len(d) != 1 {
		t.Fatalf("another tag: %v", d)
	}
	if n, st := tk.derivations.Load(), tk.Stats(); n != 2 || st.CachedBytes != int64(st.CachedTokens)*8+8+TokenizeCacheEntryOverhead {
		t.Fatalf("another tag: derived %d times, %d bytes counted", n, st.CachedBytes)
	}

	off := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, CacheEntries: -1})
	defer off.Close()
	for range 2 {
		if _, _, _, err := off.TokenizeDerived(ctx, f.url(), nil, req, "double", double); err != nil {
			t.Fatal(err)
		}
	}
	if n := off.derivations.Load(); n != 2 {
		t.Fatalf("without a cache: derived %d times, want 2", n)
	}
}

// TestTokenizeDerivedLongTag: an entry does not keep its tag, which may
// hold client input (the fleet's holds cache_salt): after a call with an
// 8 MiB tag the cache holds no more than the budget formula counts, and
// the heap does not keep the tag.
func TestTokenizeDerivedLongTag(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
	defer tk.Close()
	req := TokenizeRequest{Prompt: json.RawMessage(strconv.Quote("abcdefgh"))}
	first := func(toks []uint64) []uint64 { return toks[:1:1] }
	const tagBytes = 8 << 20
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	func() {
		tag := strings.Repeat("s", tagBytes)
		if _, d, _, err := tk.TokenizeDerived(context.Background(), f.url(), nil, req, tag, first); err != nil || len(d) != 1 {
			t.Fatalf("%v %v", d, err)
		}
	}()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	if grew := int64(ms.HeapAlloc) - int64(before); grew > tagBytes/2 {
		t.Errorf("the heap kept %d bytes after a call with a %d-byte tag", grew, tagBytes)
	}
	st := tk.Stats()
	if want := int64(st.CachedTokens)*8 + 8 + TokenizeCacheEntryOverhead; st.Entries != 1 || st.CachedBytes != want {
		t.Errorf("%d entries, %d bytes counted, want 1 and %d", st.Entries, st.CachedBytes, want)
	}
	runtime.KeepAlive(tk)
}

// TestTokenizeDerivedRefilledEntry: when the entry is evicted and refilled
// with other ids while the value is derived (another engine, with another
// tokenizer, answered the refill), the value is not kept with ids it was
// not derived from: the next call derives it afresh from the new ids.
func TestTokenizeDerivedRefilledEntry(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, CacheEntries: 1})
	defer tk.Close()
	ctx := context.Background()
	req := TokenizeRequest{Prompt: json.RawMessage(strconv.Quote("abc"))}
	other := TokenizeRequest{Prompt: json.RawMessage(strconv.Quote("xyz"))}
	double := func(toks []uint64) []uint64 {
		out := make([]uint64, len(toks))
		for i, x := range toks {
			out[i] = 2 * x
		}
		return out
	}
	refill := func(toks []uint64) []uint64 {
		if _, _, err := tk.Tokenize(ctx, f.url(), nil, other); err != nil { // evicts req's entry
			t.Fatal(err)
		}
		f.mu.Lock()
		f.respond = func(w http.ResponseWriter) {
			_, _ = io.WriteString(w, `{"count":3,"max_model_len":8192,"tokens":[7,7,7]}`)
		}
		f.mu.Unlock()
		if got, _, err := tk.Tokenize(ctx, f.url(), nil, req); err != nil || !equalTokens(got, []uint64{7, 7, 7}) {
			t.Fatalf("refill: %v %v", got, err)
		}
		return double(toks)
	}
	if toks, d, _, err := tk.TokenizeDerived(ctx, f.url(), nil, req, "double", refill); err != nil || !equalTokens(d, double(toks)) {
		t.Fatalf("first call: %v %v %v", toks, d, err)
	}
	toks, d, cached, err := tk.TokenizeDerived(ctx, f.url(), nil, req, "double", double)
	if err != nil || !cached || !equalTokens(toks, []uint64{7, 7, 7}) || !equalTokens(d, double(toks)) {
		t.Fatalf("after the refill: ids %v, value %v (cached %v, %v), want the value of those ids", toks, d, cached, err)
	}
}
