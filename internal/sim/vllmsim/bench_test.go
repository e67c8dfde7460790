package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/kvindex"
)

// benchEngine starts an engine fast enough that the host, not the
// simulated GPU, is the limit: 20 ms decode steps at TimeScale 10000 are 2 µs.
func benchEngine(b *testing.B, events bool) *Engine {
	cfg := Config{MaxNumSeqs: 256, NumGPUBlocks: 1 << 16, TimeScale: 10000, PrefillTokensPerSec: 1e6}
	if events {
		cfg.KVEvents = &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0"}
	}
	e := startEngine(b, cfg)
	if events {
		sub := dialSub(b, e.KVEndpoint(), "")
		go func() {
			for range sub.msgs {
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.WaitKVSubscribers(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
	return e
}

// benchRequests runs completions from 32 concurrent clients and reports
// requests/s. Prompts share a 64-token system prefix and differ after it,
// with 16 output tokens, like a chat workload.
func benchRequests(b *testing.B, events, stream bool) {
	e := benchEngine(b, events)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	b.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}
	system := strings.Repeat("shared system prompt words ", 16)
	var seq atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := seq.Add(1)
			body, _ := json.Marshal(map[string]any{
				"messages":   []map[string]any{{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprintf("question number %d please", n)}},
				"max_tokens": 16, "stream": stream,
			})
			resp, err := c.Post(e.URL()+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	st := e.Stats()
	if st.RequestsServed < uint64(b.N) {
		b.Errorf("served %d of %d", st.RequestsServed, b.N)
	}
}

func BenchmarkSimNonStreaming(b *testing.B)       { benchRequests(b, false, false) }
func BenchmarkSimNonStreamingEvents(b *testing.B) { benchRequests(b, true, false) }
func BenchmarkSimStreaming(b *testing.B)          { benchRequests(b, false, true) }
func BenchmarkSimStreamingEvents(b *testing.B)    { benchRequests(b, true, true) }

// BenchmarkSchedulerOnly measures the scheduler's own cost per request
// (admission, block allocation, hashing of generated blocks, 16 decode
// steps, event encoding), without HTTP.
func BenchmarkSchedulerOnly(b *testing.B) {
	e := benchEngine(b, true)
	prompt := tokenize(nil, strings.Repeat("shared system prompt words ", 16), true)
	h, _ := kvindex.NewHasher("0", 16)
	b.ReportAllocs()
	b.ResetTimer()
	const window = 128
	inflight := make(chan *simRequest, window)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := range inflight {
			for {
				if _, fin, _ := r.progress(); fin {
					break
				}
				<-r.notify
			}
		}
	}()
	for i := 0; b.Loop(); i++ {
		toks := append(append([]uint64(nil), prompt...), uint64(i%100000), uint64(i/100000))
		hashes, _ := h.BlockHashes(nil, toks, nil)
		r := &simRequest{tokens: toks, promptLen: len(toks), maxTokens: 16, seed: uint64(i), hashes: hashes, notify: make(chan struct{}, 1)}
		if err := e.submit(r); err != nil {
			b.Fatal(err)
		}
		inflight <- r
	}
	close(inflight)
	<-done
}

func BenchmarkEncodeBatch(b *testing.B) {
	h, _ := kvindex.NewHasher("0", 16)
	toks := make([]uint64, 512)
	for i := range toks {
		toks[i] = uint64(i * 7919 % 151000)
	}
	ds, _ := h.BlockHashes(nil, toks, nil)
	events := []kvEvent{{kind: evStored, hashes: ds, tokens: toks, blockSize: 16}, {kind: evRemoved, hashes: ds[:1]}}
	for _, mapEvents := range []bool{false, true} {
		b.Run(fmt.Sprintf("map=%v", mapEvents), func(b *testing.B) {
			enc := newEventEncoder(mapEvents, false)
			b.ReportAllocs()
			for b.Loop() {
				_ = enc.encodeBatch(1760000000.25, events, 0)
			}
		})
	}
}

func BenchmarkTokenize(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog, again and again. ", 64)
	buf := make([]uint64, 0, 1024)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		buf = tokenize(buf[:0], text, true)
	}
}
