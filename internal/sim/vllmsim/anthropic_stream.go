package vllmsim

import "net/http"

// The Anthropic answer and its event stream, as vLLM's
// messages_full_converter and message_stream_converter produce them.

// anthropicResponse is vLLM's AnthropicMessagesResponse dumped with
// exclude_none, so without stop_sequence.
type anthropicResponse struct {
	ID         string              `json:"id"`
	Type       string              `json:"type,omitempty"`
	Role       string              `json:"role,omitempty"`
	Content    []anthropicBlockOut `json:"content"`
	Model      string              `json:"model"`
	StopReason string              `json:"stop_reason,omitempty"`
	Usage      *anthropicUsage     `json:"usage,omitempty"`
}

// anthropicStart is the message of message_start, which vLLM dumps with
// exclude_unset: without type and role (their defaults) but with null
// stop_reason and stop_sequence.
type anthropicStart struct {
	ID           string              `json:"id"`
	Content      []anthropicBlockOut `json:"content"`
	Model        string              `json:"model"`
	StopReason   *string             `json:"stop_reason"`
	StopSequence *string             `json:"stop_sequence"`
	Usage        anthropicUsage      `json:"usage"`
}

type anthropicBlockOut struct {
	Type string  `json:"type"`
	Text *string `json:"text,omitempty"`
}

// anthropicUsage has no cache fields: vLLM leaves them unset.
type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

type anthropicDelta struct {
	Type       string `json:"type,omitempty"`
	Text       string `json:"text,omitempty"`
	StopReason string `json:"stop_reason,omitempty"`
}

// anthropicEvent is one stream event, its unset fields left out.
type anthropicEvent struct {
	Type         string             `json:"type"`
	Message      *anthropicStart    `json:"message,omitempty"`
	Index        *int               `json:"index,omitempty"`
	ContentBlock *anthropicBlockOut `json:"content_block,omitempty"`
	Delta        *anthropicDelta    `json:"delta,omitempty"`
	Usage        *anthropicUsage    `json:"usage,omitempty"`
}

// streamAnthropic streams as vLLM does: message_start (with the prompt's
// input_tokens), content_block_start and one content_block_delta
// (text_delta) per token, then content_block_stop, message_delta (stop
// reason and usage) and message_stop. vLLM sends no ping.
func (e *Engine) streamAnthropic(w http.ResponseWriter, r *http.Request, sr *simRequest) {
	sse := startSSE(w)
	send := func(ev anthropicEvent) bool { return sse.event(ev.Type, ev) }
	zero := 0
	if !send(anthropicEvent{Type: "message_start", Message: &anthropicStart{ID: sr.id, Content: []anthropicBlockOut{},
		Model: sr.model, Usage: anthropicUsage{InputTokens: sr.promptLen}}}) {
		e.abort(sr)
		return
	}
	sse.flush()
	started := false
	res, ok := e.followTokens(r, sr, sse.fl, func(text string, _ *string) bool {
		if !started {
			started = true
			if !send(anthropicEvent{Type: "content_block_start", Index: &zero, ContentBlock: &anthropicBlockOut{Type: "text", Text: strPtr("")}}) {
				return false
			}
		}
		return send(anthropicEvent{Type: "content_block_delta", Index: &zero, Delta: &anthropicDelta{Type: "text_delta", Text: text}})
	})
	if !ok {
		return
	}
	if started && !send(anthropicEvent{Type: "content_block_stop", Index: &zero}) {
		return
	}
	if !send(anthropicEvent{Type: "message_delta", Delta: &anthropicDelta{StopReason: anthropicStopReason(res.finish)},
		Usage: &anthropicUsage{InputTokens: sr.promptLen, OutputTokens: res.out}}) {
		return
	}
	send(anthropicEvent{Type: "message_stop"})
	sse.flush()
}
