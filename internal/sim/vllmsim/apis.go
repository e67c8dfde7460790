package vllmsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// This file holds what the APIs served on top of the chat path
// (/v1/responses, /v1/messages) and the pooling APIs share: running a
// request to its end, following its tokens, and writing named SSE events.

// genResult is the outcome of a finished generation request.
type genResult struct {
	text   string // the generated text
	out    int    // generated tokens
	cached int    // prompt tokens served from the prefix cache
	finish string // vLLM's finish reason ("length" in this simulator)
}

// apiFailure is an error with the HTTP status its API answers it with.
type apiFailure struct {
	status int
	msg    string
	typ    string // the error type when the API names one; "" for vLLM's default by status
}

func (f *apiFailure) Error() string { return f.msg }

// failure maps an error from request preparation to its status: 400 for
// client errors, 500 otherwise.
func failure(err error) *apiFailure {
	var f *apiFailure
	if errors.As(err, &f) {
		return f
	}
	if errors.Is(err, errBadRequest) {
		return &apiFailure{status: http.StatusBadRequest, msg: strings.TrimPrefix(err.Error(), errBadRequest.Error()+": ")}
	}
	return &apiFailure{status: http.StatusInternalServerError, msg: err.Error()}
}

// modelNotFound is vLLM's answer to a model name it does not serve.
func modelNotFound(model string) *apiFailure {
	return &apiFailure{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", model)}
}

// chatCall is a request of another API converted to a chat completion, as
// vLLM's Responses and Anthropic handlers do before the chat template.
type chatCall struct {
	model     string
	messages  []chatMessage
	tools     json.RawMessage // chat-format tools, or nil
	maxTokens *int
	stream    bool
	idPrefix  string // the answer's id prefix; "" keeps the chat one
}

// submitChat validates a converted request exactly as /v1/chat/completions
// would (same rendering, tokens, block hashes and limits) and queues it.
func (e *Engine) submitChat(c chatCall) (*simRequest, *apiFailure) {
	model, ok := e.lookupModel(c.model)
	if !ok {
		return nil, modelNotFound(c.model)
	}
	if e.Faults().Error500 {
		return nil, &apiFailure{status: http.StatusInternalServerError, msg: "EngineCore encountered an issue. See stack trace (above) for the root cause."}
	}
	msgs, err := json.Marshal(c.messages)
	if err != nil {
		return nil, failure(err)
	}
	g := genRequest{Model: c.model, Messages: msgs, Tools: c.tools, MaxTokens: c.maxTokens, Stream: c.stream}
	sr, err := e.newSimRequest(&g, model, true)
	if err != nil {
		return nil, failure(err)
	}
	if c.idPrefix != "" {
		sr.id = c.idPrefix + randomID()
	}
	if err := e.submit(sr); err != nil {
		return nil, &apiFailure{status: http.StatusServiceUnavailable, msg: "engine is not running"}
	}
	return sr, nil
}

// waitResult waits for a request to finish. It returns false when the
// client went away (the request is then aborted). A request failed by a
// restart cuts the connection, as the dying process would.
func (e *Engine) waitResult(r *http.Request, sr *simRequest) (genResult, bool) {
	for {
		if _, done, _ := sr.progress(); done {
			break
		}
		select {
		case <-r.Context().Done():
			e.abort(sr)
			return genResult{}, false
		case <-sr.notify:
		}
	}
	sr.mu.Lock()
	res := genResult{out: sr.out, cached: sr.cached, finish: sr.finish}
	rerr := sr.err
	sr.mu.Unlock()
	if rerr != nil {
		panic(http.ErrAbortHandler)
	}
	res.text = outputText(sr.seed, res.out)
	return res, true
}

// followTokens calls emit with the text of each generated token as the
// request makes progress (with the finish reason on the last token, nil on
// the others) and returns the result once it is done. It returns false
// when the client went away or emit failed; the request is then aborted.
// With Faults.DropStreamAfter it cuts the connection after that many
// tokens. Every streaming API of the simulator writes its events through
// it.
func (e *Engine) followTokens(r *http.Request, sr *simRequest, fl http.Flusher, emit func(text string, finish *string) bool) (genResult, bool) {
	dropAfter := e.Faults().DropStreamAfter
	finished := false
	defer func() {
		if !finished {
			e.abort(sr)
		}
	}()
	var text strings.Builder
	sent := 0
	for {
		sr.mu.Lock()
		out, done, rerr, finish, cached := sr.out, sr.done, sr.err, sr.finish, sr.cached
		sr.mu.Unlock()
		if rerr != nil {
			panic(http.ErrAbortHandler)
		}
		for ; sent < out; sent++ {
			_, s := outputToken(sr.seed, sent)
			text.WriteString(s)
			var fr *string
			if done && sent+1 == out {
				fr = &finish
			}
			if !emit(s, fr) {
				return genResult{}, false
			}
			if dropAfter > 0 && sent+1 >= dropAfter && !(done && sent+1 == out) {
				if fl != nil {
					fl.Flush()
				}
				panic(http.ErrAbortHandler) // cut the connection mid-stream
			}
		}
		if fl != nil {
			fl.Flush()
		}
		if done {
			finished = true
			return genResult{text: text.String(), out: out, cached: cached, finish: finish}, true
		}
		select {
		case <-r.Context().Done():
			return genResult{}, false
		case <-sr.notify:
		}
	}
}

// outputText is the text of a request's first n generated tokens.
func outputText(seed uint64, n int) string {
	var sb strings.Builder
	for k := range n {
		_, s := outputToken(seed, k)
		sb.WriteString(s)
	}
	return sb.String()
}

// sseWriter writes named server-sent events ("event: <name>\ndata: <json>"),
// the form of the Responses and Anthropic streams.
type sseWriter struct {
	w   io.Writer
	fl  http.Flusher
	buf []byte
}

// startSSE sends the headers of an event stream.
func startSSE(w http.ResponseWriter) *sseWriter {
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, fl: fl}
}

// event writes one event; false when the client is gone.
func (s *sseWriter) event(name string, v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	s.buf = append(s.buf[:0], "event: "...)
	s.buf = append(s.buf, name...)
	s.buf = append(s.buf, "\ndata: "...)
	s.buf = append(s.buf, b...)
	s.buf = append(s.buf, "\n\n"...)
	_, err = s.w.Write(s.buf)
	return err == nil
}

// flush pushes what was written to the client.
func (s *sseWriter) flush() {
	if s.fl != nil {
		s.fl.Flush()
	}
}

// chatTool converts a function tool of another API (name, description and a
// JSON schema) to the chat format the chat template renders.
func chatTool(name string, description *string, parameters json.RawMessage) map[string]any {
	fn := map[string]any{"name": name}
	if description != nil {
		fn["description"] = *description
	}
	if len(parameters) > 0 {
		fn["parameters"] = parameters
	}
	return map[string]any{"type": "function", "function": fn}
}

// marshalTools encodes converted tools, nil when there are none.
func marshalTools(tools []map[string]any) (json.RawMessage, error) {
	if len(tools) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return nil, badRequest("tools: %v", err)
	}
	return b, nil
}
