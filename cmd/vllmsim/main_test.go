package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"go.uber.org/goleak"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// served is a serve call running in the background: the engines it
// started and its output. stop cancels it and fails the test unless serve
// returns nil within 10 s; tests defer it after goleak's check, so that it
// runs first.
type served struct {
	engines []*vllmsim.Engine
	out     *syncBuffer
	stop    func()
}

// startServe runs serve with args in the background and waits until it
// has started its engines.
func startServe(t *testing.T, args ...string) served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := served{out: &syncBuffer{}}
	started := make(chan []*vllmsim.Engine, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, args, s.out, started) }()
	select {
	case s.engines = <-started:
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("serve did not start")
	}
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("serve returned %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("serve did not stop")
			}
		})
	}
	return s
}

func TestServeFleetAndStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := startServe(t, "-n", "2", "-port", "0", "-kv-endpoint", "tcp://127.0.0.1:0", "-time-scale", "50", "-model", "m1")
	defer srv.stop()
	engines, out := srv.engines, srv.out
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "engine 1 url=http://127.0.0.1:") || !strings.Contains(lines[0], "kv=tcp://127.0.0.1:") {
		t.Fatalf("output %q", out.String())
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, e := range engines {
		resp, err := client.Get(e.URL() + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("health %d", resp.StatusCode)
		}
	}
	srv.stop()
}

// TestServeDataParallel: -data-parallel-size runs its ranks behind one
// port, each publishing on the KV port + its rank.
func TestServeDataParallel(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := startServe(t, "-data-parallel-size", "2", "-port", "0", "-kv-endpoint", "tcp://127.0.0.1:0", "-time-scale", "50")
	defer srv.stop()
	ranks, out := srv.engines, srv.out
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(ranks) != 2 || len(lines) != 3 || !strings.Contains(lines[0], "ranks=2") || !strings.HasPrefix(lines[2], "rank 1 kv=tcp://127.0.0.1:") {
		t.Fatalf("%d ranks, output %q", len(ranks), out.String())
	}
	if ranks[1].Config().DPRank != 1 {
		t.Fatalf("second rank is rank %d", ranks[1].Config().DPRank)
	}
	srv.stop()
}

func TestServeRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-n", "0", "-port", "0"},
		{"-port", "-1"},
		{"-block-size", "-3", "-port", "0"},
		{"-kv-endpoint", "udp://x:1", "-port", "0"},
		{"extra"},
		{"-port", "0", "-lora-modules", "sim-model"},
		{"-port", "0", "-model", "m", "-lora-modules", "a,m"},
		{"-port", "0", "-lora-modules", "a,a"},
		{"-port", "0", "-lora-modules", "a,,b"},
		{"-port", "0", "-max-loras", "-1"},
		{"-port", "0", "-max-loras", "1025"},
		{"-port", "0", "-lora-load-time", "-1s"},
		{"-port", "0", "-lora-load-time", "soon"},
		{"-port", "0", "-served-model-name", "a,a"},
		{"-port", "0", "-served-model-name", "a,,b"},
		{"-port", "0", "-served-model-name", "m,sql", "-lora-modules", "sql"},
		{"-port", "0", "-n", "2", "-data-parallel-size", "2"},
		{"-port", "0", "-data-parallel-size", "257"},
	} {
		var out bytes.Buffer
		if err := serve(context.Background(), args, &out, nil); err == nil {
			t.Errorf("serve(%q) succeeded", args)
		}
	}
}

func TestServeLoRAModules(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := startServe(t, "-port", "0", "-time-scale", "50", "-model", "base", "-lora-modules", "sql,chat")
	defer srv.stop()
	engines, out := srv.engines, srv.out
	if got := engines[0].Config().LoRAModules; len(got) != 2 || got[0] != "sql" || got[1] != "chat" {
		t.Errorf("LoRAModules %q", got)
	}
	if !strings.Contains(out.String(), "model=base lora=sql,chat") {
		t.Errorf("output %q", out.String())
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for model, status := range map[string]int{"chat": 200, "sql": 200, "base": 200, "other": 404} {
		resp, err := client.Post(engines[0].URL()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","prompt":"hi","max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Errorf("model %s: status %d, want %d", model, resp.StatusCode, status)
		}
	}
	srv.stop()
}

func TestServeModelNamesAndLoRASlots(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := startServe(t, "-port", "0", "-time-scale", "50", "-model", "/models/m", "-served-model-name", "m,m-v1",
		"-lora-modules", "sql,chat", "-max-loras", "1", "-lora-load-time", "20ms")
	defer srv.stop()
	engines, out := srv.engines, srv.out
	cfg := engines[0].Config()
	if cfg.Model != "m" || len(cfg.ModelAliases) != 1 || cfg.ModelAliases[0] != "m-v1" || cfg.MaxLoRAs != 1 || cfg.LoRALoadTime != 20*time.Millisecond {
		t.Errorf("config: model %q aliases %q max_loras %d lora_load_time %v", cfg.Model, cfg.ModelAliases, cfg.MaxLoRAs, cfg.LoRALoadTime)
	}
	if !strings.Contains(out.String(), "model=m,m-v1 lora=sql,chat") {
		t.Errorf("output %q", out.String())
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for model, status := range map[string]int{"m": 200, "m-v1": 200, "sql": 200, "/models/m": 404} {
		resp, err := client.Post(engines[0].URL()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","prompt":"hi","max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Errorf("model %s: status %d, want %d", model, resp.StatusCode, status)
		}
	}
	if got := engines[0].Stats().LoRALoads; got != 1 {
		t.Errorf("%d adapter loads, want 1", got)
	}
	srv.stop()
}
