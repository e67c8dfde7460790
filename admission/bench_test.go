package admission

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

const smallChat = `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":128,"temperature":0.7}`

// largeChat builds a chat body of about n bytes (40 KB is roughly 8k tokens
// of English), with escapes and some non-ASCII text as real bodies have.
func largeChat(n int) []byte {
	para := `Caching the KV state of a shared prefix saves prefill work: the \"system\" prompt, tools and earlier turns are reused.\nÜbersetzung: 前缀缓存 — prefix cache. `
	var msgs []string
	size := 0
	for i := 0; size < n; i++ {
		role := [2]string{"user", "assistant"}[i%2]
		content := strings.Repeat(para, 8)
		msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":"%s"}`, role, content))
		size += len(content) + 40
	}
	return []byte(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `],"stream":true,"stream_options":{"include_usage":true},"max_tokens":512,"cache_salt":"tenant-1"}`)
}

func benchParse(b *testing.B, body []byte) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseRequest(b *testing.B) {
	large := largeChat(40 << 10)
	b.Run("small", func(b *testing.B) { benchParse(b, []byte(smallChat)) })
	b.Run("40KB", func(b *testing.B) { benchParse(b, large) })
}

// BenchmarkParseRequestStdlib is the reference point: encoding/json into a
// struct that keeps messages raw (it still validates everything).
func BenchmarkParseRequestStdlib(b *testing.B) {
	type req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Prompt    json.RawMessage `json:"prompt"`
		Messages  json.RawMessage `json:"messages"`
		CacheSalt string          `json:"cache_salt"`
	}
	for name, body := range map[string][]byte{"small": []byte(smallChat), "40KB": largeChat(40 << 10)} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var r req
				if err := json.Unmarshal(body, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkGateEnterFastPath(b *testing.B) {
	g := NewGate(Config{})
	try := func() bool { return true }
	b.ReportAllocs()
	for b.Loop() {
		w, err := g.Enter(Normal, try)
		if err != nil || !w.Leave() {
			b.Fatal("not admitted")
		}
	}
}

func BenchmarkGateKickEmpty(b *testing.B) {
	g := NewGate(Config{})
	b.ReportAllocs()
	for b.Loop() {
		g.Kick()
	}
}

// BenchmarkGateParkKick measures one request parking and being admitted by
// Kick behind 100 others in lower bands.
func BenchmarkGateParkKick(b *testing.B) {
	g := NewGate(Config{QueueSize: 1 << 20})
	no := func() bool { return false }
	for range 100 {
		if _, err := g.Enter(Low, no); err != nil {
			b.Fatal(err)
		}
	}
	free := 0
	try := func() bool {
		if free > 0 {
			free--
			return true
		}
		return false
	}
	b.ReportAllocs()
	for b.Loop() {
		w, err := g.Enter(Normal, try)
		if err != nil {
			b.Fatal(err)
		}
		free = 1
		if g.kick() != 1 || !isReady(w) {
			b.Fatal("not admitted")
		}
	}
}

// BenchmarkGateParked10k parks 10,000 waiters and reports the memory each
// costs: allocated bytes, and heap still in use while they are parked.
func BenchmarkGateParked10k(b *testing.B) {
	const n = 10000
	no := func() bool { return false }
	var ms0, ms1 runtime.MemStats
	var total, live uint64
	rounds := 0
	b.ReportAllocs()
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		g := NewGate(Config{QueueSize: n})
		ws := make([]*Waiter, 0, n) // the handler holds each *Waiter; not counted
		runtime.ReadMemStats(&ms1)
		base := ms1.TotalAlloc - ms0.TotalAlloc
		for i := range n {
			w, err := g.Enter(Band(i%NumBands), no)
			if err != nil {
				b.Fatal(err)
			}
			ws = append(ws, w)
		}
		runtime.ReadMemStats(&ms1)
		total += ms1.TotalAlloc - ms0.TotalAlloc - base
		runtime.GC()
		runtime.ReadMemStats(&ms1)
		live += ms1.HeapAlloc - ms0.HeapAlloc - uint64(cap(ws))*8
		rounds++
		runtime.KeepAlive(ws)
		runtime.KeepAlive(g)
	}
	b.ReportMetric(float64(total)/float64(rounds*n), "alloc-B/waiter")
	b.ReportMetric(float64(live)/float64(rounds*n), "live-B/waiter")
}

func BenchmarkPosition10k(b *testing.B) {
	g := NewGate(Config{QueueSize: 1 << 20, Aging: time.Hour})
	no := func() bool { return false }
	var mid *Waiter
	for i := range 10000 {
		w, _ := g.Enter(Band(i%NumBands), no)
		if i == 5000 {
			mid = w
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if mid.Position() == 0 {
			b.Fatal("no position")
		}
	}
}

func BenchmarkStreamObserver(b *testing.B) {
	// 500 token events and the tail of a chat stream, written one event per
	// Write as vLLM flushes them.
	events := strings.SplitAfter(vllmChat, "\n\n")
	var writes [][]byte
	n := 0
	for i := range 500 {
		ev := []byte(events[1+i%3])
		writes = append(writes, ev)
		n += len(ev)
	}
	for _, ev := range events[4:6] {
		writes = append(writes, []byte(ev))
		n += len(ev)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	now := time.Now()
	for b.Loop() {
		o := NewStreamObserver(StreamConfig{Start: now})
		for _, w := range writes {
			o.ObserveAt(w, now)
		}
		if st := o.Stats(); st.ContentEvents != 500 || !st.Done {
			b.Fatalf("%+v", st)
		}
	}
}
