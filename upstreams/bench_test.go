package upstreams

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkParseGauges: parse of a realistic vLLM /metrics page (DP=2,
// 13 histograms, ~70 KB), buffers reused as the poller reuses them.
func BenchmarkParseGauges(b *testing.B) {
	page := readFixture(b, "vllm_metrics_dp2.txt")
	var scratch []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(page)))
	for b.Loop() {
		if _, err := parseGauges(page, &scratch); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScrapeParse: one full scrape over loopback HTTP plus parse.
func BenchmarkScrapeParse(b *testing.B) {
	page := readFixture(b, "vllm_metrics_dp2.txt")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(page)
	}))
	defer srv.Close()
	o := Options{}.withDefaults()
	o.Client = newDefaultClient()
	defer o.Client.CloseIdleConnections()
	var buf, scratch []byte
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(page)))
	for b.Loop() {
		if _, err := scrape(ctx, &o, srv.URL+"/metrics", nil, &buf, &scratch); err != nil {
			b.Fatal(err)
		}
	}
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

// BenchmarkReserveDone: the per-request accounting hot path.
func BenchmarkReserveDone(b *testing.B) {
	r := NewRegistry(Options{})
	defer r.Close()
	e := r.Ensure("127.0.0.1:1")
	b.ReportAllocs()
	for b.Loop() {
		e.Reserve().Done()
	}
}
