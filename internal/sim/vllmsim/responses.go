package vllmsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// POST /v1/responses, the OpenAI Responses API as vLLM serves it
// (vllm/entrypoints/openai/responses/serving.py and utils.py): the request
// becomes chat messages (instructions as a system message first, then the
// previous response's conversation, then the input) that run on the chat
// path, so they render, tokenize and hit the prefix cache as the same chat
// request would.

// responsesRequest is the part of vLLM's ResponsesRequest the simulator
// honours.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Store              *bool           `json:"store"` // vLLM's default is true
	Stream             bool            `json:"stream"`
	Background         bool            `json:"background"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Tools              []responseTool  `json:"tools"`
}

// responseTool is a Responses API tool: function tools are flat.
type responseTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description *string         `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// responseItem is one input item: a message (type "message" or omitted),
// a function_call or a function_call_output.
type responseItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

func (e *Engine) handleResponses(w http.ResponseWriter, r *http.Request) {
	e.countEndpoint("/v1/responses")
	var req responsesRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeResponsesError(w, failure(err), "")
		return
	}
	e.countRequest(req.Model)
	call, param, f := e.responsesCall(&req)
	if f != nil {
		writeResponsesError(w, f, param)
		return
	}
	sr, f := e.submitChat(call)
	if f != nil {
		writeResponsesError(w, f, "")
		return
	}
	rs := newResponseState(&req, sr, call.messages)
	if req.Stream {
		e.streamResponse(w, r, sr, rs)
		return
	}
	res, ok := e.waitResult(r, sr)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, e.finishResponse(rs, res))
}

// responsesCall validates a Responses request and converts it to chat
// messages as vLLM's construct_input_messages does. On error it returns the
// parameter at fault.
func (e *Engine) responsesCall(req *responsesRequest) (chatCall, string, *apiFailure) {
	if req.Background {
		return chatCall{}, "background", &apiFailure{status: http.StatusBadRequest, msg: "background mode is not supported by this simulator", typ: "invalid_request_error"}
	}
	if req.MaxOutputTokens != nil && *req.MaxOutputTokens < 1 {
		return chatCall{}, "max_output_tokens", &apiFailure{status: http.StatusBadRequest, msg: fmt.Sprintf("max_output_tokens must be at least 1, got %d.", *req.MaxOutputTokens)}
	}
	var msgs []chatMessage
	if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, textMessage("system", *req.Instructions))
	}
	if id := req.PreviousResponseID; id != nil {
		prev, ok := e.responses.get(*id)
		if !ok {
			return chatCall{}, "response_id", &apiFailure{status: http.StatusNotFound, msg: fmt.Sprintf("Response with id '%s' not found.", *id), typ: "invalid_request_error"}
		}
		// Instructions do not carry over: the stored system messages are
		// dropped, the previous output becomes an assistant message.
		for _, m := range prev.messages {
			if m.Role != "system" {
				msgs = append(msgs, m)
			}
		}
		msgs = append(msgs, textMessage("assistant", prev.output))
	}
	in, err := responseInput(req.Input)
	if err != nil {
		return chatCall{}, "input", failure(err)
	}
	msgs = append(msgs, in...)
	var tools []map[string]any
	for _, t := range req.Tools {
		if t.Type == "function" {
			tools = append(tools, chatTool(t.Name, t.Description, t.Parameters))
		}
	}
	tj, err := marshalTools(tools)
	if err != nil {
		return chatCall{}, "tools", failure(err)
	}
	return chatCall{model: req.Model, messages: msgs, tools: tj, maxTokens: req.MaxOutputTokens, stream: req.Stream,
		idPrefix: "resp_"}, "", nil
}

// textMessage is a chat message with string content.
func textMessage(role, text string) chatMessage {
	c, _ := json.Marshal(text)
	return chatMessage{Role: role, Content: c}
}

// responseInput converts the request's input: a string is one user
// message; items become messages, function calls join the assistant
// message before them as tool_calls, and outputs become tool messages.
func responseInput(raw json.RawMessage) ([]chatMessage, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, badRequest("input is required")
	}
	if t[0] == '"' {
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return nil, badRequest("input: %v", err)
		}
		return []chatMessage{textMessage("user", s)}, nil
	}
	var items []responseItem
	if err := json.Unmarshal(t, &items); err != nil {
		return nil, badRequest("input must be a string or a list of items: %v", err)
	}
	if len(items) == 0 {
		return nil, badRequest("input must not be empty")
	}
	var msgs []chatMessage
	for i, it := range items {
		m, merged, err := responseItemMessage(it, msgs)
		if err != nil {
			return nil, badRequest("input[%d]: %v", i, strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
		}
		if !merged {
			msgs = append(msgs, m)
		}
	}
	return msgs, nil
}

// responseItemMessage converts one input item. merged reports that a
// function call was added to the last message of msgs instead.
func responseItemMessage(it responseItem, msgs []chatMessage) (chatMessage, bool, error) {
	switch it.Type {
	case "", "message":
		if it.Role == "" {
			return chatMessage{}, false, badRequest("a message item needs a role")
		}
		text, err := responseContentText(it.Content)
		if err != nil {
			return chatMessage{}, false, err
		}
		return textMessage(it.Role, text), false, nil
	case "function_call":
		call := []map[string]any{{"id": it.CallID, "type": "function",
			"function": map[string]string{"name": it.Name, "arguments": it.Arguments}}}
		if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
			var prev []json.RawMessage
			_ = json.Unmarshal(msgs[n-1].ToolCalls, &prev)
			b, _ := json.Marshal(call[0])
			msgs[n-1].ToolCalls, _ = json.Marshal(append(prev, b))
			return chatMessage{}, true, nil
		}
		tc, _ := json.Marshal(call)
		return chatMessage{Role: "assistant", ToolCalls: tc}, false, nil
	case "function_call_output":
		text, err := responseContentText(it.Output)
		if err != nil {
			return chatMessage{}, false, err
		}
		return textMessage("tool", text), false, nil
	}
	return chatMessage{}, false, badRequest("Unsupported input item type: %s", it.Type)
}

// responseContentText flattens message content: a string, or parts of type
// input_text, output_text or text (joined with newlines, as the chat path
// joins text parts). Other parts are refused by this text-only model.
func responseContentText(raw json.RawMessage) (string, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return "", nil
	}
	if t[0] == '"' {
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return "", badRequest("content: %v", err)
		}
		return s, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(t, &parts); err != nil {
		return "", badRequest("content must be a string or a list of parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, p.Text)
		default:
			return "", badRequest("content part type %q is not supported by this text-only model", p.Type)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// writeResponsesError answers in vLLM's ErrorResponse shape: the type its
// Responses handler names (invalid_request_error for an unknown
// previous_response_id), else the type of the status.
func writeResponsesError(w http.ResponseWriter, f *apiFailure, param string) {
	info := apiErrorInfo{Message: f.msg, Type: errorType(f.status), Code: f.status}
	if f.typ != "" {
		info.Type = f.typ
	}
	if param != "" {
		info.Param = &param
	}
	writeJSON(w, f.status, apiError{Error: info})
}

// responseState is what a Responses answer is built from.
type responseState struct {
	req      *responsesRequest
	id       string
	msgID    string
	model    string
	created  int64
	messages []chatMessage
	prompt   int
}

func newResponseState(req *responsesRequest, sr *simRequest, msgs []chatMessage) *responseState {
	return &responseState{req: req, id: sr.id, msgID: "msg_" + randomID(), model: sr.model,
		created: time.Now().Unix(), messages: msgs, prompt: sr.promptLen}
}

// finishResponse stores a finished response (unless store is false) and
// returns its Responses object.
func (e *Engine) finishResponse(rs *responseState, res genResult) responsesObject {
	if rs.req.Store == nil || *rs.req.Store {
		e.responses.put(rs.id, rs.messages, res.text)
	}
	return rs.object(&res)
}
