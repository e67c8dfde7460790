package upstreams

import (
	"context"
	"net/http"
	"net/http/httptest"
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
		if _, err := scrape(ctx, &o, scrapeTarget{url: srv.URL + "/metrics"}, &buf, &scratch); err != nil {
			b.Fatal(err)
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
