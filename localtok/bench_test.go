package localtok

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/simwords"
	"github.com/llmgw/caddy-llmgw/openai"
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
	// The file is itself a rendered chat: its special tokens would cut
	// each message into sections of their own, so they are defused and
	// every turn is one section of plain text.
	text := strings.ReplaceAll(sb.String(), "<|", "< |")
	msgs := []map[string]string{{"role": "system", "content": "You are a careful assistant. Answer from the documents."}}
	step := len(text) / turns
	for i := range turns {
		part := text[i*step : (i+1)*step]
		if i == turns-1 {
			part += " And now question number #" // each request's own number goes at the #
		}
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

// wordsChat is the overhead bench's 8k body: one user message of n words
// of the bench's own vocabulary (simwords), drawn as the bench draws its
// 8k prompts, ending with a # for the request's number.
func wordsChat(n int) []byte {
	text := simwords.Words(rand.New(rand.NewPCG(8192, 9)), "base0", n)
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + text + ` u#"}],"max_tokens":4,"stream":false}`)
}

// smallChat is the overhead bench's small body: a user message of about 32
// tokens, whose number goes at the #.
const smallChat = `{"model":"m","messages":[{"role":"user","content":"base0 lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua u#"}],"max_tokens":16,"stream":false}`

// BenchmarkTokenizeChat is the whole local path for a chat request, as the
// gateway runs it: the body parsed, the messages decoded, the chat template
// rendered, the text encoded. Bodies: a small one (smallChat), an
// 8k-token prompt in one user message and over 8 turns, and a 128k-token
// prompt in one message; 8k-words is the overhead bench's 8k body (random
// words in one message, no JSON escapes). Every request is new, as in a running gateway: its
// last message ends with its own number, so the section cache holds the
// earlier turns (a chat resends its history) but never the last one; the
// word cache is warm after the first request.
func BenchmarkTokenizeChat(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3_1"} {
		m := loadRealModel(b, model)
		for _, size := range []struct {
			name          string
			copies, turns int // of chatBody; 0 copies: smallChat, or wordsChat with turns = -1
		}{{"small", 0, 0}, {"8k-words", 0, -1}, {"8k-1turn", 1, 1}, {"8k-8turns", 1, 8}, {"128k-1turn", 16, 1}} {
			b.Run(model+"/"+size.name, func(b *testing.B) {
				// The last #: the document's own Markdown headings have
				// some too.
				body := []byte(smallChat)
				if size.turns < 0 {
					body = wordsChat(2350)
				} else if size.copies > 0 {
					body = chatBody(b, size.copies, size.turns)
				}
				cut := bytes.LastIndexByte(body, '#')
				if cut < 0 {
					b.Fatal("no # in the body")
				}
				head, tail := body[:cut], body[cut+1:]
				body = nil
				tokens, n := 0, 0
				var ids []uint64 // reused, as the gateway pools its buffer
				b.ReportAllocs()
				for b.Loop() {
					n++
					body = append(strconv.AppendInt(append(body[:0], head...), int64(n), 10), tail...)
					req, err := openai.ParseRequest(body)
					if err != nil {
						b.Fatal(err)
					}
					ids, err = m.AppendTokenize(ids[:0], req)
					if err != nil {
						b.Fatal(err)
					}
					tokens = len(ids)
				}
				b.ReportMetric(float64(tokens), "tokens")
			})
		}
	}
}
