package upstreams

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
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
