package vllmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/openai"
)

const (
	maxBodyBytes    = 32 << 20
	bodyReadTimeout = 30 * time.Second
)

func (e *Engine) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.handleChat)
	mux.HandleFunc("POST /v1/completions", e.handleCompletions)
	mux.HandleFunc("POST /v1/responses", e.handleResponses)
	mux.HandleFunc("POST /v1/messages", e.handleMessages)
	mux.HandleFunc("POST /v1/embeddings", e.poolingHandler("/v1/embeddings", poolEmbed))
	mux.HandleFunc("POST /pooling", e.poolingHandler("/pooling", poolRaw))
	mux.HandleFunc("POST /classify", e.poolingHandler("/classify", poolClassify))
	mux.HandleFunc("POST /score", e.poolingHandler("/score", poolScore))
	mux.HandleFunc("POST /v1/score", e.poolingHandler("/v1/score", poolScore))
	mux.HandleFunc("POST /rerank", e.poolingHandler("/rerank", poolRerank))
	mux.HandleFunc("POST /v1/rerank", e.poolingHandler("/v1/rerank", poolRerank))
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "0.26.0+vllmsim"})
	})
	mux.HandleFunc("POST /tokenize", e.handleTokenize)
	mux.HandleFunc("GET /metrics", e.handleMetrics)
	mux.HandleFunc("POST /reset_prefix_cache", e.handleResetPrefixCache)
	mux.HandleFunc("POST /sleep", e.handleSleep)
	mux.HandleFunc("POST /wake_up", e.handleWakeUp)
	mux.HandleFunc("GET /is_sleeping", e.handleIsSleeping)
	mux.HandleFunc("GET /sim/faults", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, e.Faults()) })
	mux.HandleFunc("POST /sim/faults", e.handleSetFaults)
	mux.HandleFunc("POST /sim/restart", e.handleRestart)
	mux.HandleFunc("GET /sim/stats", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, e.Stats()) })
	mux.HandleFunc("GET /sim/requests_by_model", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, e.RequestsByModel())
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !e.enterHandler() {
			writeError(w, http.StatusServiceUnavailable, "engine is shutting down")
			return
		}
		defer e.handlers.Done()
		if e.refuseAsleep(w, r) {
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// apiError is vLLM's ErrorResponse body: {"error": {...}}.
type apiError struct {
	Error apiErrorInfo `json:"error"`
}

type apiErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	default:
		return "InternalServerError"
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeErrorParam(w, status, msg, nil)
}

func writeErrorParam(w http.ResponseWriter, status int, msg string, param *string) {
	writeJSON(w, status, apiError{Error: apiErrorInfo{Message: msg, Type: errorType(status), Param: param, Code: status}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// genRequest is the union of the OpenAI completion and chat request fields
// the simulator honours.
type genRequest struct {
	Model                string          `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             json.RawMessage `json:"messages"` // decoded by messages()
	Tools                json.RawMessage `json:"tools"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	N                    *int            `json:"n"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"` // the real tokenizer's only
	CacheSalt            *string         `json:"cache_salt"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// decodeBody reads a JSON body with a size limit.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	// A deadline for the body only: a server-wide ReadTimeout would also
	// cancel long streaming responses.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	body := http.MaxBytesReader(w, r.Body, maxBodyBytes)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return badRequest("request body larger than %d bytes", maxBodyBytes)
		}
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

// messages decodes the request's chat messages; nil when there are none.
func (r *genRequest) messages() ([]chatMessage, error) {
	if t := bytes.TrimSpace(r.Messages); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, nil
	}
	var msgs []chatMessage
	if err := json.Unmarshal(r.Messages, &msgs); err != nil {
		return nil, badRequest("messages: %v", err)
	}
	return msgs, nil
}

// promptTokens renders and tokenizes a request exactly as /tokenize does:
// with the word tokenizer and its ChatML rendering, or with the real
// tokenizer and chat template the engine was given.
func (e *Engine) promptTokens(req *genRequest, chat bool) ([]uint64, error) {
	tokens, _, err := e.promptTokensMM(req, chat)
	return tokens, err
}

// promptTokensMM is promptTokens with the prompt's multimodal items (see
// images.go).
func (e *Engine) promptTokensMM(req *genRequest, chat bool) ([]uint64, []kvindex.MMItem, error) {
	if e.cfg.Tokenizer != nil {
		tokens, err := e.realTokens(req, chat)
		return tokens, nil, err
	}
	if chat {
		return e.chatTokens(req)
	}
	tokens, err := e.completionTokens(req)
	return tokens, nil, err
}

// chatTokens renders and tokenizes a chat request with the word tokenizer,
// its images expanded.
func (e *Engine) chatTokens(req *genRequest) ([]uint64, []kvindex.MMItem, error) {
	msgs, err := req.messages()
	if err != nil {
		return nil, nil, err
	}
	o := chatOptions{tools: req.Tools, addGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
		continueFinal: req.ContinueFinalMessage}
	if e.cfg.ImageTokens > 0 {
		o.img = &imageRender{model: e.cfg.Model}
	}
	text, err := renderChatImages(msgs, o)
	if err != nil {
		return nil, nil, err
	}
	addSpecial := req.AddSpecialTokens != nil && *req.AddSpecialTokens
	tokens := tokenize(nil, text, addSpecial)
	if o.img == nil {
		return tokens, nil, nil
	}
	return expandImages(tokens, o.img.ids, e.cfg.ImageTokens)
}

// completionTokens tokenizes a completion request's prompt.
func (e *Engine) completionTokens(req *genRequest) ([]uint64, error) {
	addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	p := bytes.TrimSpace(req.Prompt)
	if len(p) == 0 || bytes.Equal(p, []byte("null")) {
		return nil, badRequest("prompt is required")
	}
	switch p[0] {
	case '"':
		var s string
		if err := json.Unmarshal(p, &s); err != nil {
			return nil, badRequest("prompt: %v", err)
		}
		if len(s) > maxPromptBytes {
			return nil, badRequest("prompt of %d bytes is too long", len(s))
		}
		return tokenize(nil, s, addSpecial), nil
	case '[':
		var ids []uint64
		if err := json.Unmarshal(p, &ids); err == nil {
			for _, id := range ids {
				if id > tokBOS {
					return nil, badRequest("token id %d is out of vocabulary", id)
				}
			}
			return ids, nil
		}
		var strs []string
		if err := json.Unmarshal(p, &strs); err == nil && len(strs) == 1 {
			return tokenize(nil, strs[0], addSpecial), nil
		}
		return nil, badRequest("prompt must be a string, a list of one string, or a list of token ids")
	}
	return nil, badRequest("prompt must be a string or a list of token ids")
}

// realTokens is promptTokens with the engine's real tokenizer: the request
// is handed to the gateway's own local tokenizer package, which renders it
// as vLLM does. A prompt given as token ids is taken as it is.
func (e *Engine) realTokens(req *genRequest, chat bool) ([]uint64, error) {
	areq := &openai.Request{Model: req.Model, Tools: req.Tools, AddSpecialTokens: req.AddSpecialTokens,
		AddGenerationPrompt: req.AddGenerationPrompt, ContinueFinalMessage: &req.ContinueFinalMessage,
		ChatTemplateKwargs: req.ChatTemplateKwargs}
	if chat {
		areq.Messages = req.Messages
	} else {
		p := bytes.TrimSpace(req.Prompt)
		var ids []uint64
		if len(p) > 0 && p[0] == '[' && json.Unmarshal(p, &ids) == nil && len(ids) > 0 {
			return ids, nil
		}
		areq.Prompt = p
	}
	ids, err := e.cfg.Tokenizer.Tokenize(areq)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return ids, nil
}

// servedModel is what a request's "model" names: the base model or one of
// its LoRA adapters.
type servedModel struct {
	name   string // echoed in responses: the adapter's name, or Model for the base model under any of its names
	lora   string // adapter name, "" for the base model
	loraID int    // vLLM's lora_int_id, 0 for the base model
}

// lookupModel maps a request's "model" to a served model; false when the
// engine does not serve that name.
func (e *Engine) lookupModel(model string) (servedModel, bool) {
	if model == "" || model == e.cfg.Model || e.aliases[model] {
		// vLLM answers with its first served name whichever one was asked.
		return servedModel{name: e.cfg.Model}, true
	}
	if id, ok := e.loraIDs[model]; ok {
		return servedModel{name: model, lora: model, loraID: id}, true
	}
	return servedModel{}, false
}

// resolveModel is lookupModel that answers 404 as vLLM does for a name it
// does not serve.
func (e *Engine) resolveModel(w http.ResponseWriter, model string) (servedModel, bool) {
	if m, ok := e.lookupModel(model); ok {
		return m, true
	}
	param := "model"
	writeErrorParam(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model), &param)
	return servedModel{}, false
}

func writeReqError(w http.ResponseWriter, err error) {
	if errors.Is(err, errBadRequest) {
		writeError(w, http.StatusBadRequest, strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
		return
	}
	writeError(w, http.StatusInternalServerError, err.Error())
}

func (e *Engine) handleChat(w http.ResponseWriter, r *http.Request) {
	e.countEndpoint("/v1/chat/completions")
	e.handleGenerate(w, r, true)
}

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	e.countEndpoint("/v1/completions")
	e.handleGenerate(w, r, false)
}

func (e *Engine) handleGenerate(w http.ResponseWriter, r *http.Request, chat bool) {
	faults := e.Faults()
	var req genRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeReqError(w, err)
		return
	}
	e.countRequest(req.Model)
	model, ok := e.resolveModel(w, req.Model)
	if !ok {
		return
	}
	if faults.Error500 {
		writeError(w, http.StatusInternalServerError, "EngineCore encountered an issue. See stack trace (above) for the root cause.")
		return
	}
	sr, err := e.newSimRequest(&req, model, chat)
	if err != nil {
		writeReqError(w, err)
		return
	}
	if err := e.submit(sr); err != nil {
		writeError(w, http.StatusServiceUnavailable, "engine is not running")
		return
	}
	created := time.Now().Unix()
	if req.Stream {
		e.stream(w, r, sr, streamShape{chat: chat, created: created,
			includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage})
		return
	}
	res, ok := e.waitResult(r, sr)
	if !ok {
		return
	}
	u := makeUsage(sr.promptLen, res.out, res.cached)
	if chat {
		writeJSON(w, http.StatusOK, chatResponse{
			ID: sr.id, Object: "chat.completion", Created: created, Model: sr.model,
			Choices: []chatChoice{{Message: chatRespMessage{Role: "assistant", Content: res.text, ToolCalls: []any{}}, FinishReason: res.finish}},
			Usage:   u,
		})
		return
	}
	writeJSON(w, http.StatusOK, completionResponse{
		ID: sr.id, Object: "text_completion", Created: created, Model: sr.model,
		Choices: []completionChoice{{Text: res.text, FinishReason: &res.finish}},
		Usage:   u,
	})
}

// newSimRequest validates a generation request and turns it into a
// scheduler request: prompt tokens (rendered exactly as /tokenize does),
// output length, extra keys (LoRA adapter, cache salt) and the prompt's
// block hashes.
func (e *Engine) newSimRequest(req *genRequest, model servedModel, chat bool) (*simRequest, error) {
	if req.N != nil && *req.N != 1 {
		return nil, badRequest("n must be 1 in this simulator")
	}
	if msgs, err := req.messages(); chat && (err != nil || len(msgs) == 0) {
		return nil, badRequest("messages is required, a non-empty list")
	}
	prompt, mm, err := e.promptTokensMM(req, chat)
	if err != nil {
		return nil, err
	}
	if len(prompt) == 0 {
		return nil, badRequest("The prompt is empty.")
	}
	// vLLM's chat requests take max_completion_tokens over max_tokens
	// (ChatCompletionRequest.to_sampling_params); completions have only
	// max_tokens.
	maxTokens := e.cfg.DefaultMaxTokens
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if chat && req.MaxCompletionTokens != nil {
		maxTokens = *req.MaxCompletionTokens
	}
	if maxTokens < 1 {
		return nil, badRequest("max_tokens must be at least 1, got %d.", maxTokens)
	}
	// The engine must be able to hold the whole sequence.
	limit := min(e.cfg.MaxModelLen, (e.cfg.NumGPUBlocks-1)*e.cfg.BlockSize)
	if len(prompt) > limit || maxTokens > limit-len(prompt) {
		return nil, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			limit, len(prompt)+maxTokens, len(prompt), maxTokens)
	}
	sr := &simRequest{
		tokens:    prompt,
		promptLen: len(prompt),
		maxTokens: maxTokens,
		seed:      promptSeed(prompt),
		stream:    req.Stream,
		notify:    make(chan struct{}, 1),
		model:     model.name,
		lora:      model.lora,
		loraID:    model.loraID,
	}
	var salt string
	if req.CacheSalt != nil {
		if *req.CacheSalt == "" {
			return nil, badRequest("cache_salt must not be empty")
		}
		salt = *req.CacheSalt
	}
	sr.mm = kvindex.KeySpec{BlockSize: e.cfg.BlockSize, LoRAName: model.lora, CacheSalt: salt, MM: mm}
	if err := e.hashPrompt(sr); err != nil {
		return nil, err
	}
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	sr.id = prefix + randomID()
	return sr, nil
}

// hashPrompt sets the extra keys of sr (keyed by sr.mm) and the block
// hashes of its prompt.
func (e *Engine) hashPrompt(sr *simRequest) error {
	sr.extra0, sr.extraRest = kvindex.RequestBlockExtraKeys(sr.mm.LoRAName, sr.mm.CacheSalt)
	bs := sr.mm.BlockSize
	extra, err := sr.mm.ExtraKeys(len(sr.tokens) / bs)
	if err != nil {
		return fmt.Errorf("prompt extra keys: %w", err)
	}
	h := e.hashers.Get().(*kvindex.Hasher)
	sr.hashes, err = h.BlockHashes(make([]kvindex.Digest, 0, (len(sr.tokens)+sr.maxTokens)/bs+1), sr.tokens, extra)
	e.hashers.Put(h)
	if err != nil {
		return fmt.Errorf("hash prompt: %w", err)
	}
	return nil
}

// streamShape is how a streamed OpenAI response is framed.
type streamShape struct {
	chat         bool  // chat.completion.chunk, else text_completion
	created      int64 // the chunks' created time
	includeUsage bool  // stream_options.include_usage: a last chunk with usage
}

// stream writes a request's tokens as OpenAI server-sent events as they
// are generated, then the usage chunk when asked for and [DONE].
func (e *Engine) stream(w http.ResponseWriter, r *http.Request, sr *simRequest, shape streamShape) {
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	var buf []byte
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		buf = append(append(append(buf[:0], "data: "...), b...), "\n\n"...)
		_, err = w.Write(buf)
		return err == nil
	}
	object, created := "text_completion", shape.created
	chunk := func(s *string, finish *string, u *streamUsage) any {
		if shape.chat {
			choices := []chatChunkChoice{}
			if s != nil {
				choices = append(choices, chatChunkChoice{Delta: chatDelta{Content: s}, FinishReason: finish, StopReason: stopReason(finish)})
			}
			return chatChunk{ID: sr.id, Object: object, Created: created, Model: sr.model, Choices: choices, Usage: u}
		}
		choices := []completionChoice{}
		if s != nil {
			choices = append(choices, completionChoice{Text: *s, FinishReason: finish})
		}
		return completionChunk{ID: sr.id, Object: object, Created: created, Model: sr.model, Choices: choices, Usage: u}
	}
	if shape.chat {
		object = "chat.completion.chunk"
		// vLLM's first chat chunk carries the role.
		if !send(chatChunk{ID: sr.id, Object: object, Created: created, Model: sr.model,
			Choices: []chatChunkChoice{{Delta: chatDelta{Role: "assistant", Content: strPtr("")}}}}) {
			e.abort(sr)
			return
		}
		if fl != nil {
			fl.Flush()
		}
	}
	res, ok := e.followTokens(r, sr, fl, func(s string, finish *string) bool { return send(chunk(&s, finish, nil)) })
	if !ok {
		return
	}
	if shape.includeUsage {
		u := streamUsage(makeUsage(sr.promptLen, res.out, res.cached))
		send(chunk(nil, nil, &u))
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}

func strPtr(s string) *string { return &s }

func stopReason(finish *string) *json.RawMessage {
	if finish == nil {
		return nil
	}
	null := json.RawMessage("null") // vLLM sets stop_reason=None explicitly
	return &null
}

type usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// makeUsage reports cached tokens as vLLM does with
// --enable-prompt-tokens-details: only when there are some.
func makeUsage(prompt, completion, cached int) usage {
	u := usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	if cached > 0 {
		u.PromptTokensDetails = &promptTokensDetails{CachedTokens: cached}
	}
	return u
}

type chatResponse struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	ServiceTier       *string      `json:"service_tier"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Usage             usage        `json:"usage"`
	PromptLogprobs    any          `json:"prompt_logprobs"`
	KVTransferParams  any          `json:"kv_transfer_params"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      chatRespMessage `json:"message"`
	Logprobs     any             `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
	StopReason   any             `json:"stop_reason"`
}

type chatRespMessage struct {
	Role             string  `json:"role"`
	Content          string  `json:"content"`
	Refusal          *string `json:"refusal"`
	Annotations      any     `json:"annotations"`
	Audio            any     `json:"audio"`
	FunctionCall     any     `json:"function_call"`
	ToolCalls        []any   `json:"tool_calls"`
	ReasoningContent *string `json:"reasoning_content"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   *streamUsage      `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     any       `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	// StopReason is present (null) only on the final chunk, as in vLLM.
	StopReason *json.RawMessage `json:"stop_reason,omitempty"`
}

// streamUsage is the usage of the final streaming chunk, which vLLM
// serialises with exclude_none: no prompt_tokens_details when there is none.
type streamUsage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type completionResponse struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	ServiceTier       *string            `json:"service_tier"`
	SystemFingerprint *string            `json:"system_fingerprint"`
	Usage             usage              `json:"usage"`
	KVTransferParams  any                `json:"kv_transfer_params"`
}

type completionChoice struct {
	Index          int     `json:"index"`
	Text           string  `json:"text"`
	Logprobs       any     `json:"logprobs"`
	FinishReason   *string `json:"finish_reason"`
	StopReason     any     `json:"stop_reason"`
	PromptLogprobs any     `json:"prompt_logprobs,omitempty"`
}

type completionChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *streamUsage       `json:"usage,omitempty"`
}

func (e *Engine) handleModels(w http.ResponseWriter, r *http.Request) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
		Permission  []any   `json:"permission"`
	}
	now := time.Now().Unix()
	data := make([]model, 0, 1+len(e.cfg.ModelAliases)+len(e.cfg.LoRAModules))
	// Every served name of the base model has a card, in order, with the
	// model's path (here the first name) as root.
	for _, name := range append([]string{e.cfg.Model}, e.cfg.ModelAliases...) {
		data = append(data, model{ID: name, Object: "model", Created: now, OwnedBy: "vllm",
			Root: e.cfg.Model, MaxModelLen: &e.cfg.MaxModelLen, Permission: []any{}})
	}
	// vLLM lists adapters after the base model, with the adapter's path as
	// root, the base model as parent and no max_model_len.
	for _, name := range e.cfg.LoRAModules {
		data = append(data, model{ID: name, Object: "model", Created: now, OwnedBy: "vllm",
			Root: loraPath(name), Parent: &e.cfg.Model, Permission: []any{}})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// loraPath is the fake adapter path /v1/models reports as an adapter's root.
func loraPath(name string) string { return "/sim/lora/" + name }

type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint64 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// handleTokenize is vLLM's /tokenize in both forms. The chat form renders
// with the same template and defaults as /v1/chat/completions, so its tokens
// are the prompt the engine hashes.
func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	faults := e.Faults()
	if faults.TokenizeDelay > 0 {
		t := time.NewTimer(faults.TokenizeDelay)
		select {
		case <-r.Context().Done():
			t.Stop()
			return
		case <-e.stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
	if faults.TokenizeFail {
		writeError(w, http.StatusInternalServerError, "tokenizer failure (injected)")
		return
	}
	var req tokenizeRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeReqError(w, err)
		return
	}
	if _, ok := e.resolveModel(w, req.Model); !ok {
		return
	}
	var toks []uint64
	switch {
	case req.Messages != nil:
		g := genRequest{Messages: req.Messages, Tools: req.Tools, AddSpecialTokens: req.AddSpecialTokens,
			AddGenerationPrompt: req.AddGenerationPrompt, ContinueFinalMessage: req.ContinueFinalMessage,
			ChatTemplateKwargs: req.ChatTemplateKwargs}
		var err error
		if toks, err = e.promptTokens(&g, true); err != nil {
			writeReqError(w, err)
			return
		}
	case req.Prompt != nil:
		if len(*req.Prompt) > maxPromptBytes {
			writeError(w, http.StatusBadRequest, "prompt is too long")
			return
		}
		p, _ := json.Marshal(*req.Prompt)
		var err error
		if toks, err = e.promptTokens(&genRequest{Prompt: p, AddSpecialTokens: req.AddSpecialTokens}, false); err != nil {
			writeReqError(w, err)
			return
		}
	default:
		writeError(w, http.StatusBadRequest, "either prompt or messages is required")
		return
	}
	if toks == nil {
		toks = []uint64{}
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(toks), MaxModelLen: e.cfg.MaxModelLen, Tokens: toks})
}

func (e *Engine) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	if !e.ResetPrefixCache() {
		// vLLM logs a warning and still answers 200 from the dev endpoint;
		// the simulator reports the failure so tests can tell.
		writeError(w, http.StatusConflict, "prefix cache not reset: blocks are in use")
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	if err := decodeBody(w, r, &f); err != nil {
		writeReqError(w, err)
		return
	}
	if err := f.validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	e.SetFaults(f)
	writeJSON(w, http.StatusOK, e.Faults())
}

func (e *Engine) handleRestart(w http.ResponseWriter, r *http.Request) {
	// Answer first: the restart drops every connection, this one included.
	w.WriteHeader(http.StatusAccepted)
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
	if err := e.Restart(); err != nil {
		return
	}
}
