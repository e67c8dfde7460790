package vllmsim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/kvindex"
)

func TestLoRAConfigValidation(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		wantErr string // "" = valid
	}{
		{"none", Config{}, ""},
		{"two adapters", Config{Model: "base", LoRAModules: []string{"a", "b"}}, ""},
		{"empty name", Config{LoRAModules: []string{"a", ""}}, "lora module name is empty"},
		{"duplicate", Config{LoRAModules: []string{"a", "b", "a"}}, `lora module "a" is listed twice`},
		{"base model name", Config{Model: "base", LoRAModules: []string{"base"}}, `lora module "base" has the name of the base model`},
		{"default base model name", Config{LoRAModules: []string{defaultModel}}, "has the name of the base model"},
		{"too many", Config{LoRAModules: manyNames(maxLoRAModules + 1)}, "lora modules, at most"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.cfg.withDefaults()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("withDefaults: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("withDefaults error %v, want one containing %q", err, tc.wantErr)
			case tc.wantErr == "" && !slices.Equal(got.LoRAModules, tc.cfg.LoRAModules):
				t.Fatalf("LoRAModules %q, want %q", got.LoRAModules, tc.cfg.LoRAModules)
			}
		})
	}
	// The engine keeps its own copy: the caller's slice may change later.
	names := []string{"a", "b"}
	e := startEngine(t, Config{TimeScale: 100, LoRAModules: names})
	names[0] = "changed"
	if got := e.Config().LoRAModules; !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Config().LoRAModules = %q after the caller changed its slice", got)
	}
	if _, err := Start(context.Background(), Config{LoRAModules: []string{"x", "x"}}); err == nil {
		t.Error("Start accepted a duplicate adapter")
	}
}

func manyNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("adapter-%d", i)
	}
	return out
}

// modelResp is the part of a completion response or chunk that names the
// model.
type modelResp struct {
	Model  string `json:"model"`
	Object string `json:"object"`
}

func TestLoRARequestsAndModels(t *testing.T) {
	e := startEngine(t, Config{Model: "base", TimeScale: 100, MaxModelLen: 4096, LoRAModules: []string{"sql", "chat-style"}})
	c := newClient(t)

	resp, err := c.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string  `json:"id"`
			Object      string  `json:"object"`
			Root        string  `json:"root"`
			Parent      *string `json:"parent"`
			MaxModelLen *int    `json:"max_model_len"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || models.Object != "list" || len(models.Data) != 3 {
		t.Fatalf("models %+v (%v)", models, err)
	}
	if m := models.Data[0]; m.ID != "base" || m.Root != "base" || m.Parent != nil || m.MaxModelLen == nil || *m.MaxModelLen != 4096 {
		t.Errorf("base model card %+v", m)
	}
	for i, name := range []string{"sql", "chat-style"} {
		m := models.Data[i+1]
		if m.ID != name || m.Object != "model" || m.Parent == nil || *m.Parent != "base" || m.Root != "/sim/lora/"+name || m.MaxModelLen != nil {
			t.Errorf("adapter card %d: %+v", i, m)
		}
	}

	msgs := []any{map[string]any{"role": "user", "content": "hello there"}}
	for _, tc := range []struct {
		name, url string
		body      map[string]any
		want      string
	}{
		{"completion adapter", "/v1/completions", map[string]any{"model": "sql", "prompt": "select", "max_tokens": 2}, "sql"},
		{"chat adapter", "/v1/chat/completions", map[string]any{"model": "chat-style", "messages": msgs, "max_tokens": 2}, "chat-style"},
		{"completion base", "/v1/completions", map[string]any{"model": "base", "prompt": "select", "max_tokens": 2}, "base"},
		{"no model", "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 2}, "base"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, out := postJSON(t, c, e.URL()+tc.url, tc.body)
			var r modelResp
			if st != http.StatusOK || json.Unmarshal(out, &r) != nil || r.Model != tc.want {
				t.Fatalf("status %d model %q, want 200 %q: %s", st, r.Model, tc.want, out)
			}
		})
		t.Run(tc.name+" stream", func(t *testing.T) {
			body := merge(tc.body, map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}})
			chunks := streamChunks(t, c, e.URL()+tc.url, body)
			if len(chunks) < 3 { // 2 tokens and usage, plus the role chunk for chat
				t.Fatalf("%d chunks", len(chunks))
			}
			for i, ch := range chunks {
				var r modelResp
				if err := json.Unmarshal([]byte(ch), &r); err != nil || r.Model != tc.want {
					t.Fatalf("chunk %d model %q, want %q: %s", i, r.Model, tc.want, ch)
				}
			}
		})
	}

	// The adapter runs the base model's tokenizer.
	base := tokenizeReq(t, c, e, map[string]any{"model": "base", "prompt": "select * from t"})
	if got := tokenizeReq(t, c, e, map[string]any{"model": "sql", "prompt": "select * from t"}); !slices.Equal(got, base) || len(base) == 0 {
		t.Errorf("adapter tokens %v, base %v", got, base)
	}

	for _, tc := range []struct{ url, model string }{
		{"/v1/completions", "nope"},
		{"/v1/chat/completions", "nope"},
		{"/tokenize", "nope"},
		{"/v1/completions", "/sim/lora/sql"}, // an adapter's path is not a model name
		{"/v1/completions", "SQL"},
	} {
		body := map[string]any{"model": tc.model, "prompt": "x", "messages": msgs}
		if tc.url == "/tokenize" {
			delete(body, "messages")
		}
		st, out := postJSON(t, c, e.URL()+tc.url, body)
		var er apiError
		if st != http.StatusNotFound || json.Unmarshal(out, &er) != nil || er.Error.Type != "NotFoundError" ||
			er.Error.Param == nil || *er.Error.Param != "model" || !strings.Contains(er.Error.Message, tc.model) {
			t.Errorf("%s model %q: %d %s", tc.url, tc.model, st, out)
		}
	}
}

// merge returns the union of a and b (b wins).
func merge(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// streamChunks posts a streaming request and returns the data of its SSE
// events before [DONE].
func streamChunks(t *testing.T, c *http.Client, url string, body map[string]any) []string {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Post(url, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return out
		}
		out = append(out, data)
	}
	t.Fatalf("stream ended without [DONE]: %v", sc.Err())
	return nil
}

// TestLoRAPrefixCacheIsolation: an adapter's blocks are hashed with its
// name, so the same prompt never hits the base model's blocks or another
// adapter's, and does hit its own.
func TestLoRAPrefixCacheIsolation(t *testing.T) {
	e := startEngine(t, Config{Model: "base", TimeScale: 100, LoRAModules: []string{"a", "b"}})
	c := newClient(t)
	prompt := strings.Repeat("one prompt for every model ", 12)
	n := complete(t, c, e.URL()+"/v1/completions", map[string]any{"model": "base", "prompt": prompt, "max_tokens": 1}).Usage.PromptTokens
	full := (n - 1) / 16 * 16
	if full < 32 {
		t.Fatalf("prompt of %d tokens is too short", n)
	}
	steps := []struct {
		model, salt string
		want        int
	}{
		{"a", "", 0},       // base's blocks are not a's
		{"a", "", full},    // a's own
		{"b", "", 0},       // nor another adapter's
		{"base", "", full}, // base's blocks survived
		{"", "", full},     // no model is the base model
		{"b", "", full},
		{"a", "s1", 0}, // salt on block 0 (with the adapter) changes the whole chain
		{"a", "s1", full},
		{"b", "s1", 0},
		{"base", "s1", 0},
	}
	for i, s := range steps {
		body := map[string]any{"prompt": prompt, "max_tokens": 1}
		if s.model != "" {
			body["model"] = s.model
		}
		if s.salt != "" {
			body["cache_salt"] = s.salt
		}
		if got := cachedTokens(complete(t, c, e.URL()+"/v1/completions", body)); got != s.want {
			t.Errorf("step %d (model %q salt %q): cached_tokens %d, want %d", i, s.model, s.salt, got, s.want)
		}
	}
	if st := e.Stats(); st.CachedTokens != uint64(5*full) {
		t.Errorf("stats: %d cached tokens, want %d", st.CachedTokens, 5*full)
	}
}

// TestLoRAEventsMatchKvindex: an adapter request's BlockStored events, for
// prompt blocks and for blocks filled by generated tokens, carry lora_name,
// lora_id and per-block extra_keys, and their hashes are kvindex.Hasher's
// with kvindex.RequestExtraKeys, in every wire shape. The gateway's own
// decoder reads them back.
func TestLoRAEventsMatchKvindex(t *testing.T) {
	const lora, salt, blocks = "tenant-b", "salt-1", 4
	for _, shape := range []struct {
		name                   string
		mapEvents, bytesHashes bool
	}{{"array-int", false, false}, {"map-int", true, false}, {"array-bytes", false, true}, {"map-bytes", true, true}} {
		for _, useSalt := range []bool{false, true} {
			name := shape.name
			if useSalt {
				name += "/salt"
			}
			t.Run(name, func(t *testing.T) {
				cfg := Config{BlockSize: 16, HashSeed: "7", TimeScale: 100, LoRAModules: []string{"tenant-a", lora},
					KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", MapEvents: shape.mapEvents, BytesHashes: shape.bytesHashes}}
				e := startEngine(t, cfg)
				sub := dialSub(t, e.KVEndpoint(), "")
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := e.WaitKVSubscribers(ctx, 1); err != nil {
					t.Fatal(err)
				}
				// 40 prompt tokens: 2 full prompt blocks; the generated ones
				// fill blocks 2 and 3 over later steps.
				prompt := make([]uint64, 40)
				for i := range prompt {
					prompt[i] = uint64(500 + i)
				}
				body := map[string]any{"model": lora, "prompt": prompt, "max_tokens": blocks*16 - 40 + 1}
				wantSalt := ""
				if useSalt {
					body["cache_salt"], wantSalt = salt, salt
				}
				if st, out := postJSON(t, newClient(t), e.URL()+"/v1/completions", body); st != 200 {
					t.Fatalf("status %d: %s", st, out)
				}

				var tokens []uint64
				var hashes []uint64
				var extras []any
				dec := kvindex.NewDecoder()
				for len(hashes) < blocks {
					payload := sub.next(t, 10*time.Second)[2]
					for _, raw := range decodeBatch(t, payload).events {
						ev := asEvent(t, raw, shape.mapEvents)
						if ev.typ != "BlockStored" {
							t.Fatalf("unexpected %s", ev.typ)
						}
						if ev.loraID == nil || toInt(ev.loraID) != 2 || ev.loraName != lora {
							t.Fatalf("lora_id %v lora_name %v, want 2 %q", ev.loraID, ev.loraName, lora)
						}
						if len(hashes) == 0 && ev.parent != nil {
							t.Fatalf("first event has parent %v", ev.parent)
						}
						if len(hashes) > 0 && (ev.parent == nil || hashU64(t, ev.parent) != hashes[len(hashes)-1]) {
							t.Fatalf("parent %v, want %d", ev.parent, hashes[len(hashes)-1])
						}
						if len(ev.extra) != len(ev.hashes) || len(ev.tokens) != 16*len(ev.hashes) {
							t.Fatalf("%d hashes, %d extra_keys, %d tokens", len(ev.hashes), len(ev.extra), len(ev.tokens))
						}
						for _, h := range ev.hashes {
							hashes = append(hashes, hashU64(t, h))
						}
						extras = append(extras, ev.extra...)
						tokens = append(tokens, ev.tokens...)
					}
					// kvindex's decoder sees the same adapter fields.
					b, err := dec.Decode(payload)
					if err != nil {
						t.Fatalf("kvindex decode: %v", err)
					}
					for _, ev := range b.Events {
						if ev.LoRAName != lora || !ev.HasLoRAID || ev.LoRAID != 2 || len(ev.ExtraKeys) != len(ev.BlockHashes) {
							t.Fatalf("kvindex event lora %q id %d/%v extra %v", ev.LoRAName, ev.LoRAID, ev.HasLoRAID, ev.ExtraKeys)
						}
					}
				}
				if len(hashes) != blocks || !slices.Equal(tokens[:40], prompt) {
					t.Fatalf("%d hashes; tokens %v", len(hashes), tokens)
				}
				wantExtra := kvindex.RequestExtraKeys(lora, wantSalt, blocks)
				h, err := kvindex.NewHasher(cfg.HashSeed, cfg.BlockSize)
				if err != nil {
					t.Fatal(err)
				}
				want, err := h.BlockHashes(nil, tokens, wantExtra)
				if err != nil {
					t.Fatal(err)
				}
				for i := range blocks {
					if hashes[i] != want[i].Uint64() {
						t.Errorf("block %d hash %d, want %d", i, hashes[i], want[i].Uint64())
					}
					if got, _ := extras[i].([]any); !reflect.DeepEqual(got, wantExtra[i]) {
						t.Errorf("block %d extra_keys %v, want %v", i, extras[i], wantExtra[i])
					}
				}
				// The same tokens without the adapter hash differently.
				plain, _ := h.BlockHashes(nil, tokens, nil)
				if plain[0] == want[0] {
					t.Error("adapter and base hashes agree")
				}
			})
		}
	}
}

// TestLoRARequestsInfoMetric: vllm:lora_requests_info names the adapters of
// running requests, and is absent without adapters.
func TestLoRARequestsInfoMetric(t *testing.T) {
	plain := startEngine(t, Config{TimeScale: 100})
	c := newClient(t)
	if _, ok := scrape(t, c, plain)["vllm:lora_requests_info"]; ok {
		t.Error("lora_requests_info without adapters")
	}

	e := startEngine(t, Config{TimeScale: 1, MaxNumSeqs: 1, LoRAModules: []string{"a", "b", "c"}})
	info := func() map[string]string {
		fams := scrape(t, c, e)
		f, ok := fams["vllm:lora_requests_info"]
		if !ok || len(f.Metric) != 1 || f.Metric[0].Gauge == nil {
			t.Fatalf("lora_requests_info %v", f)
		}
		if v := f.Metric[0].Gauge.GetValue(); time.Since(time.Unix(int64(v), 0)).Abs() > time.Hour {
			t.Errorf("value %v is not a current timestamp", v)
		}
		labels := map[string]string{}
		for _, l := range f.Metric[0].Label {
			labels[l.GetName()] = l.GetValue()
		}
		return labels
	}
	if got := info(); !reflect.DeepEqual(got, map[string]string{"max_lora": "3", "running_lora_adapters": "", "waiting_lora_adapters": ""}) {
		t.Errorf("idle labels %v", got)
	}
	// One running request for c (max_num_seqs 1), then one waiting for a:
	// long enough (200 steps of 20 ms) to be seen.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{}, 2)
	for _, model := range []string{"c", "a"} {
		b, _ := json.Marshal(map[string]any{"model": model, "prompt": "long one", "max_tokens": 200})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer func() { done <- struct{}{} }()
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		for deadline := time.Now().Add(10 * time.Second); ; {
			if st := e.Stats(); (model == "c" && st.Running == 1) || (model == "a" && st.Waiting == 1) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("request for %s not queued: %+v", model, e.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if got := info(); got["running_lora_adapters"] != "c" || got["waiting_lora_adapters"] != "a" {
		t.Errorf("busy labels %v", got)
	}
	cancel()
	<-done
	<-done
}
