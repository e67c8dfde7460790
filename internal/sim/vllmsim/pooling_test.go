package vllmsim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestPoolingEndpoints(t *testing.T) {
	e, c := apiEngine(t, Config{KVEvents: &KVEventsConfig{Endpoint: "tcp://*:0"}})
	type want struct {
		items  int    // data or results entries
		object string // data[i].object, "" for none
	}
	prompts := 0
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		want       want
	}{
		{"embeddings string", "/v1/embeddings", map[string]any{"input": "hello"}, want{1, "embedding"}},
		{"embeddings strings", "/v1/embeddings", map[string]any{"input": []string{"a", "b c"}}, want{2, "embedding"}},
		{"embeddings ids", "/v1/embeddings", map[string]any{"input": []int{1, 2, 3}}, want{1, "embedding"}},
		{"embeddings id lists", "/v1/embeddings", map[string]any{"input": [][]int{{1, 2}, {3}}}, want{2, "embedding"}},
		{"embeddings base64", "/v1/embeddings", map[string]any{"input": "x", "encoding_format": "base64"}, want{1, "embedding"}},
		{"pooling", "/pooling", map[string]any{"input": "hello"}, want{1, "pooling"}},
		{"classify", "/classify", map[string]any{"input": []string{"a", "b"}}, want{2, ""}},
		{"score text_1 text_2", "/score", map[string]any{"text_1": "q", "text_2": []string{"a", "b", "c"}}, want{3, "score"}},
		{"score queries documents", "/v1/score", map[string]any{"queries": []string{"q", "r"}, "documents": []string{"a", "b"}}, want{2, "score"}},
		{"rerank", "/rerank", map[string]any{"query": "q", "documents": []string{"a", "b", "c"}, "top_n": 2}, want{2, ""}},
		{"v1 rerank", "/v1/rerank", map[string]any{"query": "q", "documents": []string{"a", "b"}}, want{2, ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := postObject(t, c, e.URL()+tc.path, tc.body, http.StatusOK)
			list, _ := m["data"].([]any)
			if strings.HasSuffix(tc.path, "rerank") {
				list, _ = m["results"].([]any)
				if s0, s1 := path(t, list, 0, "relevance_score").(float64), path(t, list, 1, "relevance_score").(float64); s0 < s1 {
					t.Errorf("results not by decreasing relevance: %v", list)
				}
				if path(t, list, 0, "document", "text") == nil {
					t.Errorf("no document echoed: %v", list)
				}
			} else if m["object"] != "list" {
				t.Errorf("object %v", m["object"])
			}
			if len(list) != tc.want.items {
				t.Fatalf("%d entries, want %d: %v", len(list), tc.want.items, m)
			}
			if tc.want.object != "" && path(t, list, 0, "object") != tc.want.object {
				t.Errorf("entry %v", list[0])
			}
			prompts += num(t, path(t, m, "usage", "prompt_tokens"))
		})
	}
	st := e.Stats()
	if st.GenerationTokens != 0 || st.CachedBlocks != 0 || st.PrefixCacheQueries != 0 || st.EventsPublished != 0 {
		t.Errorf("pooling decoded or cached: %+v", st)
	}
	if st.PoolingRequestsServed != 20 || st.RequestsServed != 20 || st.PromptTokens != uint64(prompts) {
		t.Errorf("served %d pooling / %d requests, %d prompt tokens (answers said %d)", st.PoolingRequestsServed, st.RequestsServed, st.PromptTokens, prompts)
	}
	for p, n := range map[string]uint64{"/v1/embeddings": 5, "/pooling": 1, "/classify": 1, "/score": 1, "/v1/score": 1, "/rerank": 1, "/v1/rerank": 1} {
		if st.RequestsByEndpoint[p] != n {
			t.Errorf("RequestsByEndpoint[%s] = %d, want %d", p, st.RequestsByEndpoint[p], n)
		}
	}
}

// TestPoolingOccupiesScheduler: a pooling request runs while its prefill
// does (a slow one here) and leaves without decoding.
func TestPoolingOccupiesScheduler(t *testing.T) {
	e, c := apiEngine(t, Config{TimeScale: 1, PrefillTokensPerSec: 2000, MaxNumBatchedTokens: 64})
	done := make(chan map[string]any, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"input": strings.Repeat("word ", 300)})
		resp, err := c.Post(e.URL()+"/v1/embeddings", "application/json", bytes.NewReader(b))
		if err != nil {
			done <- nil
			return
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		done <- m
	}()
	seen := false
	deadline := time.Now().Add(10 * time.Second)
	for !seen && time.Now().Before(deadline) {
		seen = e.Stats().Running == 1
		select {
		case m := <-done:
			t.Fatalf("finished before it was seen running: %v", m)
		default:
		}
		time.Sleep(time.Millisecond)
	}
	if !seen {
		t.Fatal("the pooling request never ran")
	}
	m := <-done
	if m == nil || len(m["data"].([]any)) != 1 {
		t.Fatalf("answer %v", m)
	}
	if st := e.Stats(); st.GenerationTokens != 0 || st.Running != 0 || st.Steps < 2 {
		t.Errorf("after the request: %+v", st)
	}
}
