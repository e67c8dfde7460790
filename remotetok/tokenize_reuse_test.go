package remotetok

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestTokenizeReusesConnections: the tokenizer's default client keeps its
// connections to an engine's /tokenize alive. 500 sequential calls to a
// simulated engine on loopback open one connection; 500 more from 16
// goroutines at once open no more than those goroutines can hold (each
// call that finds no idle connection dials one, and at most two per
// goroutine can be in the air at once: one in use, one dialed while the
// first came back). The cache is off, so every call reaches the engine.
func TestTokenizeReusesConnections(t *testing.T) {
	e, err := vllmsim.Start(context.Background(), vllmsim.Config{TimeScale: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tk := NewTokenizer(TokenizerOptions{Timeout: 10 * time.Second, CacheEntries: -1})
	defer tk.Close()
	url := e.URL() + "/tokenize"
	call := func(i int) error {
		req := TokenizeRequest{Model: "sim-model", Prompt: json.RawMessage(fmt.Sprintf(`"call number %d"`, i))}
		toks, _, err := tk.Tokenize(context.Background(), url, nil, req)
		if err == nil && len(toks) == 0 {
			err = fmt.Errorf("call %d: no tokens", i)
		}
		return err
	}
	for i := range 500 {
		if err := call(i); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.Accepted(); n != 1 {
		t.Fatalf("500 sequential calls opened %d connections, want 1", n)
	}
	const workers = 16
	concurrently(t, workers, func(w int) error {
		for i := w; i < 500; i += workers {
			if err := call(1000 + i); err != nil {
				return err
			}
		}
		return nil
	})
	n := e.Accepted()
	t.Logf("connections accepted: 1 for 500 sequential calls, %d after 500 more from %d goroutines", n, workers)
	if n > 1+2*workers {
		t.Fatalf("1000 calls opened %d connections, want at most %d", n, 1+2*workers)
	}
	if s := tk.Stats(); s.Misses != 1000 || s.Errors != 0 {
		t.Fatalf("stats %+v, want 1000 calls without error", s)
	}
}
