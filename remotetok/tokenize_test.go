package remotetok

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// fakeTokenizer is a real HTTP /tokenize endpoint. Its token ids are the
// bytes of the prompt, or of the concatenated message contents, so results
// are checkable. respond, if set, overrides the response.
type fakeTokenizer struct {
	srv     *httptest.Server
	calls   atomic.Int64
	mu      sync.Mutex
	bodies  []map[string]json.RawMessage
	headers []http.Header
	gate    chan struct{} // if set, requests wait for it (or their cancellation)
	arrived chan struct{} // if set, receives one value per request
	respond func(w http.ResponseWriter)
}

func newFakeTokenizer(t *testing.T) *fakeTokenizer {
	f := &fakeTokenizer{}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// newCountingFakeTokenizer is newFakeTokenizer whose server counts its
// open connections in open.
func newCountingFakeTokenizer(t *testing.T, open *atomic.Int64) *fakeTokenizer {
	f := &fakeTokenizer{}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeTokenizer) url() string { return f.srv.URL + "/tokenize" }

func (f *fakeTokenizer) lastBody(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bodies) == 0 {
		t.Fatal("no request seen")
	}
	return f.bodies[len(f.bodies)-1]
}

func expectTokens(s string) []uint64 {
	out := []uint64{}
	for _, b := range []byte(s) {
		out = append(out, uint64(b))
	}
	return out
}

func (f *fakeTokenizer) serve(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	var body map[string]json.RawMessage
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&body) != nil {
		http.Error(w, `{"object":"error","message":"bad request"}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.headers = append(f.headers, r.Header.Clone())
	gate, arrived, respond := f.gate, f.arrived, f.respond
	f.mu.Unlock()
	if arrived != nil {
		arrived <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	if respond != nil {
		respond(w)
		return
	}
	var text string
	if p, ok := body["prompt"]; ok {
		_ = json.Unmarshal(p, &text)
	} else {
		var msgs []struct{ Content string }
		_ = json.Unmarshal(body["messages"], &msgs)
		for _, m := range msgs {
			text += m.Content
		}
	}
	toks := expectTokens(text)
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(toks), "max_model_len": 8192, "tokens": toks, "token_strs": nil})
}

func ptr[T any](v T) *T { return &v }

func equalTokens(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTokenizeForms(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
	defer tk.Close()
	ctx := context.Background()

	tests := []struct {
		name     string
		req      TokenizeRequest
		want     string
		wantKeys map[string]string // exact JSON of each field sent
	}{
		{
			name: "prompt form sends only prompt fields",
			req: TokenizeRequest{Model: "m", Prompt: json.RawMessage(`"hello"`), AddSpecialTokens: ptr(false),
				AddGenerationPrompt: ptr(true), ChatTemplate: "ignored", Tools: json.RawMessage(`[]`)},
			want:     "hello",
			wantKeys: map[string]string{"model": `"m"`, "prompt": `"hello"`, "add_special_tokens": "false"},
		},
		{
			name:     "prompt form, engine defaults",
			req:      TokenizeRequest{Prompt: json.RawMessage(`"abc"`)},
			want:     "abc",
			wantKeys: map[string]string{"prompt": `"abc"`},
		},
		{
			name: "chat form sends every set field, compacted",
			req: TokenizeRequest{Model: "m", Messages: json.RawMessage(`[ {"role":"system","content":"be brief"},
				{"role":"user","content":"hi"} ]`),
				AddGenerationPrompt: ptr(true), ContinueFinalMessage: ptr(false), AddSpecialTokens: ptr(false),
				ChatTemplate: "{{x}}", ChatTemplateKwargs: json.RawMessage(`{"enable_thinking": false}`),
				Tools: json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)},
			want: "be briefhi",
			wantKeys: map[string]string{
				"model": `"m"`, "messages": `[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`,
				"add_generation_prompt": "true", "continue_final_message": "false", "add_special_tokens": "false",
				"chat_template": `"{{x}}"`, "chat_template_kwargs": `{"enable_thinking":false}`,
				"tools": `[{"type":"function","function":{"name":"f"}}]`,
			},
		},
		{
			name:     "chat form, defaults omitted",
			req:      TokenizeRequest{Messages: json.RawMessage(`[{"role":"user","content":"yo"}]`)},
			want:     "yo",
			wantKeys: map[string]string{"messages": `[{"role":"user","content":"yo"}]`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			toks, cached, err := tk.Tokenize(ctx, f.url(), nil, tc.req)
			if err != nil || cached {
				t.Fatalf("Tokenize: %v cached=%v", err, cached)
			}
			if !equalTokens(toks, expectTokens(tc.want)) {
				t.Fatalf("tokens = %v", toks)
			}
			got := f.lastBody(t)
			if len(got) != len(tc.wantKeys) {
				t.Fatalf("sent fields %v, want %v", got, tc.wantKeys)
			}
			for k, v := range tc.wantKeys {
				if string(got[k]) != v {
					t.Fatalf("field %s = %s, want %s", k, got[k], v)
				}
			}
		})
	}
}

func TestTokenizeRejectsBadRequests(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
	defer tk.Close()
	for _, req := range []TokenizeRequest{
		{},
		{Prompt: json.RawMessage(`"a"`), Messages: json.RawMessage(`[]`)},
		{Prompt: json.RawMessage(`"unterminated`)},
		{Messages: json.RawMessage(`[{]`)},
		{Messages: json.RawMessage(`[]`), Tools: json.RawMessage(`{bad`)},
	} {
		if _, _, err := tk.Tokenize(context.Background(), f.url(), nil, req); err == nil {
			t.Errorf("Tokenize(%+v) succeeded", req)
		}
	}
	if f.calls.Load() != 0 {
		t.Fatalf("bad requests reached the engine %d times", f.calls.Load())
	}
}

func TestTokenizeCache(t *testing.T) {
	f := newFakeTokenizer(t)
	f2 := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
	defer tk.Close()
	ctx := context.Background()
	conv := TokenizeRequest{Model: "m", Messages: json.RawMessage(`[{"role":"system","content":"long system prompt"},{"role":"user","content":"q1"}]`)}
	h := http.Header{"Authorization": {"Bearer tk"}}

	if _, cached, err := tk.Tokenize(ctx, f.url(), h, conv); err != nil || cached {
		t.Fatalf("first: %v %v", err, cached)
	}
	// The same conversation through another replica: the key ignores the URL.
	same := conv
	same.Messages = append(json.RawMessage(nil), conv.Messages...)
	toks, cached, err := tk.Tokenize(ctx, f2.url(), nil, same)
	if err != nil || !cached || !equalTokens(toks, expectTokens("long system promptq1")) {
		t.Fatalf("repeat: %v %v %v", toks, cached, err)
	}
	if f.calls.Load() != 1 || f2.calls.Load() != 0 {
		t.Fatalf("calls %d/%d", f.calls.Load(), f2.calls.Load())
	}
	if got := f.headers[0].Get("Authorization"); got != "Bearer tk" {
		t.Fatalf("Authorization = %q", got)
	}
	// A chat-only field on a prompt request is not sent, so it shares the key.
	p1 := TokenizeRequest{Model: "m", Prompt: json.RawMessage(`"pp"`)}
	p2 := p1
	p2.Tools = json.RawMessage(`[1]`)
	_, _, _ = tk.Tokenize(ctx, f.url(), nil, p1)
	if _, cached, _ := tk.Tokenize(ctx, f.url(), nil, p2); !cached {
		t.Fatal("ignored field changed the key")
	}
	// Reformatted JSON is a different key (never a wrong hit), same tokens.
	ws := conv
	ws.Messages = json.RawMessage("[ {\"role\": \"system\", \"content\": \"long system prompt\"},\n {\"role\":\"user\",\"content\":\"q1\"} ]")
	toks, cached, err = tk.Tokenize(ctx, f.url(), nil, ws)
	if err != nil || cached || !equalTokens(toks, expectTokens("long system promptq1")) {
		t.Fatalf("reformatted: %v %v %v", toks, cached, err)
	}
	// Fields differing only in which field holds the bytes differ in key.
	k1 := TokenizeRequest{Messages: json.RawMessage(`[]`), Tools: json.RawMessage(`[1]`)}
	k2 := TokenizeRequest{Messages: json.RawMessage(`[]`), ChatTemplateKwargs: json.RawMessage(`[1]`)}
	w1, w2 := k1.wire(), k2.wire()
	if tk.key(&w1) == tk.key(&w2) {
		t.Fatal("field boundaries not part of the key")
	}
	// A different option is a different key.
	other := conv
	other.AddGenerationPrompt = ptr(false)
	if _, cached, _ := tk.Tokenize(ctx, f.url(), nil, other); cached {
		t.Fatal("different request hit the cache")
	}
	st := tk.Stats()
	if st.Hits != 2 || st.Misses != 4 || st.Errors != 0 || st.Entries != 4 || st.InFlight != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestTokenizeCacheKeepsLongResultsFromSecondSighting: a result of
// cacheFromSecondIDs ids or more is kept only when its request comes a
// second time, a shorter one at once (see cacheFromSecondIDs). What the
// caller gets is the same either way. TokenizeDerived keeps its value
// with the result, so the same holds for it.
func TestTokenizeCacheKeepsLongResultsFromSecondSighting(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
	defer tk.Close()
	ctx := context.Background()
	prompt := func(s string) TokenizeRequest { return TokenizeRequest{Prompt: json.RawMessage(strconv.Quote(s))} }
	for _, c := range []struct {
		name       string
		text       string // the fake's ids are its bytes
		wantCached []bool
		wantCalls  int64
	}{
		{"short", strings.Repeat("s", cacheFromSecondIDs-1), []bool{false, true, true}, 1},
		{"long", strings.Repeat("l", cacheFromSecondIDs), []bool{false, false, true, true}, 2},
	} {
		before := f.calls.Load()
		for i, want := range c.wantCached {
			toks, cached, err := tk.Tokenize(ctx, f.url(), nil, prompt(c.text))
			if err != nil || cached != want || !equalTokens(toks, expectTokens(c.text)) {
				t.Fatalf("%s, call %d: cached %v (want %v), %d ids, %v", c.name, i+1, cached, want, len(toks), err)
			}
		}
		if calls := f.calls.Load() - before; calls != c.wantCalls {
			t.Errorf("%s: %d calls to the engine, want %d", c.name, calls, c.wantCalls)
		}
	}
	text, derives := strings.Repeat("d", 2*cacheFromSecondIDs), 0
	derive := func(toks []uint64) []uint64 { derives++; return []uint64{uint64(len(toks))} }
	for i, want := range []bool{false, false, true} {
		a, err := tk.TokenizeDerived(ctx, f.url(), nil, prompt(text), "tag", derive)
		toks, derived, cached := a.Tokens, a.Derived, a.Cached
		if err != nil || cached != want || len(toks) != len(text) || len(derived) != 1 || derived[0] != uint64(len(text)) {
			t.Fatalf("derived, call %d: cached %v (want %v), %d ids, %v, %v", i+1, cached, want, len(toks), derived, err)
		}
	}
	if derives != 2 {
		t.Errorf("derived %d times, want 2 (once per call until the result was kept)", derives)
	}
}

// TestTokenizeFresh: a fresh call asks the engine every time, keeps
// nothing, does not answer from what Tokenize cached, and is bounded like
// the others.
func TestTokenizeFresh(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, MaxConcurrent: 1})
	defer tk.Close()
	ctx := context.Background()
	req := TokenizeRequest{Model: "m", Prompt: json.RawMessage(`"fresh"`)}
	if _, _, err := tk.Tokenize(ctx, f.url(), nil, req); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		toks, err := tk.TokenizeFresh(ctx, f.url(), nil, req)
		if err != nil || !equalTokens(toks, expectTokens("fresh")) {
			t.Fatalf("fresh call %d: %v %v", i, toks, err)
		}
	}
	if got := f.calls.Load(); got != 3 {
		t.Fatalf("the engine saw %d calls, want 3 (one cached, two fresh)", got)
	}
	if st := tk.Stats(); st.Entries != 1 || st.Misses != 3 || st.InFlight != 0 {
		t.Fatalf("stats %+v: fresh calls must not enter the cache", st)
	}
	if _, err := tk.TokenizeFresh(ctx, f.url(), nil, TokenizeRequest{}); err == nil {
		t.Fatal("an empty request was sent")
	}
	f.mu.Lock()
	f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 1)
	f.mu.Unlock()
	done := make(chan error, 1)
	go func() { _, err := tk.TokenizeFresh(ctx, f.url(), nil, req); done <- err }()
	<-f.arrived
	if _, err := tk.TokenizeFresh(ctx, f.url(), nil, req); !errors.Is(err, ErrTokenizerBusy) {
		t.Fatalf("over the concurrency bound: %v, want ErrTokenizerBusy", err)
	}
	close(f.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestTokenizeLRUEviction(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, CacheEntries: 2})
	defer tk.Close()
	ctx := context.Background()
	a := TokenizeRequest{Prompt: json.RawMessage(`"a"`)}
	b := TokenizeRequest{Prompt: json.RawMessage(`"b"`)}
	c := TokenizeRequest{Prompt: json.RawMessage(`"c"`)}
	for _, req := range []TokenizeRequest{a, b, a, c} { // b is least recently used when c arrives
		if _, _, err := tk.Tokenize(ctx, f.url(), nil, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, cached, _ := tk.Tokenize(ctx, f.url(), nil, a); !cached {
		t.Fatal("recently used entry evicted")
	}
	if _, cached, _ := tk.Tokenize(ctx, f.url(), nil, b); cached {
		t.Fatal("least recently used entry not evicted")
	}
	if st := tk.Stats(); st.Entries != 2 || st.Hits != 2 || st.Misses != 4 {
		t.Fatalf("stats: %+v", st)
	}
}

func TestTokenizeCacheDisabled(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, CacheEntries: -1})
	defer tk.Close()
	req := TokenizeRequest{Prompt: json.RawMessage(`"a"`)}
	for range 2 {
		if _, cached, err := tk.Tokenize(context.Background(), f.url(), nil, req); err != nil || cached {
			t.Fatal(err, cached)
		}
	}
	if f.calls.Load() != 2 {
		t.Fatalf("calls = %d", f.calls.Load())
	}
	if tk.resume != nil {
		t.Fatal("with the cache off, recent answers are still kept for resuming")
	}
}

// TestTokenizeCacheByteBound: the cache holds at most CacheMaxBytes (each
// entry counting 8 bytes a token plus TokenizeCacheEntryOverhead, its slice
// clipped to its length), evicts least recently used entries to fit, keeps
// serving hits, and does not cache (nor evict for) a result larger than the
// whole budget.
func TestTokenizeCacheByteBound(t *testing.T) {
	f := newFakeTokenizer(t)
	cost := func(n int) int64 { return int64(n)*8 + TokenizeCacheEntryOverhead }
	budget := 3 * cost(10) // three 10-token entries
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, CacheMaxBytes: budget})
	defer tk.Close()
	ctx := context.Background()
	prompt := func(s string) TokenizeRequest { return TokenizeRequest{Prompt: json.RawMessage(strconv.Quote(s))} }
	check := func(step string) {
		t.Helper()
		st := tk.Stats()
		if st.CachedBytes > budget {
			t.Fatalf("%s: %d bytes cached, budget %d", step, st.CachedBytes, budget)
		}
		// Exact accounting: every entry's slice is clipped to its length.
		if want := int64(st.CachedTokens)*8 + int64(st.Entries)*TokenizeCacheEntryOverhead; st.CachedBytes != want {
			t.Fatalf("%s: %d bytes counted for %d entries of %d tokens in all, want %d", step, st.CachedBytes, st.Entries, st.CachedTokens, want)
		}
	}
	do := func(s string, wantCached bool) {
		t.Helper()
		toks, cached, err := tk.Tokenize(ctx, f.url(), nil, prompt(s))
		if err != nil || !equalTokens(toks, expectTokens(s)) {
			t.Fatalf("%q: %v %v", s, toks, err)
		}
		if cached != wantCached {
			t.Fatalf("%q: cached = %v, want %v", s, cached, wantCached)
		}
		check(s)
	}

	a, b, c, d := "aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc", "dddddddddd"
	do(a, false)
	do(b, false)
	do(c, false)
	if st := tk.Stats(); st.Entries != 3 || st.CachedBytes != budget {
		t.Fatalf("three entries should fill the budget exactly: %+v", st)
	}
	do(a, true)  // a is now the most recent; b the least
	do(d, false) // evicts b only
	do(a, true)
	do(c, true)
	do(d, true)
	do(b, false) // was evicted; re-entering it evicts a, the least recent now
	do(a, false)

	// Larger than the whole budget: not cached, and nothing evicted for it.
	before := tk.Stats()
	huge := strings.Repeat("h", 100)
	do(huge, false)
	do(huge, false)
	if st := tk.Stats(); st.Entries != before.Entries || st.CachedBytes != before.CachedBytes {
		t.Fatalf("an uncacheable result changed the cache: %+v, before %+v", st, before)
	}

	// Filling far past the budget with results of mixed sizes keeps it.
	for i := range 200 {
		do(fmt.Sprintf("%0*d", 1+i%30, i), false)
	}
	// One larger entry evicts as many small ones as it takes to fit.
	big := strings.Repeat("g", 30) // 368 bytes: needs more than one 10-token entry gone
	do(big, false)
	do(big, true)
}

// TestTokenizeCloseClosesConnections: Close closes the default client's
// idle connections at once, and those of calls in flight when they finish,
// so a dropped Tokenizer leaves no connection to its engines behind.
func TestTokenizeCloseClosesConnections(t *testing.T) {
	var open atomic.Int64
	f := newCountingFakeTokenizer(t, &open)
	tk := NewTokenizer(TokenizerOptions{Timeout: 30 * time.Second})
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := tk.Tokenize(ctx, f.url(), nil, TokenizeRequest{Prompt: json.RawMessage(fmt.Sprintf(`"idle %d"`, i))}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if open.Load() == 0 {
		t.Fatal("no connection open after the calls: keep-alive is off?")
	}
	tk.Close()
	testwait.For(t, 15*time.Second, "idle connections closed", func() bool { return open.Load() == 0 })

	// Calls in flight during Close, one of them started after it (which
	// makes net/http stop closing connections as they become idle): their
	// connections are closed when they end.
	tk = NewTokenizer(TokenizerOptions{Timeout: 30 * time.Second})
	f.mu.Lock()
	f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 2)
	f.mu.Unlock()
	done := make(chan error, 2)
	call := func(p string) {
		_, _, err := tk.Tokenize(ctx, f.url(), nil, TokenizeRequest{Prompt: json.RawMessage(strconv.Quote(p))})
		done <- err
	}
	go call("in flight before Close")
	<-f.arrived
	tk.Close()
	go call("in flight after Close")
	<-f.arrived
	close(f.gate)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 15*time.Second, "the in-flight call's connection closed", func() bool { return open.Load() == 0 })
}

func TestTokenizeFailures(t *testing.T) {
	tests := []struct {
		name    string
		respond func(w http.ResponseWriter)
		wantErr string
	}{
		{"HTTP 500", func(w http.ResponseWriter) { http.Error(w, `{"message":"boom"}`, 500) }, "HTTP 500"},
		{"not JSON", func(w http.ResponseWriter) { fmt.Fprint(w, "<html>") }, "decode response"},
		{"negative token", func(w http.ResponseWriter) { fmt.Fprint(w, `{"count":1,"tokens":[-1]}`) }, "decode response"},
		{"fractional token", func(w http.ResponseWriter) { fmt.Fprint(w, `{"count":1,"tokens":[1.5]}`) }, "decode response"},
		{"no tokens", func(w http.ResponseWriter) { fmt.Fprint(w, `{"count":0}`) }, "no tokens"},
		{"count mismatch", func(w http.ResponseWriter) { fmt.Fprint(w, `{"count":3,"tokens":[1,2]}`) }, "count 3"},
		{"oversized", func(w http.ResponseWriter) {
			fmt.Fprint(w, `{"tokens":[`+strings.Repeat("1,", 2000)+`1]}`)
		}, "too large"},
	}
	for _, tc := range tests {
		for _, client := range tokenizeClients {
			t.Run(tc.name+"/"+client.name, func(t *testing.T) {
				f := newFakeTokenizer(t)
				f.respond = tc.respond
				tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, MaxResponseBytes: 1024, Client: client.client()})
				defer tk.Close()
				req := TokenizeRequest{Prompt: json.RawMessage(`"x"`)}
				for range 2 { // errors are not cached
					_, _, err := tk.Tokenize(context.Background(), f.url(), nil, req)
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Count(err.Error(), "tokenize:") != 1 {
						t.Fatalf("err = %v, want %q once prefixed", err, tc.wantErr)
					}
				}
				if st := tk.Stats(); st.Errors != 2 || st.Entries != 0 || f.calls.Load() != 2 {
					t.Fatalf("stats %+v calls %d", st, f.calls.Load())
				}
			})
		}
	}
	t.Run("connection refused", func(t *testing.T) {
		f := newFakeTokenizer(t)
		u := f.url()
		f.srv.Close()
		tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
		if _, _, err := tk.Tokenize(context.Background(), u, nil, TokenizeRequest{Prompt: json.RawMessage(`"x"`)}); err == nil {
			t.Fatal("want error")
		}
	})
}

// tokenizeClients are the two ways a Tokenizer calls: its default client
// (remotetok/internal/h1client for http:// engines) and a caller's net/http Client
// (TokenizerOptions.Client; also the default's for https:// engines).
var tokenizeClients = []struct {
	name   string
	client func() *http.Client
}{
	{"default", func() *http.Client { return nil }},
	{"net-http", func() *http.Client { return &http.Client{Transport: &http.Transport{}} }},
}

func TestTokenizeTimeout(t *testing.T) {
	for _, client := range tokenizeClients {
		t.Run(client.name, func(t *testing.T) {
			f := newFakeTokenizer(t)
			f.gate = make(chan struct{}) // never opened: the server hangs
			tk := NewTokenizer(TokenizerOptions{Timeout: 100 * time.Millisecond, Client: client.client()})
			defer tk.Close()
			start := time.Now()
			_, _, err := tk.Tokenize(context.Background(), f.url(), nil, TokenizeRequest{Prompt: json.RawMessage(`"x"`)})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("timeout not enforced: %v", d)
			}
			if st := tk.Stats(); st.Errors != 1 || st.InFlight != 0 {
				t.Fatalf("stats: %+v", st)
			}
		})
	}
}

func TestTokenizeConcurrencyLimit(t *testing.T) {
	f := newFakeTokenizer(t)
	f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 2)
	tk := NewTokenizer(TokenizerOptions{MaxConcurrent: 2, Timeout: 30 * time.Second})
	defer tk.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = tk.Tokenize(ctx, f.url(), nil, TokenizeRequest{Prompt: json.RawMessage(fmt.Sprintf(`"p%d"`, i))})
		}()
	}
	<-f.arrived
	<-f.arrived
	if st := tk.Stats(); st.InFlight != 2 {
		t.Fatalf("in flight = %d", st.InFlight)
	}
	_, _, err := tk.Tokenize(ctx, f.url(), nil, TokenizeRequest{Prompt: json.RawMessage(`"p3"`)})
	if !errors.Is(err, ErrTokenizerBusy) {
		t.Fatalf("third call: %v", err)
	}
	close(f.gate)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := tk.Stats(); st.Rejected != 1 || f.calls.Load() != 2 {
		t.Fatalf("stats %+v calls %d", st, f.calls.Load())
	}
	// Slots are released: a new call works.
	if _, _, err := tk.Tokenize(ctx, f.url(), nil, TokenizeRequest{Prompt: json.RawMessage(`"p3"`)}); err != nil {
		t.Fatal(err)
	}
}

func TestTokenizeSharesIdenticalConcurrentCalls(t *testing.T) {
	f := newFakeTokenizer(t)
	f.gate, f.arrived = make(chan struct{}), make(chan struct{}, 1)
	tk := NewTokenizer(TokenizerOptions{MaxConcurrent: 1, Timeout: 30 * time.Second})
	defer tk.Close()
	req := TokenizeRequest{Prompt: json.RawMessage(`"shared"`)}
	const n = 8
	var wg sync.WaitGroup
	results := make([][]uint64, n)
	errs := make([]error, n)
	wg.Add(1)
	go func() { defer wg.Done(); results[0], _, errs[0] = tk.Tokenize(context.Background(), f.url(), nil, req) }()
	<-f.arrived
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); results[i], _, errs[i] = tk.Tokenize(context.Background(), f.url(), nil, req) }()
	}
	testwait.For(t, 15*time.Second, "followers joined", func() bool { return tk.Stats().Shared == n-1 })
	close(f.gate)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || !equalTokens(results[i], expectTokens("shared")) {
			t.Fatalf("caller %d: %v %v", i, results[i], errs[i])
		}
	}
	if f.calls.Load() != 1 || tk.Stats().Rejected != 0 {
		t.Fatalf("calls = %d, stats %+v", f.calls.Load(), tk.Stats())
	}
}

func TestTokenizeFollowerSurvivesLeaderCancel(t *testing.T) {
	f := newFakeTokenizer(t)
	f.arrived = make(chan struct{}, 2)
	f.gate = make(chan struct{})
	tk := NewTokenizer(TokenizerOptions{Timeout: 30 * time.Second})
	defer tk.Close()
	req := TokenizeRequest{Prompt: json.RawMessage(`"z"`)}
	leaderCtx, cancel := context.WithCancel(context.Background())
	leaderErr := make(chan error, 1)
	go func() { _, _, err := tk.Tokenize(leaderCtx, f.url(), nil, req); leaderErr <- err }()
	<-f.arrived
	followerDone := make(chan error, 1)
	var toks []uint64
	go func() {
		var err error
		toks, _, err = tk.Tokenize(context.Background(), f.url(), nil, req)
		followerDone <- err
	}()
	testwait.For(t, 15*time.Second, "follower joined", func() bool { return tk.Stats().Shared == 1 })
	cancel()
	if err := <-leaderErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("leader: %v", err)
	}
	<-f.arrived // the follower retried as the new leader
	close(f.gate)
	if err := <-followerDone; err != nil || !equalTokens(toks, expectTokens("z")) {
		t.Fatalf("follower: %v %v", toks, err)
	}
}

func TestParseTokenizeResponse(t *testing.T) {
	toks, err := parseTokenizeResponse([]byte(`{"count":3,"max_model_len":4096,"tokens":[128000,9906,18446744073709551615],"token_strs":null}`))
	if err != nil || !equalTokens(toks, []uint64{128000, 9906, 18446744073709551615}) {
		t.Fatalf("%v %v", toks, err)
	}
	if toks, err := parseTokenizeResponse([]byte(`{"count":0,"tokens":[]}`)); err != nil || len(toks) != 0 {
		t.Fatalf("empty: %v %v", toks, err)
	}
}

// TestParseTokenizeResponseStrictIDs: every token id must be a
// non-negative integer. Decoding into []uint64 read a null id as token 0,
// silently hashing a prompt the engine never saw (found by the oracle of
// FuzzParseTokenizeResponse).
func TestParseTokenizeResponseStrictIDs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []uint64 // nil: rejected
	}{
		{`{"tokens":[null]}`, nil},
		{`{"count":2,"tokens":[5,null]}`, nil},
		{`{"tokens":["5"]}`, nil},
		{`{"tokens":[1e2]}`, nil},
		{`{"tokens":[-0]}`, nil},
		{`{"tokens":[18446744073709551616]}`, nil},
		{`{"tokens":[99999999999999999999]}`, nil},
		{`{"tokens":null}`, nil},
		{`{"tokens":{}}`, nil},
		{"{\"tokens\":\t[ 0 ,\r\n18446744073709551615 ]\n}", []uint64{0, 18446744073709551615}},
		{`{"tokens":[ ]}`, []uint64{}},
	} {
		toks, err := parseTokenizeResponse([]byte(c.in))
		if c.want == nil {
			if err == nil {
				t.Errorf("%s: accepted as %v", c.in, toks)
			}
			continue
		}
		if err != nil || toks == nil || !equalTokens(toks, c.want) {
			t.Errorf("%s: %v %v, want %v", c.in, toks, err, c.want)
		}
	}
}

// TestTokenizeRetriesDeadKeepAlive: an engine that restarted (or an idle
// timeout on its side) leaves the tokenizer a pooled connection the engine
// has closed. /tokenize is idempotent, so a call that fails on such a
// reused connection before any response is retried on a new one rather
// than sending the request to the approximate tier (a flake in
// TestReliabilityEngineRestartRoutingRecovers under load).
func TestTokenizeRetriesDeadKeepAlive(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveOnceThenDrop(c)
		}
	}()
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, CacheEntries: -1})
	defer tk.Close()
	url := "http://" + ln.Addr().String() + "/tokenize"
	for i := range 3 {
		req := TokenizeRequest{Prompt: json.RawMessage(fmt.Sprintf(`"call %d"`, i))}
		if toks, _, err := tk.Tokenize(context.Background(), url, nil, req); err != nil || len(toks) != 2 {
			t.Fatalf("call %d: %v tokens, %v", i, toks, err)
		}
	}
}

// serveOnceThenDrop answers the first request on c with keep-alive, then
// reads the next one and closes c without answering: what a client sees
// of a connection the server dropped while it sat in the client's pool.
func serveOnceThenDrop(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if i > 0 {
			return
		}
		body := `{"count":2,"max_model_len":4096,"tokens":[1,2]}`
		_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
}

// TestTokenizeLyingContentLength: a Content-Length up to MaxResponseBytes
// that the body does not honour is not allocated in full: no more than a
// pooled buffer's worth is reserved before the bytes arrive.
func TestTokenizeLyingContentLength(t *testing.T) {
	const limit = 64 << 20
	f := newFakeTokenizer(t)
	f.respond = func(w http.ResponseWriter) {
		w.Header().Set("Content-Length", strconv.Itoa(limit))
		_, _ = io.WriteString(w, `{"count":1,"tokens":[1]}`)
	}
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, MaxResponseBytes: limit})
	defer tk.Close()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	if _, _, err := tk.Tokenize(context.Background(), f.url(), nil, TokenizeRequest{Prompt: json.RawMessage(`"x"`)}); err == nil {
		t.Fatal("a truncated answer was accepted")
	}
	runtime.ReadMemStats(&ms)
	if got := ms.TotalAlloc - before; got > 2*maxPooledResponse {
		t.Errorf("allocated %d bytes for an answer of %d bytes claiming %d", got, len(`{"count":1,"tokens":[1]}`), limit)
	}
}

// TestTokenizeIdleConnectionsCapped: calls spread over many engines leave
// at most twice MaxConcurrent connections idle in all, however many each
// engine had: every one holds a 64 KiB write buffer and two goroutines.
func TestTokenizeIdleConnectionsCapped(t *testing.T) {
	const engines, maxConcurrent = 4, 2
	var open atomic.Int64
	fs := make([]*fakeTokenizer, engines)
	for i := range fs {
		fs[i] = newCountingFakeTokenizer(t, &open)
		fs[i].gate, fs[i].arrived = make(chan struct{}), make(chan struct{}, maxConcurrent)
	}
	tk := NewTokenizer(TokenizerOptions{MaxConcurrent: maxConcurrent, Timeout: 30 * time.Second})
	defer tk.Close()
	for i, f := range fs {
		// maxConcurrent calls at once on each engine: each needs a
		// connection of its own there.
		errs := make(chan error, maxConcurrent)
		for j := range maxConcurrent {
			go func() {
				_, _, err := tk.Tokenize(context.Background(), f.url(), nil, TokenizeRequest{Prompt: json.RawMessage(fmt.Sprintf(`"engine %d call %d"`, i, j))})
				errs <- err
			}()
		}
		for range maxConcurrent {
			<-f.arrived
		}
		close(f.gate)
		for range maxConcurrent {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	// The transport closes the oldest idle connections past the cap as the
	// last calls hand theirs back.
	testwait.For(t, 15*time.Second, fmt.Sprintf("at most %d connections open", 2*maxConcurrent), func() bool { return open.Load() <= 2*maxConcurrent })
	if n := open.Load(); n < maxConcurrent {
		t.Fatalf("%d connections open after the calls: keep-alive is off?", n)
	}
}
