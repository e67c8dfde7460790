package remotetok

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// TestSharedBodyUsers: the buffer goes back only when its maker and every
// reader are done; a closed reader reads nothing; no reader is handed out
// once every user is gone.
func TestSharedBodyUsers(t *testing.T) {
	s := newSharedBody(func(b []byte) []byte { return append(b, "hello"...) })
	r1, err := s.reader()
	if err != nil {
		t.Fatal(err)
	}
	s.release() // the maker is done; r1 still reads
	got, err := io.ReadAll(r1)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
	r2, err := s.reader() // a retry's reader while r1 is open
	if err != nil {
		t.Fatal(err)
	}
	_ = r1.Close()
	_ = r1.Close() // twice: counted once
	if s.b == nil {
		t.Fatal("the buffer went back while a reader was open")
	}
	if _, err := r1.Read(make([]byte, 1)); !errors.Is(err, errBodyClosed) {
		t.Fatalf("a closed reader read: %v", err)
	}
	if got, _ := io.ReadAll(r2); string(got) != "hello" {
		t.Fatalf("second reader read %q", got)
	}
	_ = r2.Close()
	if s.b != nil {
		t.Fatal("the buffer did not go back once every user was done")
	}
	if _, err := s.reader(); !errors.Is(err, errBodyClosed) {
		t.Fatalf("a reader after every user was gone: %v", err)
	}
}

// TestTokenizeLongBodyPooled: a prompt long enough for a pooled body
// reaches the engine whole, through the cache's call and a fresh call,
// and calls after it reuse the buffer without mixing bodies.
func TestTokenizeLongBodyPooled(t *testing.T) {
	f := newFakeTokenizer(t)
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second})
	defer tk.Close()
	ctx := context.Background()
	for i, n := range []int{minPooledRequest, 3 * minPooledRequest, minPooledRequest + 7} {
		text := strings.Repeat(string(rune('a'+i)), n)
		prompt, _ := json.Marshal(text)
		req := TokenizeRequest{Model: "m", Prompt: prompt, Verbatim: true}
		if w := req.wire(); w.bodySize() < minPooledRequest {
			t.Fatalf("a body of %d bytes is not pooled", w.bodySize())
		}
		for _, fresh := range []bool{false, true} {
			var toks []uint64
			var err error
			if fresh {
				toks, err = tk.TokenizeFresh(ctx, f.url(), nil, req)
			} else {
				toks, _, err = tk.Tokenize(ctx, f.url(), nil, req)
			}
			if err != nil || !equalTokens(toks, expectTokens(text)) {
				t.Fatalf("prompt %d (fresh %v): %d ids, %v", i, fresh, len(toks), err)
			}
		}
	}
}
