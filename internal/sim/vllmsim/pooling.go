package vllmsim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"
)

// The pooling APIs (vllm/entrypoints/pooling/): /v1/embeddings, /pooling,
// /classify, /score, /rerank and /v1/rerank. Every input (or query and
// document pair) is one engine request that only prefills: it waits in the
// queue, takes a sequence slot and KV blocks while its prompt is computed
// (chunked like any prefill, counted in num_requests_running), then
// finishes without a decode step: no generation tokens, no time to first
// token. Its prompt tokens are counted.
//
// Prefix caching: vLLM turns it off for pooling models whose pooler needs
// every token (mean/CLS pooling, non-causal encoders) and supports it only
// for last-token pooling on causal models. The simulator takes the
// simplest safe form: a pooling request neither looks up nor stores cached
// blocks, so it publishes no KV events and never counts in
// prefix_cache_queries. The engine serves these APIs on top of its
// generation model (real vLLM serves them only with a pooling runner); the
// outputs are small deterministic vectors and scores derived from the
// prompt tokens.

const (
	maxPoolingInputs = 4096 // inputs (or pairs) in one pooling request
	embeddingDim     = 8
)

// poolingRequest is the union of the pooling request fields the simulator
// honours. /score takes one of the pairs queries+documents, queries+items,
// data_1+data_2 or text_1+text_2 (each a string or a list of strings).
type poolingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Queries        json.RawMessage `json:"queries"`
	Documents      json.RawMessage `json:"documents"`
	Items          json.RawMessage `json:"items"`
	Data1          json.RawMessage `json:"data_1"`
	Data2          json.RawMessage `json:"data_2"`
	Text1          json.RawMessage `json:"text_1"`
	Text2          json.RawMessage `json:"text_2"`
	Query          json.RawMessage `json:"query"`
	TopN           int             `json:"top_n"`
}

// poolKind is what a pooling endpoint computes.
type poolKind int

const (
	poolEmbed poolKind = iota
	poolRaw
	poolClassify
	poolScore
	poolRerank
)

// poolJob is a validated pooling request: its prompts and, for rerank, the
// documents to echo.
type poolJob struct {
	kind      poolKind
	model     servedModel
	prompts   [][]uint64
	documents []string
	created   int64
}

// poolingHandler serves one pooling endpoint.
func (e *Engine) poolingHandler(path string, kind poolKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		e.countEndpoint(path)
		var req poolingRequest
		if err := decodeBody(w, r, &req); err != nil {
			writeReqError(w, err)
			return
		}
		e.countRequest(req.Model)
		model, ok := e.resolveModel(w, req.Model)
		if !ok {
			return
		}
		if e.Faults().Error500 {
			writeError(w, http.StatusInternalServerError, "EngineCore encountered an issue. See stack trace (above) for the root cause.")
			return
		}
		job, err := e.poolPrompts(&req, kind)
		if err != nil {
			writeReqError(w, err)
			return
		}
		job.model, job.created = model, time.Now().Unix()
		srs, err := e.runPooling(r, job)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, "engine is not running")
			return
		}
		if srs == nil {
			return // the client went away
		}
		writeJSON(w, http.StatusOK, poolingAnswer(job, &req, srs))
	}
}

// poolPrompts tokenizes a pooling request's inputs and checks their sizes.
func (e *Engine) poolPrompts(req *poolingRequest, kind poolKind) (*poolJob, error) {
	job := &poolJob{kind: kind}
	var err error
	switch kind {
	case poolScore:
		job.prompts, err = e.scorePrompts(req)
	case poolRerank:
		job.prompts, job.documents, err = e.rerankPrompts(req)
	default:
		job.prompts, err = e.inputPrompts(req.Input)
	}
	if err != nil {
		return nil, err
	}
	if len(job.prompts) == 0 {
		return nil, badRequest("the request has no input")
	}
	if len(job.prompts) > maxPoolingInputs {
		return nil, badRequest("%d inputs, at most %d in one request", len(job.prompts), maxPoolingInputs)
	}
	limit := min(e.cfg.MaxModelLen, (e.cfg.NumGPUBlocks-1)*e.cfg.BlockSize)
	for _, p := range job.prompts {
		if len(p) == 0 {
			return nil, badRequest("The prompt is empty.")
		}
		if len(p) > limit {
			return nil, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens in the input. Please reduce the length of the input.", limit, len(p))
		}
	}
	return job, nil
}

// inputPrompts reads "input": a string, a list of strings, a list of token
// ids or a list of lists of token ids.
func (e *Engine) inputPrompts(raw json.RawMessage) ([][]uint64, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, badRequest("input is required")
	}
	var ids [][]uint64
	if json.Unmarshal(t, &ids) == nil {
		return ids, checkVocab(ids)
	}
	var one []uint64
	if json.Unmarshal(t, &one) == nil {
		return [][]uint64{one}, checkVocab([][]uint64{one})
	}
	texts, err := stringList(t, "input")
	if err != nil {
		return nil, err
	}
	return e.textPrompts(texts)
}

// checkVocab refuses token ids outside the simulated vocabulary.
func checkVocab(prompts [][]uint64) error {
	for _, p := range prompts {
		for _, id := range p {
			if id > tokBOS {
				return badRequest("token id %d is out of vocabulary", id)
			}
		}
	}
	return nil
}

// stringList reads a string or a list of strings.
func stringList(raw json.RawMessage, field string) ([]string, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, badRequest("%s is required", field)
	}
	var s string
	if json.Unmarshal(t, &s) == nil {
		return []string{s}, nil
	}
	var list []string
	if err := json.Unmarshal(t, &list); err != nil {
		return nil, badRequest("%s must be a string or a list of strings", field)
	}
	return list, nil
}

// textPrompts tokenizes texts as a completion prompt (special tokens added).
func (e *Engine) textPrompts(texts []string) ([][]uint64, error) {
	if len(texts) > maxPoolingInputs {
		return nil, badRequest("%d inputs, at most %d in one request", len(texts), maxPoolingInputs)
	}
	prompts := make([][]uint64, 0, len(texts))
	for _, s := range texts {
		if len(s) > maxPromptBytes {
			return nil, badRequest("input of %d bytes is too long", len(s))
		}
		p, _ := json.Marshal(s)
		toks, err := e.promptTokens(&genRequest{Prompt: p}, false)
		if err != nil {
			return nil, err
		}
		prompts = append(prompts, toks)
	}
	return prompts, nil
}

// pairPrompt is a cross-encoder's input: the query's tokens, a separator,
// then the document's.
func pairPrompt(q, d []uint64) []uint64 {
	p := make([]uint64, 0, len(q)+1+len(d))
	p = append(p, q...)
	p = append(p, tokEndOfText)
	return append(p, d...)
}
