package vllmsim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

type completionResp struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func complete(t *testing.T, c *http.Client, url string, body map[string]any) completionResp {
	t.Helper()
	st, out := postJSON(t, c, url, body)
	if st != http.StatusOK {
		t.Fatalf("status %d: %s", st, out)
	}
	var r completionResp
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	return r
}

func cachedTokens(r completionResp) int {
	if r.Usage.PromptTokensDetails == nil {
		return 0
	}
	return r.Usage.PromptTokensDetails.CachedTokens
}

func scrape(t *testing.T, c *http.Client, e *Engine) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := c.Get(e.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	return fams
}

func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok || len(f.Metric) != 1 {
		t.Fatalf("metric %s missing", name)
	}
	m := f.Metric[0]
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return m.Histogram.GetSampleSum()
	}
	t.Fatalf("metric %s has no value", name)
	return 0
}

func TestPrefixReuseLowersPrefillAndReportsCachedTokens(t *testing.T) {
	// Slow prefill: 2000 uncached tokens take 1 s; a cached prefix ~20 ms.
	e := startEngine(t, Config{PrefillTokensPerSec: 2000, DecodeStepTime: 10 * time.Millisecond, TimeScale: 20})
	c := newClient(t)
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 220) // ~2000 tokens
	first := complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2})
	ttft1 := gauge(t, scrape(t, c, e), "vllm:time_to_first_token_seconds")
	second := complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2})
	ttft2 := gauge(t, scrape(t, c, e), "vllm:time_to_first_token_seconds") - ttft1

	if first.Usage.PromptTokensDetails != nil {
		t.Errorf("first request reports cached tokens %+v; vLLM gives null when 0", first.Usage.PromptTokensDetails)
	}
	n := first.Usage.PromptTokens
	want := (n - 1) / 16 * 16 // whole blocks, the last token is always recomputed
	if got := cachedTokens(second); got != want || want == 0 {
		t.Errorf("second request cached_tokens = %d, want %d (prompt %d tokens)", got, want, n)
	}
	if first.Choices[0].Text != second.Choices[0].Text {
		t.Errorf("outputs differ for identical requests: %q vs %q", first.Choices[0].Text, second.Choices[0].Text)
	}
	// Behaviour, with a wide margin: ~1 s simulated prefill against ~0.02 s.
	if !(ttft2 < ttft1/3) {
		t.Errorf("TTFT with cached prefix %.3fs is not well below uncached %.3fs", ttft2, ttft1)
	}
	st := e.Stats()
	if st.CachedTokens != uint64(want) || st.PrefixCacheQueries != uint64(2*n) || st.RequestsServed != 2 || st.PromptTokens != uint64(2*n) {
		t.Errorf("stats %+v", st)
	}
	fams := scrape(t, c, e)
	if got := gauge(t, fams, "vllm:prefix_cache_hits_total"); got != float64(want) {
		t.Errorf("prefix_cache_hits_total %v, want %d", got, want)
	}
	if got := gauge(t, fams, "vllm:prefix_cache_queries_total"); got != float64(2*n) {
		t.Errorf("prefix_cache_queries_total %v, want %d", got, 2*n)
	}
	if got := gauge(t, fams, "vllm:generation_tokens_total"); got != 4 {
		t.Errorf("generation_tokens_total %v, want 4", got)
	}
}

// TestEvictionEmitsBlockRemoved fills a small cache and checks that every
// evicted block is announced once and no longer hits.
func TestEvictionEmitsBlockRemoved(t *testing.T) {
	e := startEngine(t, Config{NumGPUBlocks: 9, TimeScale: 100, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0"}})
	sub := dialSub(t, e.KVEndpoint(), "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	stored := map[uint64]bool{}
	removed := map[uint64]int{}
	// Four 64-token prompts (4 blocks each) through 8 usable blocks.
	for i := range 4 {
		prompt := make([]uint64, 64)
		for j := range prompt {
			prompt[j] = uint64(i*100 + j)
		}
		complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
		b := decodeBatch(t, sub.next(t, 10*time.Second)[2])
		for _, raw := range b.events {
			ev := asEvent(t, raw, false)
			for _, h := range ev.hashes {
				u := hashU64(t, h)
				switch ev.typ {
				case "BlockStored":
					stored[u] = true
				case "BlockRemoved":
					if !stored[u] {
						t.Errorf("removed %d that was never stored", u)
					}
					removed[u]++
					delete(stored, u)
				}
			}
		}
	}
	if len(removed) != 8 || len(stored) != 8 {
		t.Errorf("%d removed, %d still stored; want 8 and 8", len(removed), len(stored))
	}
	for h, n := range removed {
		if n != 1 {
			t.Errorf("hash %d removed %d times", h, n)
		}
	}
	if st := e.Stats(); st.CachedBlocks != 8 || st.KVCacheUsage != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestMaxNumSeqsQueuesTheRest(t *testing.T) {
	e := startEngine(t, Config{MaxNumSeqs: 2, DecodeStepTime: 20 * time.Millisecond})
	c := newClient(t)
	done := make(chan error, 6)
	for i := range 6 {
		go func() {
			st, out := postJSON(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": fmt.Sprintf("request %d", i), "max_tokens": 15})
			if st != 200 {
				done <- fmt.Errorf("status %d: %s", st, out)
				return
			}
			done <- nil
		}()
	}
	sawWaiting, gaugeWaiting := false, false
	deadline := time.Now().Add(30 * time.Second)
	for finished := 0; finished < 6; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			finished++
		case <-time.After(5 * time.Millisecond):
		}
		st := e.Stats()
		if st.Running > 2 {
			t.Fatalf("%d running with max_num_seqs 2", st.Running)
		}
		if st.Waiting > 0 && st.Running == 2 && !gaugeWaiting {
			// The gauge shows the queue as of the last step, so it may
			// trail the live queue by a step: look until it shows.
			sawWaiting = true
			gaugeWaiting = gauge(t, scrape(t, c, e), "vllm:num_requests_waiting") > 0
		}
		if time.Now().After(deadline) {
			t.Fatal("requests did not finish")
		}
	}
	if !sawWaiting {
		t.Error("never saw waiting requests with 6 concurrent and max_num_seqs 2")
	} else if !gaugeWaiting {
		t.Error("num_requests_waiting gauge never above 0 while requests waited")
	}
	if st := e.Stats(); st.RequestsServed != 6 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestPreemptionWhenBlocksRunOut(t *testing.T) {
	// 6 usable blocks of 4 tokens; 3 requests of 4 prompt tokens each grow
	// to 12 tokens (3 blocks): they cannot all fit, so decoding preempts.
	// They are submitted together (steps of 5 ms leave no time for one to
	// finish first).
	e := startEngine(t, Config{NumGPUBlocks: 7, BlockSize: 4, DecodeStepTime: 5 * time.Millisecond})
	var reqs []*simRequest
	for i := range 3 {
		maxTokens := 8
		sr, err := e.newSimRequest(&genRequest{Prompt: json.RawMessage(fmt.Sprintf("[%d,%d,%d,%d]", i, i+1, i+2, i+3)), MaxTokens: &maxTokens}, servedModel{name: e.cfg.Model}, false)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, sr)
	}
	for _, sr := range reqs {
		if err := e.submit(sr); err != nil {
			t.Fatal(err)
		}
	}
	for _, sr := range reqs {
		deadline := time.After(30 * time.Second)
		for {
			out, done, err := sr.progress()
			if done {
				if err != nil || out != 8 {
					t.Fatalf("request ended with %d tokens, %v", out, err)
				}
				break
			}
			select {
			case <-sr.notify:
			case <-time.After(10 * time.Millisecond):
			case <-deadline:
				t.Fatal("request did not finish")
			}
		}
	}
	if st := e.Stats(); st.Preemptions == 0 || st.RequestsServed != 3 || st.KVCacheUsage != 0 {
		t.Errorf("stats %+v, want preemptions > 0, 3 served, no block in use", st)
	}
}

func TestRestart(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 1, DecodeStepTime: 20 * time.Millisecond, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}})
	kvEP, replayEP := e.KVEndpoint(), e.ReplayEndpoint()
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := dialSub(t, kvEP, "")
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat("restart me please ", 10)
	complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	if seq := binary.BigEndian.Uint64(sub.next(t, 5*time.Second)[1]); seq != 0 {
		t.Fatalf("seq %d", seq)
	}
	complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("a different prompt ", 10), "max_tokens": 1})
	sub.next(t, 5*time.Second)

	// A long stream is in flight when the engine restarts.
	body, _ := json.Marshal(map[string]any{"prompt": "long stream", "max_tokens": 1000, "stream": true})
	resp, err := c.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err == nil || bytes.Contains(rest, []byte("[DONE]")) {
		t.Errorf("stream survived the restart: err %v, %d more bytes", err, len(rest))
	}
	// The old subscription connection is gone.
	select {
	case _, ok := <-sub.msgs:
		if ok {
			t.Error("message after restart on the old connection")
		}
	case <-time.After(5 * time.Second):
		t.Error("old subscriber connection still open")
	}
	if e.KVEndpoint() != kvEP || e.ReplayEndpoint() != replayEP {
		t.Errorf("endpoints moved: %s %s -> %s %s", kvEP, replayEP, e.KVEndpoint(), e.ReplayEndpoint())
	}
	if st := e.Stats(); st.CachedBlocks != 0 || st.RequestsServed != 0 || st.Restarts != 1 {
		t.Errorf("stats after restart %+v", st)
	}
	sub2 := dialSub(t, kvEP, "")
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r := complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	if cachedTokens(r) != 0 {
		t.Errorf("cache survived the restart: %d cached tokens", cachedTokens(r))
	}
	msg := sub2.next(t, 5*time.Second)
	if seq := binary.BigEndian.Uint64(msg[1]); seq != 0 {
		t.Errorf("first seq after restart %d, want 0", seq)
	}
	for _, raw := range decodeBatch(t, msg[2]).events {
		if ev := asEvent(t, raw, false); ev.typ != "BlockStored" {
			t.Errorf("restart published %s", ev.typ)
		}
	}
}

func TestResetPrefixCache(t *testing.T) {
	e := startEngine(t, Config{DecodeStepTime: 10 * time.Millisecond, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", MapEvents: true}})
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := dialSub(t, e.KVEndpoint(), "")
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat("reset the cache ", 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 50})
	}()
	for e.Stats().Running == 0 {
		time.Sleep(time.Millisecond)
	}
	if e.ResetPrefixCache() {
		t.Error("reset succeeded while a request holds blocks")
	}
	if st, _ := postJSON(t, c, e.URL()+"/reset_prefix_cache", nil); st == 200 {
		t.Error("POST /reset_prefix_cache answered 200 while blocks are in use")
	}
	<-done
	// Stored batches may precede AllBlocksCleared; skip them.
	if st, out := postJSON(t, c, e.URL()+"/reset_prefix_cache", nil); st != 200 {
		t.Fatalf("POST /reset_prefix_cache: %d %s", st, out)
	}
	var cleared bool
	for !cleared {
		b := decodeBatch(t, sub.next(t, 5*time.Second)[2])
		for _, raw := range b.events {
			if ev := asEvent(t, raw, true); ev.typ == "AllBlocksCleared" {
				cleared = true
				if ev.nfields != 1 {
					t.Errorf("AllBlocksCleared map has %d fields", ev.nfields)
				}
			}
		}
	}
	if r := complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}); cachedTokens(r) != 0 {
		t.Errorf("%d cached tokens after reset", cachedTokens(r))
	}
}

// sseEvents reads an SSE body into its data payloads, checking framing.
func sseEvents(t *testing.T, body io.Reader) ([]string, error) {
	t.Helper()
	br := bufio.NewReader(body)
	var out []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" {
				return out, nil
			}
			return out, err
		}
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("SSE line %q", line)
		}
		blank, err := br.ReadString('\n')
		if err != nil || blank != "\n" {
			t.Fatalf("SSE event not followed by a blank line: %q %v", blank, err)
		}
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(line, "data: "), "\n"))
	}
}

func TestStreamingSSE(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100})
	c := newClient(t)
	msgs := []map[string]any{{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}}
	for _, chat := range []bool{true, false} {
		t.Run(fmt.Sprintf("chat=%v", chat), func(t *testing.T) {
			url := e.URL() + "/v1/completions"
			req := map[string]any{"prompt": "Say something.", "max_tokens": 5}
			if chat {
				url = e.URL() + "/v1/chat/completions"
				req = map[string]any{"messages": msgs, "max_tokens": 5}
			}
			plain := complete(t, c, url, req)
			req["stream"] = true
			req["stream_options"] = map[string]any{"include_usage": true}
			b, _ := json.Marshal(req)
			resp, err := c.Post(url, "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Errorf("content type %q", ct)
			}
			events, err := sseEvents(t, resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if len(events) < 3 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("events %q", events)
			}
			var text strings.Builder
			var finish []string
			var usageSeen bool
			for i, ev := range events[:len(events)-1] {
				var chunk struct {
					Object  string `json:"object"`
					Choices []struct {
						Text  string `json:"text"`
						Delta struct {
							Role    string  `json:"role"`
							Content *string `json:"content"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
					Usage *struct {
						PromptTokens     int `json:"prompt_tokens"`
						CompletionTokens int `json:"completion_tokens"`
					} `json:"usage"`
				}
				if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
					t.Fatalf("chunk %q: %v", ev, err)
				}
				if chunk.Usage != nil {
					if len(chunk.Choices) != 0 || i != len(events)-2 {
						t.Errorf("usage chunk %q is not the last before [DONE] with no choices", ev)
					}
					if chunk.Usage.CompletionTokens != 5 || chunk.Usage.PromptTokens != plain.Usage.PromptTokens {
						t.Errorf("usage %+v", chunk.Usage)
					}
					usageSeen = true
					continue
				}
				wantObj := "text_completion"
				if chat {
					wantObj = "chat.completion.chunk"
				}
				if chunk.Object != wantObj || len(chunk.Choices) != 1 {
					t.Fatalf("chunk %q", ev)
				}
				ch := chunk.Choices[0]
				if chat && i == 0 && ch.Delta.Role != "assistant" {
					t.Errorf("first chat chunk has no role: %q", ev)
				}
				text.WriteString(ch.Text)
				if ch.Delta.Content != nil {
					text.WriteString(*ch.Delta.Content)
				}
				if ch.FinishReason != nil {
					finish = append(finish, *ch.FinishReason)
				}
			}
			want := plain.Choices[0].Text
			if chat {
				want = plain.Choices[0].Message.Content
			}
			if text.String() != want {
				t.Errorf("streamed text %q, non-streamed %q", text.String(), want)
			}
			if len(finish) != 1 || finish[0] != "length" {
				t.Errorf("finish reasons %q", finish)
			}
			if !usageSeen {
				t.Error("no usage chunk with include_usage")
			}
		})
	}
}

func tokenizeReq(t *testing.T, c *http.Client, e *Engine, body map[string]any) []uint64 {
	t.Helper()
	st, out := postJSON(t, c, e.URL()+"/tokenize", body)
	if st != 200 {
		t.Fatalf("tokenize %d: %s", st, out)
	}
	var r struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint64 `json:"tokens"`
		TokenStrs   any      `json:"token_strs"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if r.Count != len(r.Tokens) || r.MaxModelLen != e.cfg.MaxModelLen || r.TokenStrs != nil || !bytes.Contains(out, []byte(`"token_strs":null`)) {
		t.Fatalf("tokenize response %s", out)
	}
	return r.Tokens
}

// TestTokenizeMatchesWhatTheEngineHashes: /tokenize (both forms) yields the
// token ids the completion endpoints count and announce in BlockStored.
func TestTokenizeMatchesWhatTheEngineHashes(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0"}})
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := dialSub(t, e.KVEndpoint(), "")
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	msgs := []map[string]any{
		{"role": "system", "content": "You are a helpful assistant. " + strings.Repeat("Be precise. ", 10)},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "What is a KV cache?"}}},
	}
	tools := []map[string]any{{"type": "function", "function": map[string]any{"name": "lookup", "parameters": map[string]any{"type": "object"}}}}
	cases := []struct {
		name     string
		tokenize map[string]any
		url      string
		request  map[string]any
	}{
		{"chat", map[string]any{"messages": msgs}, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1}},
		{"chat+tools", map[string]any{"messages": msgs, "tools": tools}, "/v1/chat/completions", map[string]any{"messages": msgs, "tools": tools, "max_tokens": 1}},
		{"prompt", map[string]any{"prompt": "Once upon a time, " + strings.Repeat("there was a cache. ", 12)}, "/v1/completions",
			map[string]any{"prompt": "Once upon a time, " + strings.Repeat("there was a cache. ", 12), "max_tokens": 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			toks := tokenizeReq(t, c, e, tc.tokenize)
			r := complete(t, c, e.URL()+tc.url, tc.request)
			if r.Usage.PromptTokens != len(toks) {
				t.Fatalf("prompt_tokens %d, /tokenize count %d", r.Usage.PromptTokens, len(toks))
			}
			ev := asEvent(t, decodeBatch(t, sub.next(t, 5*time.Second)[2]).events[0], false)
			full := len(toks) / 16 * 16
			if len(ev.tokens) != full {
				t.Fatalf("stored %d tokens, want %d", len(ev.tokens), full)
			}
			for i := range ev.tokens {
				if ev.tokens[i] != toks[i] {
					t.Fatalf("token %d: engine %d, /tokenize %d", i, ev.tokens[i], toks[i])
				}
			}
		})
	}
	// add_generation_prompt=false drops the assistant header; the chat form
	// adds no BOS by default, the prompt form does.
	withGen := tokenizeReq(t, c, e, map[string]any{"messages": msgs})
	noGen := tokenizeReq(t, c, e, map[string]any{"messages": msgs, "add_generation_prompt": false})
	if len(noGen) >= len(withGen) || !equalPrefix(noGen, withGen) {
		t.Errorf("add_generation_prompt=false: %d tokens vs %d", len(noGen), len(withGen))
	}
	if withGen[0] != tokImStart {
		t.Errorf("chat form starts with %d", withGen[0])
	}
	p := tokenizeReq(t, c, e, map[string]any{"prompt": "hello"})
	q := tokenizeReq(t, c, e, map[string]any{"prompt": "hello", "add_special_tokens": false})
	if len(p) != 2 || p[0] != tokBOS || len(q) != 1 || q[0] != p[1] {
		t.Errorf("add_special_tokens: %v vs %v", p, q)
	}
}

func equalPrefix(a, b []uint64) bool {
	if len(a) > len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestMetricsExposition(t *testing.T) {
	e := startEngine(t, Config{Model: "my/model", DPRank: 2, NumGPUBlocks: 1000, BlockSize: 32, TimeScale: 100})
	c := newClient(t)
	complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": "hi there", "max_tokens": 3})
	fams := scrape(t, c, e)
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds"} {
		f, ok := fams[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		labels := map[string]string{}
		for _, l := range f.Metric[0].Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model_name"] != "my/model" || labels["engine"] != "2" {
			t.Errorf("%s labels %v", name, labels)
		}
	}
	if f := fams["vllm:time_to_first_token_seconds"]; f.GetType() != dto.MetricType_HISTOGRAM || f.Metric[0].Histogram.GetSampleCount() != 1 || len(f.Metric[0].Histogram.Bucket) != len(ttftBuckets)+1 {
		t.Errorf("ttft histogram %v", f)
	}
	if f := fams["vllm:prompt_tokens_total"]; f.GetType() != dto.MetricType_COUNTER || f.Metric[0].Counter.GetValue() != 3 {
		t.Errorf("prompt_tokens_total %v", f)
	}
	cci := fams["vllm:cache_config_info"]
	if cci == nil || cci.Metric[0].Gauge.GetValue() != 1 {
		t.Fatalf("cache_config_info %v", cci)
	}
	labels := map[string]string{}
	for _, l := range cci.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	for k, v := range map[string]string{"block_size": "32", "num_gpu_blocks": "1000", "enable_prefix_caching": "True", "prefix_caching_hash_algo": "sha256_cbor", "engine": "2"} {
		if labels[k] != v {
			t.Errorf("cache_config_info %s=%q, want %q", k, labels[k], v)
		}
	}
	if _, ok := labels["model_name"]; ok {
		t.Error("cache_config_info has model_name")
	}
}

func TestModelsHealthAndErrors(t *testing.T) {
	e := startEngine(t, Config{Model: "sim-a", TimeScale: 100, MaxModelLen: 64})
	c := newClient(t)
	resp, err := c.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Data) != 1 || models.Data[0].ID != "sim-a" || models.Data[0].MaxModelLen != 64 {
		t.Errorf("models %+v", models)
	}
	if resp, err := c.Get(e.URL() + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("health %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	cases := []struct {
		name   string
		url    string
		body   any
		status int
		typ    string
	}{
		{"unknown model", "/v1/completions", map[string]any{"model": "nope", "prompt": "x"}, 404, "NotFoundError"},
		{"unknown model chat", "/v1/chat/completions", map[string]any{"model": "nope", "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 404, "NotFoundError"},
		{"too long", "/v1/completions", map[string]any{"prompt": strings.Repeat("word ", 60), "max_tokens": 10}, 400, "BadRequestError"},
		{"bad json", "/v1/completions", "{", 400, "BadRequestError"},
		{"no prompt", "/v1/completions", map[string]any{"max_tokens": 1}, 400, "BadRequestError"},
		{"image part", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image_url"}}}}}, 400, "BadRequestError"},
		{"max_tokens 0", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 0}, 400, "BadRequestError"},
		{"token out of vocab", "/v1/completions", map[string]any{"prompt": []uint64{1 << 40}}, 400, "BadRequestError"},
		{"tokenize nothing", "/tokenize", map[string]any{}, 400, "BadRequestError"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var st int
			var out []byte
			if s, ok := tc.body.(string); ok {
				resp, err := c.Post(e.URL()+tc.url, "application/json", strings.NewReader(s))
				if err != nil {
					t.Fatal(err)
				}
				out, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				st = resp.StatusCode
			} else {
				st, out = postJSON(t, c, e.URL()+tc.url, tc.body)
			}
			var er apiError
			if st != tc.status || json.Unmarshal(out, &er) != nil || er.Error.Code != tc.status || er.Error.Type != tc.typ || er.Error.Message == "" {
				t.Errorf("got %d %s", st, out)
			}
		})
	}
}
