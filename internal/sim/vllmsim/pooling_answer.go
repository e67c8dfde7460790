package vllmsim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"slices"
)

// scorePrompts pairs /score's two sides: one with many, or as many on each.
func (e *Engine) scorePrompts(req *poolingRequest) ([][]uint64, error) {
	var a, b json.RawMessage
	switch {
	case req.Queries != nil && req.Documents != nil:
		a, b = req.Queries, req.Documents
	case req.Queries != nil && req.Items != nil:
		a, b = req.Queries, req.Items
	case req.Data1 != nil && req.Data2 != nil:
		a, b = req.Data1, req.Data2
	case req.Text1 != nil && req.Text2 != nil:
		a, b = req.Text1, req.Text2
	default:
		return nil, badRequest("score needs queries and documents (or text_1 and text_2)")
	}
	left, err := stringList(a, "queries")
	if err != nil {
		return nil, err
	}
	right, err := stringList(b, "documents")
	if err != nil {
		return nil, err
	}
	switch {
	case len(left) == 1:
		left = slices.Repeat(left, len(right))
	case len(left) != len(right):
		return nil, badRequest("queries and documents must have the same length, or queries only one item")
	}
	return e.pairPrompts(left, right)
}

// rerankPrompts pairs /rerank's query with each document.
func (e *Engine) rerankPrompts(req *poolingRequest) ([][]uint64, []string, error) {
	var query string
	if err := json.Unmarshal(bytes.TrimSpace(req.Query), &query); err != nil {
		return nil, nil, badRequest("query is required, a string")
	}
	docs, err := stringList(req.Documents, "documents")
	if err != nil {
		return nil, nil, err
	}
	if req.TopN < 0 {
		return nil, nil, badRequest("top_n must not be negative")
	}
	prompts, err := e.pairPrompts(slices.Repeat([]string{query}, len(docs)), docs)
	return prompts, docs, err
}

// pairPrompts tokenizes query and document pairs.
func (e *Engine) pairPrompts(left, right []string) ([][]uint64, error) {
	lt, err := e.textPrompts(left)
	if err != nil {
		return nil, err
	}
	rt, err := e.textPrompts(right)
	if err != nil {
		return nil, err
	}
	prompts := make([][]uint64, len(lt))
	for i := range lt {
		prompts[i] = pairPrompt(lt[i], rt[i])
	}
	return prompts, nil
}

// runPooling queues one prefill-only request per prompt and waits for them
// all. It returns nil, nil when the client went away (the rest are then
// aborted).
func (e *Engine) runPooling(r *http.Request, job *poolJob) ([]*simRequest, error) {
	srs := make([]*simRequest, len(job.prompts))
	for i, p := range job.prompts {
		srs[i] = &simRequest{id: "pool-" + randomID(), tokens: p, promptLen: len(p), seed: promptSeed(p),
			pooling: true, notify: make(chan struct{}, 1), model: job.model.name,
			lora: job.model.lora, loraID: job.model.loraID}
		if err := e.submit(srs[i]); err != nil {
			for _, sr := range srs[:i] {
				e.abort(sr)
			}
			return nil, err
		}
	}
	for i, sr := range srs {
		if _, ok := e.waitResult(r, sr); !ok {
			for _, rest := range srs[i+1:] {
				e.abort(rest)
			}
			return nil, nil
		}
	}
	return srs, nil
}

// poolUsage is vLLM's UsageInfo of a pooling answer.
type poolUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails any `json:"prompt_tokens_details"`
}

// poolingAnswer builds the endpoint's response body.
func poolingAnswer(job *poolJob, req *poolingRequest, srs []*simRequest) any {
	prompt := 0
	for _, sr := range srs {
		prompt += sr.promptLen
	}
	usage := poolUsage{PromptTokens: prompt, TotalTokens: prompt}
	list := func(prefix string, data []map[string]any) map[string]any {
		return map[string]any{"id": prefix + randomID(), "object": "list", "created": job.created,
			"model": job.model.name, "data": data, "usage": usage}
	}
	data := make([]map[string]any, len(srs))
	for i, sr := range srs {
		switch job.kind {
		case poolEmbed:
			data[i] = map[string]any{"index": i, "object": "embedding", "embedding": embeddingValue(sr.seed, req.EncodingFormat)}
		case poolRaw:
			data[i] = map[string]any{"index": i, "object": "pooling", "data": embedding(sr.seed)}
		case poolClassify:
			p := unitScore(sr.seed)
			label := "LABEL_0"
			if p < 0.5 {
				label = "LABEL_1"
			}
			data[i] = map[string]any{"index": i, "label": label, "probs": []float64{p, 1 - p}, "num_classes": 2}
		default:
			data[i] = map[string]any{"index": i, "object": "score", "score": unitScore(sr.seed)}
		}
	}
	switch job.kind {
	case poolEmbed:
		return list("embd-", data)
	case poolRaw:
		return list("pool-", data)
	case poolClassify:
		return list("classify-", data)
	case poolScore:
		return list("score-", data)
	}
	return rerankAnswer(job, req, srs, prompt)
}

// rerankAnswer is /rerank's body: results by decreasing relevance, the
// top_n first ones when top_n > 0.
func rerankAnswer(job *poolJob, req *poolingRequest, srs []*simRequest, prompt int) any {
	type result struct {
		Index          int               `json:"index"`
		Document       map[string]string `json:"document"`
		RelevanceScore float64           `json:"relevance_score"`
	}
	results := make([]result, len(srs))
	for i, sr := range srs {
		results[i] = result{Index: i, Document: map[string]string{"text": job.documents[i]}, RelevanceScore: unitScore(sr.seed)}
	}
	slices.SortStableFunc(results, func(a, b result) int {
		switch {
		case a.RelevanceScore > b.RelevanceScore:
			return -1
		case a.RelevanceScore < b.RelevanceScore:
			return 1
		}
		return 0
	})
	if req.TopN > 0 && req.TopN < len(results) {
		results = results[:req.TopN]
	}
	return map[string]any{"id": "rerank-" + randomID(), "model": job.model.name,
		"usage": map[string]int{"prompt_tokens": prompt, "total_tokens": prompt}, "results": results}
}

// splitmix is a step of the SplitMix64 generator.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// embedding is a deterministic unit vector of embeddingDim floats.
func embedding(seed uint64) []float64 {
	v := make([]float64, embeddingDim)
	norm := 0.0
	x := seed
	for i := range v {
		x = splitmix(x)
		v[i] = float64(x>>11)/(1<<53)*2 - 1
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	for i := range v {
		if norm > 0 {
			v[i] /= norm
		}
	}
	return v
}

// embeddingValue is the embedding as a list of floats, or with
// encoding_format "base64" as vLLM's base64 of little-endian float32s.
func embeddingValue(seed uint64, format string) any {
	v := embedding(seed)
	if format != "base64" {
		return v
	}
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(f)))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// unitScore is a deterministic score in [0, 1).
func unitScore(seed uint64) float64 {
	return float64(splitmix(seed^0x5c0e)>>11) / (1 << 53)
}
