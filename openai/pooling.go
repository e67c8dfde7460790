package openai

import "encoding/json"

// The pooling endpoints (/v1/embeddings, /pooling, /classify, /score,
// /rerank) run the prompt through the model and return a pooled output:
// prefill only, no generated token, so they cost their prompt tokens and
// nothing else. Their request models are in vLLM's
// vllm/entrypoints/pooling/*/protocol.py; the score and rerank ones at
// vLLM commit 004706d84ceba73d7efe0458e6f682c8691ff904
// (vllm/entrypoints/pooling/scoring/protocol.py).

// scorePairs are the key pairs of vLLM's ScoreRequest union, in the order
// it tries them, then RerankRequest's.
var scorePairs = [][2]string{
	{"queries", "documents"},
	{"queries", "items"},
	{"data_1", "data_2"},
	{"text_1", "text_2"},
	{"query", "documents"},
}

// ParsePooling parses a pooling request body: Model, CacheSalt, the
// "input" of embeddings, pooling and classify requests as Prompt (a
// string or an array of strings, token ids or token-id arrays, raw), their
// chat-style "messages" as Messages, and the two sides of a score or
// rerank request as Query and Documents, all raw sub-slices of the body.
// PrefillOnly is always set. Every error is a *RequestError.
func ParsePooling(body []byte) (*Request, error) {
	top, err := parseBody(body)
	if err != nil {
		return nil, err
	}
	c := &converter{body: body}
	r := &Request{PrefillOnly: true}
	if r.Model, err = c.optString(top.get("model"), "model"); err != nil {
		return nil, err
	}
	if r.CacheSalt, err = c.optString(top.get("cache_salt"), "cache_salt"); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		key string
		dst *json.RawMessage
	}{{"input", &r.Prompt}, {"messages", &r.Messages}} {
		v := top.get(f.key)
		if isNull(v) {
			continue
		}
		if f.key == "messages" && v[0] != '[' {
			return nil, c.err(v, f.key, "must be an array, not "+kind(v[0]))
		}
		if v[0] != '[' && v[0] != '"' {
			return nil, c.err(v, f.key, "must be a string or an array, not "+kind(v[0]))
		}
		*f.dst = clip(v)
	}
	for _, p := range scorePairs {
		q, d := top.get(p[0]), top.get(p[1])
		if !isNull(q) && !isNull(d) {
			r.Query, r.Documents = clip(q), clip(d)
			break
		}
	}
	return r, nil
}
