package vllmsim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/golden"
	"github.com/llmgw/caddy-llmgw/internal/testutil/pyzmq"
	"github.com/llmgw/caddy-llmgw/kvindex"
)

// pyProc runs testdata/kvsub.py and yields its JSON lines.
type pyProc struct {
	cmd   *exec.Cmd
	lines chan map[string]any
	errb  *bytes.Buffer
}

func runPy(t *testing.T, args ...string) *pyProc {
	t.Helper()
	py := pyzmq.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cmd := exec.CommandContext(ctx, py, append([]string{"testdata/kvsub.py"}, args...)...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	p := &pyProc{cmd: cmd, lines: make(chan map[string]any, 1024), errb: &errb}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			dec := json.NewDecoder(strings.NewReader(sc.Text()))
			dec.UseNumber()
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				m = map[string]any{"error": "bad json: " + sc.Text()}
			}
			p.lines <- m
		}
	}()
	t.Cleanup(func() {
		<-done
		_ = cmd.Wait()
		cancel()
	})
	return p
}

func (p *pyProc) next(t *testing.T) map[string]any {
	t.Helper()
	select {
	case m, ok := <-p.lines:
		if !ok {
			t.Fatalf("python exited early; stderr: %s", p.errb.String())
		}
		if e, ok := m["error"]; ok {
			t.Fatalf("python: %v; stderr: %s", e, p.errb.String())
		}
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("no line from python within 30s")
	}
	return nil
}

func jnum(t *testing.T, v any) uint64 {
	t.Helper()
	n, ok := v.(json.Number)
	if !ok {
		t.Fatalf("%v (%T) is not a number", v, v)
	}
	var u uint64
	if _, err := fmt.Sscan(n.String(), &u); err != nil {
		t.Fatalf("%v: %v", n, err)
	}
	return u
}

// pyEvent normalises one decoded event from python: array or map form.
func pyEvent(t *testing.T, v any, mapEvents bool) (typ string, fields int, get func(i int, key string) any) {
	t.Helper()
	if mapEvents {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("event %v is not a map", v)
		}
		return m["type"].(string), len(m), func(_ int, k string) any { return m[k] }
	}
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("event %v is not an array", v)
	}
	return a[0].(string), len(a), func(i int, _ string) any { return a[i] }
}

func pyHash(t *testing.T, v any, bytesHashes bool) string {
	t.Helper()
	if bytesHashes {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("hash %v is not bytes", v)
		}
		return m["bytes_hex"].(string)
	}
	return fmt.Sprint(jnum(t, v))
}

// TestPythonSubscriber decodes the simulator's stream with libzmq and
// msgpack-python: shapes, sequence numbers, hashes, token ids, eviction and
// AllBlocksCleared.
func TestPythonSubscriber(t *testing.T) {
	g := golden.Load(t)
	gc := g.HashCases[0] // bs16_seed0_32tok
	for _, shape := range []struct {
		name                   string
		mapEvents, bytesHashes bool
	}{{"array-int", false, false}, {"map-bytes", true, true}, {"map-int", true, false}} {
		t.Run(shape.name, func(t *testing.T) {
			e := startEngine(t, Config{
				NumGPUBlocks: 4, TimeScale: 100,
				KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@pod@sim", MapEvents: shape.mapEvents, BytesHashes: shape.bytesHashes},
			})
			py := runPy(t, "sub", e.KVEndpoint(), "kv@pod", "3", "30")
			py.next(t) // ready
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := e.WaitKVSubscribers(ctx, 1); err != nil {
				t.Fatal(err)
			}
			c := newClient(t)
			other := make([]uint64, 32)
			for i := range other {
				other[i] = uint64(1000 + i)
			}
			for _, prompt := range [][]uint64{gc.Tokens, other} {
				if st, body := postJSON(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}); st != 200 {
					t.Fatalf("status %d: %s", st, body)
				}
			}
			if !e.ResetPrefixCache() {
				t.Fatal("ResetPrefixCache refused with no request running")
			}
			wantHash := func(i int) string {
				if shape.bytesHashes {
					return gc.BlockHashesHex[i]
				}
				return fmt.Sprint(gc.BlockHashesUint64[i])
			}
			for seq := range 3 {
				m := py.next(t)
				if got := jnum(t, m["seq"]); got != uint64(seq) {
					t.Fatalf("seq %d, want %d", got, seq)
				}
				if m["topic"] != "kv@pod@sim" {
					t.Fatalf("topic %v", m["topic"])
				}
				batch := m["batch"].([]any)
				if len(batch) != 3 || jnum(t, batch[2]) != 0 {
					t.Fatalf("batch %v", batch)
				}
				evs := batch[1].([]any)
				switch seq {
				case 0:
					typ, n, get := pyEvent(t, evs[0], shape.mapEvents)
					if len(evs) != 1 || typ != "BlockStored" || (shape.mapEvents && n != 11) || (!shape.mapEvents && n != 12) {
						t.Fatalf("batch 0: %v", evs)
					}
					hs := get(1, "block_hashes").([]any)
					if len(hs) != 2 || pyHash(t, hs[0], shape.bytesHashes) != wantHash(0) || pyHash(t, hs[1], shape.bytesHashes) != wantHash(1) {
						t.Fatalf("hashes %v", hs)
					}
					if get(2, "parent_block_hash") != nil || get(5, "lora_id") != nil || get(6, "medium") != "GPU" || get(7, "lora_name") != nil {
						t.Fatalf("fields of %v", evs[0])
					}
					toks := get(3, "token_ids").([]any)
					for i, x := range toks {
						if jnum(t, x) != gc.Tokens[i] {
							t.Fatalf("token %d = %v", i, x)
						}
					}
					if jnum(t, get(4, "block_size")) != 16 || jnum(t, get(9, "group_idx")) != 0 || get(10, "kv_cache_spec_kind") != "full_attention" {
						t.Fatalf("fields of %v", evs[0])
					}
				case 1:
					// 3 usable blocks: the second prompt evicts the LRU block,
					// the first prompt's tail block.
					typ, n, get := pyEvent(t, evs[0], shape.mapEvents)
					if len(evs) != 2 || typ != "BlockRemoved" || n != 4 {
						t.Fatalf("batch 1: %v", evs)
					}
					hs := get(1, "block_hashes").([]any)
					if len(hs) != 1 || pyHash(t, hs[0], shape.bytesHashes) != wantHash(1) || get(2, "medium") != "GPU" {
						t.Fatalf("removed %v", evs[0])
					}
					if typ, _, get := pyEvent(t, evs[1], shape.mapEvents); typ != "BlockStored" || jnum(t, get(3, "token_ids").([]any)[0]) != 1000 {
						t.Fatalf("stored %v", evs[1])
					}
				case 2:
					typ, n, _ := pyEvent(t, evs[0], shape.mapEvents)
					if len(evs) != 1 || typ != "AllBlocksCleared" || n != 1 {
						t.Fatalf("batch 2: %v", evs)
					}
				}
			}
		})
	}
}

// TestPythonConnectMode: the subscriber binds and the simulator's PUB
// connects to it, as vLLM does for endpoints without "*".
func TestPythonConnectMode(t *testing.T) {
	py := runPy(t, "bindsub", "", "1", "30")
	ready := py.next(t)
	ep := ready["endpoint"].(string)
	e := startEngine(t, Config{TimeScale: 100, KVEvents: &KVEventsConfig{Endpoint: ep}})
	if e.KVEndpoint() != "" {
		t.Errorf("KVEndpoint() = %q in connect mode, want empty", e.KVEndpoint())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if st, body := postJSON(t, newClient(t), e.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("hello world ", 20), "max_tokens": 1}); st != 200 {
		t.Fatalf("status %d: %s", st, body)
	}
	m := py.next(t)
	if jnum(t, m["seq"]) != 0 || m["topic"] != "" {
		t.Fatalf("message %v", m)
	}
}

// TestPythonReplay asks the ROUTER for a replay from a DEALER in both
// reply layouts.
func TestPythonReplay(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			e := startEngine(t, Config{TimeScale: 100, KVEvents: &KVEventsConfig{
				Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", Topic: "kv@r", LegacyReplayLayout: legacy,
			}})
			if !strings.HasPrefix(e.ReplayEndpoint(), "tcp://127.0.0.1:") || !strings.HasPrefix(e.KVEndpoint(), "tcp://127.0.0.1:") {
				t.Fatalf("endpoints %q %q", e.KVEndpoint(), e.ReplayEndpoint())
			}
			c := newClient(t)
			for i := range 3 {
				prompt := strings.Repeat(fmt.Sprintf("replay %d ", i), 20)
				if st, body := postJSON(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}); st != 200 {
					t.Fatalf("status %d: %s", st, body)
				}
			}
			if got := e.Stats().BatchesPublished; got != 3 {
				t.Fatalf("%d batches published, want 3", got)
			}
			py := runPy(t, "replay", e.ReplayEndpoint(), "1", "30")
			layout := "new"
			if legacy {
				layout = "legacy"
			}
			for _, want := range []uint64{1, 2} {
				m := py.next(t)
				if m["layout"] != layout || jnum(t, m["seq"]) != want {
					t.Fatalf("reply %v, want seq %d layout %s", m, want, layout)
				}
				if !legacy && m["topic"] != "kv@r" {
					t.Fatalf("topic %v", m["topic"])
				}
				if evs := m["batch"].([]any)[1].([]any); len(evs) != 1 {
					t.Fatalf("events %v", evs)
				}
			}
			if m := py.next(t); m["end"] != true || m["layout"] != layout {
				t.Fatalf("end marker %v", m)
			}
		})
	}
}

// TestPythonSubscriberLoRA decodes an adapter request's BlockStored with
// msgpack-python: lora_id, lora_name and per-block extra_keys as vLLM's
// msgspec encoder writes them, hashes as kvindex computes them.
func TestPythonSubscriberLoRA(t *testing.T) {
	const lora, salt = "chat", "t1"
	for _, shape := range []struct {
		name                   string
		mapEvents, bytesHashes bool
	}{{"array-int", false, false}, {"map-bytes", true, true}} {
		t.Run(shape.name, func(t *testing.T) {
			e := startEngine(t, Config{
				TimeScale: 100, LoRAModules: []string{"sql", lora},
				KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", MapEvents: shape.mapEvents, BytesHashes: shape.bytesHashes},
			})
			py := runPy(t, "sub", e.KVEndpoint(), "", "1", "30")
			py.next(t) // ready
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := e.WaitKVSubscribers(ctx, 1); err != nil {
				t.Fatal(err)
			}
			prompt := make([]uint64, 32)
			for i := range prompt {
				prompt[i] = uint64(7 * i)
			}
			body := map[string]any{"model": lora, "cache_salt": salt, "prompt": prompt, "max_tokens": 1}
			if st, out := postJSON(t, newClient(t), e.URL()+"/v1/completions", body); st != 200 {
				t.Fatalf("status %d: %s", st, out)
			}
			h, err := kvindexHasher(e.Config())
			if err != nil {
				t.Fatal(err)
			}
			want, err := h.BlockHashes(nil, prompt, kvindex.RequestExtraKeys(lora, salt, 2))
			if err != nil {
				t.Fatal(err)
			}
			m := py.next(t)
			evs := m["batch"].([]any)[1].([]any)
			if len(evs) != 1 {
				t.Fatalf("events %v", evs)
			}
			typ, n, get := pyEvent(t, evs[0], shape.mapEvents)
			if typ != "BlockStored" || (shape.mapEvents && n != 11) || (!shape.mapEvents && n != 12) {
				t.Fatalf("event %v", evs[0])
			}
			if id, ok := get(5, "lora_id").(json.Number); !ok || id.String() != "2" || get(7, "lora_name") != lora {
				t.Fatalf("lora_id %v lora_name %v", get(5, "lora_id"), get(7, "lora_name"))
			}
			hs := get(1, "block_hashes").([]any)
			for i, d := range want {
				w := fmt.Sprint(d.Uint64())
				if shape.bytesHashes {
					w = hex.EncodeToString(d[:])
				}
				if got := pyHash(t, hs[i], shape.bytesHashes); got != w {
					t.Errorf("hash %d = %s, want %s", i, got, w)
				}
			}
			if got := fmt.Sprint(get(8, "extra_keys")); got != "[[chat t1] [chat]]" {
				t.Errorf("extra_keys %s", got)
			}
		})
	}
}
