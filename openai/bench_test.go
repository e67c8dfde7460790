package openai

import (
	"encoding/json"
	"fmt"
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
