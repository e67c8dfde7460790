package upstreams

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkTokenizeMiss8k: every request is new (as in the overhead bench's
// 8k workload): a loopback /tokenize call answering 8192 token ids, the
// decode, and the cache insert with its evictions. live-MiB is the heap
// still in use after a GC once the loop is over: the full cache, at the
// default bounds (run with -benchtime of a few thousand x to fill it).
func BenchmarkTokenizeMiss8k(b *testing.B) {
	toks := make([]int, 8192)
	for i := range toks {
		toks[i] = 1000 + i*7%50000
	}
	resp, _ := json.Marshal(map[string]any{"count": len(toks), "max_model_len": 32768, "tokens": toks})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(resp)
	}))
	defer srv.Close()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	tk := NewTokenizer(TokenizerOptions{})
	defer tk.Close()
	ctx := context.Background()
	prompt := make([]byte, 0, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		prompt = strconv.AppendQuote(prompt[:0], "request "+strconv.Itoa(i))
		if _, cached, err := tk.Tokenize(ctx, srv.URL, nil, TokenizeRequest{Prompt: prompt}); err != nil || cached {
			b.Fatal(err, cached)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(int64(ms.HeapAlloc)-int64(base))/(1<<20), "live-MiB")
	b.ReportMetric(float64(tk.Stats().Entries), "entries")
}

// BenchmarkTokenizeSend32KB is the sending side of a /tokenize call for an
// 8k-token chat: a 32 KiB prompt (every one new; verbatim, as the gateway
// passes a client's checked JSON on) to a loopback server that reads it
// whole and answers a few ids, so the request's writing is most of the
// call.
func BenchmarkTokenizeSend32KB(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"count":3,"max_model_len":32768,"tokens":[1,2,3]}`))
	}))
	defer srv.Close()
	tk := NewTokenizer(TokenizerOptions{})
	defer tk.Close()
	ctx := context.Background()
	head := strconv.Quote(strings.Repeat("a few words of the prompt ", 32<<10/26))
	head = head[:len(head)-1] // the request's number goes before the quote
	prompt := make([]byte, 0, len(head)+32)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		prompt = append(strconv.AppendInt(append(prompt[:0], head...), int64(i), 10), '"')
		if _, _, err := tk.Tokenize(ctx, srv.URL, nil, TokenizeRequest{Prompt: prompt, Verbatim: true}); err != nil {
			b.Fatal(err)
		}
	}
}
