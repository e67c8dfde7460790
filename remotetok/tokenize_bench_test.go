package remotetok

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkTokenizeMiss8k: every request is new (as in the overhead bench's
// 8k workload): a loopback /tokenize call answering 8192 token ids, the
// decode, and the cache insert with its evictions. live-MiB is the heap
// still in use after a GC once the loop is over: the full cache, at the
// default bounds (run with -benchtime of a few thousand x to fill it).
func BenchmarkTokenizeMiss8k(b *testing.B) {
	resp := tokenizeAnswer(8192)
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
	head := promptHead(32 << 10)
	prompt := make([]byte, 0, len(head)+32)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		prompt = numbered(prompt, head, i)
		if _, _, err := tk.Tokenize(ctx, srv.URL, nil, TokenizeRequest{Prompt: prompt, Verbatim: true}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTokenizeClient compares the two clients of a /tokenize call
// on loopback: the default one (remotetok/internal/h1client: the call made on the
// caller's goroutine) and net/http's Transport (what a TokenizerOptions
// Client gets, and what the default used before), for a small chat (31
// ids in the answer), an 8k one (32 KiB sent, 8192 ids back) and a 128k
// one (512 KiB sent, 131072 ids back, chunked by the server). Every
// call is new (the cache is off). cpu-µs/op is the process's CPU per
// call, the test server's included (the same for both).
func BenchmarkTokenizeClient(b *testing.B) {
	for _, size := range []struct {
		name   string
		prompt int // bytes of prompt text
		ids    int
	}{{"small", 120, 31}, {"8k", 32 << 10, 8192}, {"128k", 512 << 10, 131072}} {
		resp := tokenizeAnswer(size.ids)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(resp)
		}))
		head := promptHead(size.prompt)
		for _, client := range []string{"h1client", "transport"} {
			b.Run(size.name+"/"+client, func(b *testing.B) {
				o := TokenizerOptions{CacheEntries: -1}
				if client == "transport" {
					o.Client = &http.Client{Transport: &http.Transport{WriteBufferSize: tokenizeWriteBuffer}}
				}
				tk := NewTokenizer(o)
				defer tk.Close()
				prompt := make([]byte, 0, len(head)+32)
				i := 0
				cpu0 := processCPU()
				b.ReportAllocs()
				for b.Loop() {
					i++
					prompt = numbered(prompt, head, i)
					if _, _, err := tk.Tokenize(context.Background(), srv.URL, nil, TokenizeRequest{Prompt: prompt, Verbatim: true}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(i), "cpu-µs/op")
			})
		}
		srv.Close()
	}
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tokenizeAnswer is a /tokenize answer of n ids, as vLLM writes it.
func tokenizeAnswer(n int) []byte {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = 1000 + i*7%50000
	}
	resp, _ := json.Marshal(map[string]any{"count": len(toks), "max_model_len": 32768, "tokens": toks})
	return resp
}

// promptHead is a JSON string of about n bytes of prompt text without its
// closing quote: numbered ends it with a request's own number.
func promptHead(n int) string {
	head := strconv.Quote(strings.Repeat("a few words of the prompt ", n/26+1)[:n])
	return head[:len(head)-1]
}

// numbered writes head, i and the closing quote into buf: a prompt no
// earlier request sent.
func numbered(buf []byte, head string, i int) []byte {
	return append(strconv.AppendInt(append(buf[:0], head...), int64(i), 10), '"')
}

// BenchmarkTokenizeCacheHit: a ~6 KB multi-turn chat request served from
// the cache (canonicalisation + hashing + LRU touch).
func BenchmarkTokenizeCacheHit(b *testing.B) {
	var msgs []map[string]string
	msgs = append(msgs, map[string]string{"role": "system", "content": strings.Repeat("You are a helpful assistant. ", 80)})
	for i := range 10 {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("question %d: %s", i, strings.Repeat("lorem ipsum ", 20))})
		msgs = append(msgs, map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d", i)})
	}
	raw, _ := json.Marshal(msgs)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"count":3,"max_model_len":8192,"tokens":[1,2,3]}`)
	}))
	defer srv.Close()
	tk := NewTokenizer(TokenizerOptions{})
	defer tk.Close()
	req := TokenizeRequest{Model: "m", Messages: raw, ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":false}`)}
	ctx := context.Background()
	if _, _, err := tk.Tokenize(ctx, srv.URL, nil, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, cached, err := tk.Tokenize(ctx, srv.URL, nil, req); err != nil || !cached {
			b.Fatal(err, cached)
		}
	}
}
