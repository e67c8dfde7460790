package vllmsim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// POST /v1/messages, the Anthropic Messages API as vLLM serves it
// (vllm/entrypoints/anthropic/serving.py): the request is converted to a
// chat completion (the system prompt, from "system" and from any message
// with role system, becomes the first message) and runs on the chat path.

// anthropicRequest is the part of vLLM's AnthropicMessagesRequest the
// simulator honours.
type anthropicRequest struct {
	Model     string             `json:"model"`
	Messages  []anthropicMessage `json:"messages"`
	MaxTokens *int               `json:"max_tokens"`
	System    json.RawMessage    `json:"system"`
	Stream    bool               `json:"stream"`
	Tools     []anthropicTool    `json:"tools"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string or blocks
}

// anthropicBlock is a content block: text, image, tool_use, tool_result,
// thinking...
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description *string         `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

func (e *Engine) handleMessages(w http.ResponseWriter, r *http.Request) {
	e.countEndpoint("/v1/messages")
	var req anthropicRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeAnthropicError(w, failure(err))
		return
	}
	e.countRequest(req.Model)
	call, err := anthropicCall(&req)
	if err != nil {
		writeAnthropicError(w, failure(err))
		return
	}
	sr, f := e.submitChat(call)
	if f != nil {
		writeAnthropicError(w, f)
		return
	}
	if req.Stream {
		e.streamAnthropic(w, r, sr)
		return
	}
	res, ok := e.waitResult(r, sr)
	if !ok {
		return
	}
	content := []anthropicBlockOut{}
	if res.text != "" {
		content = append(content, anthropicBlockOut{Type: "text", Text: strPtr(res.text)})
	}
	// vLLM dumps the answer with exclude_none: no stop_sequence.
	writeJSON(w, http.StatusOK, anthropicResponse{ID: sr.id, Type: "message", Role: "assistant", Content: content,
		Model: sr.model, StopReason: anthropicStopReason(res.finish),
		Usage: &anthropicUsage{InputTokens: sr.promptLen, OutputTokens: res.out}})
}

// anthropicCall validates a request and converts it to chat messages as
// vLLM's _convert_anthropic_to_openai_request does.
func anthropicCall(req *anthropicRequest) (chatCall, error) {
	switch {
	case req.Model == "":
		return chatCall{}, badRequest("model: Model is required")
	case req.MaxTokens == nil:
		return chatCall{}, badRequest("max_tokens: Field required")
	case *req.MaxTokens <= 0:
		return chatCall{}, badRequest("max_tokens: max_tokens must be positive")
	case req.Messages == nil:
		return chatCall{}, badRequest("messages: Field required")
	}
	var msgs []chatMessage
	system, err := anthropicSystem(req)
	if err != nil {
		return chatCall{}, err
	}
	if system != "" {
		msgs = append(msgs, textMessage("system", system))
	}
	for i, m := range req.Messages {
		if msgs, err = appendAnthropicMessage(msgs, m); err != nil {
			return chatCall{}, badRequest("messages[%d]: %s", i, strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
		}
	}
	var tools []map[string]any
	for _, t := range req.Tools {
		tools = append(tools, chatTool(t.Name, t.Description, t.InputSchema))
	}
	tj, err := marshalTools(tools)
	if err != nil {
		return chatCall{}, err
	}
	return chatCall{model: req.Model, messages: msgs, tools: tj, maxTokens: req.MaxTokens, stream: req.Stream}, nil
}

// anthropicSystem joins the system prompt's text (the top-level field, then
// messages with role system) without separators, skipping Claude Code's
// per-request billing header as vLLM does.
func anthropicSystem(req *anthropicRequest) (string, error) {
	var sb strings.Builder
	add := func(raw json.RawMessage) error {
		text, blocks, err := anthropicContent(raw)
		if err != nil {
			return err
		}
		sb.WriteString(text)
		for _, b := range blocks {
			if b.Type == "text" && !strings.HasPrefix(b.Text, "x-anthropic-billing-header") {
				sb.WriteString(b.Text)
			}
		}
		return nil
	}
	if err := add(req.System); err != nil {
		return "", badRequest("system: %s", strings.TrimPrefix(err.Error(), errBadRequest.Error()+": "))
	}
	for _, m := range req.Messages {
		if m.Role == "system" {
			if err := add(m.Content); err != nil {
				return "", err
			}
		}
	}
	return sb.String(), nil
}

// anthropicContent decodes content given as a string or as blocks.
func anthropicContent(raw json.RawMessage) (string, []anthropicBlock, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return "", nil, nil
	}
	if t[0] == '"' {
		var s string
		err := json.Unmarshal(t, &s)
		if err != nil {
			return "", nil, badRequest("content: %v", err)
		}
		return s, nil, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(t, &blocks); err != nil {
		return "", nil, badRequest("content must be a string or a list of content blocks")
	}
	return "", blocks, nil
}

// appendAnthropicMessage converts one message: text blocks become the
// content, tool_use blocks tool_calls, a user's tool_result blocks tool
// messages (before the message); images are refused by this text-only
// model. A user message left with no content is dropped, as in vLLM.
func appendAnthropicMessage(msgs []chatMessage, m anthropicMessage) ([]chatMessage, error) {
	role := m.Role
	switch role {
	case "system":
		return msgs, nil // joined into the system prompt
	case "ctx", "msg": // Claude Code's roles, normalised by vLLM
		role = "user"
	case "user", "assistant":
	default:
		return nil, badRequest("role %q is not one of user, assistant, system", m.Role)
	}
	text, blocks, err := anthropicContent(m.Content)
	if err != nil {
		return nil, err
	}
	if blocks == nil {
		return append(msgs, textMessage(role, text)), nil
	}
	var texts []string
	var calls []map[string]any
	for _, b := range blocks {
		switch b.Type {
		case "text":
			if b.Text != "" {
				texts = append(texts, b.Text)
			}
		case "tool_use":
			args := "{}"
			if in := bytes.TrimSpace(b.Input); len(in) > 0 && !bytes.Equal(in, []byte("null")) {
				args = string(in)
			}
			calls = append(calls, map[string]any{"id": b.ID, "type": "function",
				"function": map[string]string{"name": b.Name, "arguments": args}})
		case "tool_result":
			result := toolResultText(b.Content)
			if role == "user" {
				msgs = append(msgs, textMessage("tool", result))
			} else {
				texts = append(texts, "Tool result: "+result)
			}
		case "thinking", "redacted_thinking", "tool_reference":
			// Reasoning is not rendered by the simulator's template.
		case "image":
			return nil, badRequest("content part type \"image_url\" is not supported by this text-only model")
		default:
			return nil, badRequest("unknown content block type %q", b.Type)
		}
	}
	if len(texts) == 0 && len(calls) == 0 {
		if role == "user" {
			return msgs, nil
		}
		return append(msgs, chatMessage{Role: role}), nil
	}
	out := textMessage(role, strings.Join(texts, "\n"))
	if len(calls) > 0 {
		out.ToolCalls, _ = json.Marshal(calls)
	}
	return append(msgs, out), nil
}

// toolResultText is a tool_result's content: a string, or its text blocks
// joined with newlines.
func toolResultText(raw json.RawMessage) string {
	text, blocks, err := anthropicContent(raw)
	if err != nil {
		return ""
	}
	parts := []string{}
	if text != "" {
		parts = append(parts, text)
	}
	for _, b := range blocks {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// anthropicStopReason maps vLLM's finish reason as its stop_reason_map.
func anthropicStopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls":
		return "tool_use"
	default:
		return "end_turn"
	}
}

// writeAnthropicError answers as vLLM's translate_error_response: the
// Anthropic envelope {"type":"error","error":{"type","message"}} with the
// status and the error type of vLLM's own ErrorResponse (BadRequestError,
// NotFoundError, ...).
func writeAnthropicError(w http.ResponseWriter, f *apiFailure) {
	writeJSON(w, f.status, anthropicErrorResponse{Type: "error",
		Error: anthropicError{Type: errorType(f.status), Message: f.msg}})
}

type anthropicErrorResponse struct {
	Type  string         `json:"type"`
	Error anthropicError `json:"error"`
}

type anthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}
