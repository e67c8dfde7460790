package remotetok

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
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
		a, err := tk.TokenizeDerived(ctx, f.url(), nil, req, "double", double)
		toks, derived, cached := a.Tokens, a.Derived, a.Cached
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
	if a, _ := tk.TokenizeDerived(ctx, f.url(), nil, req, "one", func(toks []uint64) []uint64 { return toks[:1] }); len(a.Derived) != 1 {
		t.Fatalf("another tag: %v", a.Derived)
	}
	if n, st := tk.derivations.Load(), tk.Stats(); n != 2 || st.CachedBytes != int64(st.CachedTokens)*8+8+TokenizeCacheEntryOverhead {
		t.Fatalf("another tag: derived %d times, %d bytes counted", n, st.CachedBytes)
	}

	off := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, CacheEntries: -1})
	defer off.Close()
	for range 2 {
		if _, err := off.TokenizeDerived(ctx, f.url(), nil, req, "double", double); err != nil {
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
		if a, err := tk.TokenizeDerived(context.Background(), f.url(), nil, req, tag, first); err != nil || len(a.Derived) != 1 {
			t.Fatalf("%v %v", a.Derived, err)
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
	if a, err := tk.TokenizeDerived(ctx, f.url(), nil, req, "double", refill); err != nil || !equalTokens(a.Derived, double(a.Tokens)) {
		t.Fatalf("first call: %v %v %v", a.Tokens, a.Derived, err)
	}
	a, err := tk.TokenizeDerived(ctx, f.url(), nil, req, "double", double)
	toks, d, cached := a.Tokens, a.Derived, a.Cached
	if err != nil || !cached || !equalTokens(toks, []uint64{7, 7, 7}) || !equalTokens(d, double(toks)) {
		t.Fatalf("after the refill: ids %v, value %v (cached %v, %v), want the value of those ids", toks, d, cached, err)
	}
}

// TestTokenizeDerivedOwnership: the ids of a call nobody shares are the
// caller's, in a buffer Release recycles; ids the cache keeps or other
// callers joined for are never that buffer, so recycling it and decoding
// other answers there leaves them intact.
func TestTokenizeDerivedOwnership(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
	defer tk.Close()
	ctx := context.Background()
	keys := func(toks []uint64) []uint64 { return []uint64{uint64(len(toks))} }
	prompt := func(s string) TokenizeRequest { return TokenizeRequest{Prompt: json.RawMessage(strconv.Quote(s))} }
	long := strings.Repeat("p", 2*cacheFromSecondIDs)
	call := func(text string) DerivedAnswer {
		t.Helper()
		a, err := tk.TokenizeDerived(ctx, f.url(), nil, prompt(text), "n", keys)
		if err != nil || !equalTokens(a.Tokens, expectTokens(text)) {
			t.Fatalf("%.10q…: %d ids, %v", text, len(a.Tokens), err)
		}
		return a
	}
	first := call(long) // first sighting: not cached, so the caller's own
	if first.buf == nil || first.Cached {
		t.Fatalf("first call: owned %v, cached %v; want an owned answer", first.buf != nil, first.Cached)
	}
	first.Release()
	first.Release()    // a second Release does nothing
	kept := call(long) // second sighting: the cache keeps the ids
	if kept.buf != nil {
		t.Fatal("ids the cache keeps were handed out as the caller's own")
	}
	kept.Release()
	for i := range 4 { // other answers decoded into recycled buffers
		other := call(strings.Repeat(string(rune('a'+i)), 2*cacheFromSecondIDs))
		other.Release()
	}
	if hit := call(long); !hit.Cached || !equalTokens(hit.Tokens, expectTokens(long)) {
		t.Fatalf("cache hit after buffers were reused: cached %v, ids changed %v", hit.Cached, !equalTokens(hit.Tokens, expectTokens(long)))
	}

	// Callers that joined a call in flight share its ids: the leader's
	// are a copy, not its buffer.
	f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 1)
	text := strings.Repeat("s", 2*cacheFromSecondIDs)
	var leader, follower DerivedAnswer
	done := make(chan struct{})
	go func() {
		defer close(done)
		leader, _ = tk.TokenizeDerived(ctx, f.url(), nil, prompt(text), "n", keys)
	}()
	<-f.arrived
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		follower, _ = tk.TokenizeDerived(ctx, f.url(), nil, prompt(text), "n", keys)
	}()
	testwait.For(t, 15*time.Second, "follower joined", func() bool { return tk.Stats().Shared == 1 })
	close(f.gate)
	<-done
	<-followed
	if leader.buf != nil || follower.buf != nil {
		t.Fatalf("a shared call's ids were handed out as a caller's own (leader %v, follower %v)", leader.buf != nil, follower.buf != nil)
	}
	if !equalTokens(leader.Tokens, expectTokens(text)) || !equalTokens(follower.Tokens, expectTokens(text)) {
		t.Fatal("shared call: wrong ids")
	}
}

// TestTokenizeResumeKeepsACopy: an array kept for resuming holds its own
// ids, not the buffer the answer was decoded into, which its caller
// reuses.
func TestTokenizeResumeKeepsACopy(t *testing.T) {
	r := newTokenResume()
	ids := make([]uint64, 4096)
	for i := range ids {
		ids[i] = uint64(1000 + i)
	}
	answer, err := json.Marshal(map[string]any{"count": len(ids), "max_model_len": 32768, "tokens": ids})
	if err != nil {
		t.Fatal(err)
	}
	var buf []uint64
	for range 2 { // kept from its key's second sighting
		if _, err := decodeTokenizeInto(answer, DefaultMaxTokenizeTokens, r, &buf); err != nil {
			t.Fatal(err)
		}
	}
	for i := range buf[:cap(buf)] {
		buf[:cap(buf)][i] = 7 // the caller reuses its buffer
	}
	got, err := decodeTokenizeResponse(answer, DefaultMaxTokenizeTokens)
	if err != nil {
		t.Fatal(err)
	}
	resumed, err := decodeTokenizeResume(answer, DefaultMaxTokenizeTokens, r)
	if err != nil || !equalTokens(resumed, got) || !equalTokens(got, ids) {
		t.Fatalf("resumed from a kept array after its buffer was reused: %v", err)
	}
	if ids, _, _ := r.lookup(answer[bytes.IndexByte(answer, '['):]); len(ids) == 0 {
		t.Fatal("the array was not kept: the test checks nothing")
	}
}

// TestTokenizeDerivedConcurrentReuse: callers that share prompts (some
// joining calls in flight, some answered from the cache, some owning and
// recycling their buffers) each see exactly their prompt's ids until they
// release them. It exercises the mix under the race detector, which sees
// a buffer decoded into while another caller still reads it; which answers
// are shared is checked exactly by TestTokenizeDerivedOwnership.
func TestTokenizeDerivedConcurrentReuse(t *testing.T) {
	f := &fakeTokenizer{}
	// A moment per answer, so that identical requests overlap and join
	// each other's calls.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond)
		f.serve(w, r)
	}))
	defer srv.Close()
	url := srv.URL + "/tokenize"
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, MaxConcurrent: 64})
	defer tk.Close()
	ctx := context.Background()
	texts := make([]string, 6)
	for i := range texts {
		texts[i] = strings.Repeat(string(rune('k'+i)), cacheFromSecondIDs+100*i)
	}
	concurrently(t, 8, func(g int) error {
		for i := range 150 {
			text := texts[(g+i)%len(texts)]
			if i%7 == 0 { // a prompt nobody else sends: always owned
				text = fmt.Sprintf("%s-%d-%d", text, g, i)
			}
			req := TokenizeRequest{Prompt: json.RawMessage(strconv.Quote(text))}
			a, err := tk.TokenizeDerived(ctx, url, nil, req, "n", func(toks []uint64) []uint64 { return []uint64{uint64(len(toks))} })
			if err == nil && (!equalTokens(a.Tokens, expectTokens(text)) || len(a.Derived) != 1 || a.Derived[0] != uint64(len(text))) {
				err = fmt.Errorf("goroutine %d call %d: ids or value of another prompt", g, i)
			}
			a.Release()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if st := tk.Stats(); st.Hits == 0 || st.Shared == 0 {
		t.Fatalf("no cache hit or no joined call: the test did not mix shared and owned answers (%+v)", st)
	}
}
