package localtok

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/admission"
)

// loadRealModel loads a real model's tokenizer directory from
// LLMGW_TOKENIZER_FILES (./xcaddy.sh test fetches them), or skips.
func loadRealModel(tb testing.TB, name string) *Model {
	root := os.Getenv("LLMGW_TOKENIZER_FILES")
	if root == "" {
		tb.Skip("LLMGW_TOKENIZER_FILES is not set")
	}
	m, err := Load(filepath.Join(root, name))
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// chatBody is a chat request body: a system prompt and turns user/assistant
// pairs whose user messages share the ~8k-token text of the tokenizer's
// benchmark prompt, split across the turns, and a final user question.
func chatBody(tb testing.TB, copies, turns int) []byte {
	b, err := os.ReadFile("../tokenizer/testdata/prompt_8k.txt")
	if err != nil {
		tb.Fatal(err)
	}
	var sb strings.Builder
	for i := range copies {
		fmt.Fprintf(&sb, "\n\n## Part %d of %d\n\n", i+1, copies)
		sb.Write(b)
	}
	text := sb.String()
	msgs := []map[string]string{{"role": "system", "content": "You are a careful assistant. Answer from the documents."}}
	step := len(text) / turns
	for i := range turns {
		part := text[i*step : (i+1)*step]
		msgs = append(msgs, map[string]string{"role": "user", "content": part})
		if i < turns-1 {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": "Noted; go on."})
		}
	}
	body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 16})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// BenchmarkTokenizeChat is the whole local path for a chat request, as the
// gateway runs it: the parsed request's messages decoded, the chat
// template rendered, the text encoded. Bodies: an 8k-token prompt in one
// user message and over 8 turns, and a 128k-token prompt in one message.
// The tokenizer's word cache is warm after the first iteration, as in a
// running gateway.
func BenchmarkTokenizeChat(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3_1"} {
		m := loadRealModel(b, model)
		for _, size := range []struct {
			name          string
			copies, turns int
		}{{"8k-1turn", 1, 1}, {"8k-8turns", 1, 8}, {"128k-1turn", 16, 1}} {
			b.Run(model+"/"+size.name, func(b *testing.B) {
				req, err := admission.ParseRequest(chatBody(b, size.copies, size.turns))
				if err != nil {
					b.Fatal(err)
				}
				ids, err := m.Tokenize(req)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if _, err := m.Tokenize(req); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(ids)), "tokens")
			})
		}
	}
}
