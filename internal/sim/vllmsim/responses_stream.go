package vllmsim

import "net/http"

// The Responses object and its event stream, as vLLM's ResponsesResponse
// and simple (non-harmony) streaming events.

// responsesObject is vLLM's ResponsesResponse, in the fields that matter.
type responsesObject struct {
	ID                 string              `json:"id"`
	Object             string              `json:"object"`
	CreatedAt          int64               `json:"created_at"`
	Status             string              `json:"status"`
	IncompleteDetails  *incompleteDetails  `json:"incomplete_details"`
	Error              any                 `json:"error"`
	Instructions       *string             `json:"instructions"`
	MaxOutputTokens    *int                `json:"max_output_tokens"`
	Model              string              `json:"model"`
	Output             []responseOutputMsg `json:"output"`
	ParallelToolCalls  bool                `json:"parallel_tool_calls"`
	PreviousResponseID *string             `json:"previous_response_id"`
	ToolChoice         string              `json:"tool_choice"`
	Tools              []responseTool      `json:"tools"`
	Background         bool                `json:"background"`
	Truncation         string              `json:"truncation"`
	Metadata           any                 `json:"metadata"`
	Usage              *responsesUsage     `json:"usage"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

// responseOutputMsg is an output item of type "message".
type responseOutputMsg struct {
	ID      string               `json:"id"`
	Type    string               `json:"type"`
	Role    string               `json:"role"`
	Status  string               `json:"status"`
	Content []responseOutputText `json:"content"`
}

type responseOutputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"` // null unless requested; [] in content_part.added, as vLLM
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens  int `json:"reasoning_tokens"`
		ToolOutputTokens int `json:"tool_output_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// object renders the response: in progress (res nil, no output or usage)
// or finished. vLLM reports status "incomplete" with reason
// max_output_tokens when generation stopped at the token limit, which is
// how every simulated request ends; "completed" otherwise.
func (rs *responseState) object(res *genResult) responsesObject {
	o := responsesObject{ID: rs.id, Object: "response", CreatedAt: rs.created, Status: "in_progress",
		Instructions: rs.req.Instructions, MaxOutputTokens: rs.req.MaxOutputTokens, Model: rs.model,
		Output: []responseOutputMsg{}, ParallelToolCalls: true, PreviousResponseID: rs.req.PreviousResponseID,
		ToolChoice: "auto", Tools: rs.req.Tools, Truncation: "disabled"}
	if o.Tools == nil {
		o.Tools = []responseTool{}
	}
	if res == nil {
		return o
	}
	o.Status = "completed"
	if res.finish == "length" {
		o.Status = "incomplete"
		o.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	if res.text != "" {
		o.Output = []responseOutputMsg{rs.message("completed", res.text)}
	}
	u := &responsesUsage{InputTokens: rs.prompt, OutputTokens: res.out, TotalTokens: rs.prompt + res.out}
	u.InputTokensDetails.CachedTokens = res.cached
	o.Usage = u
	return o
}

// message is the assistant output item.
func (rs *responseState) message(status, text string) responseOutputMsg {
	m := responseOutputMsg{ID: rs.msgID, Type: "message", Role: "assistant", Status: status, Content: []responseOutputText{}}
	if status == "completed" {
		m.Content = []responseOutputText{{Type: "output_text", Text: text, Annotations: []any{}}}
	}
	return m
}

// responseEvents numbers the events of one stream.
type responseEvents struct {
	sse *sseWriter
	seq int
}

// send writes an event of the given type; fields are added to type and
// sequence_number.
func (ev *responseEvents) send(typ string, fields map[string]any) bool {
	fields["type"] = typ
	fields["sequence_number"] = ev.seq
	ev.seq++
	return ev.sse.event(typ, fields)
}

// streamResponse streams a response as vLLM's simple streaming events:
// response.created, response.in_progress, response.output_item.added,
// response.content_part.added, one response.output_text.delta per token,
// response.output_text.done, response.content_part.done,
// response.output_item.done and response.completed (with the whole
// response, whatever its status).
func (e *Engine) streamResponse(w http.ResponseWriter, r *http.Request, sr *simRequest, rs *responseState) {
	ev := &responseEvents{sse: startSSE(w)}
	where := func(extra map[string]any) map[string]any {
		m := map[string]any{"output_index": 0, "item_id": rs.msgID, "content_index": 0}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	if !ev.send("response.created", map[string]any{"response": rs.object(nil)}) ||
		!ev.send("response.in_progress", map[string]any{"response": rs.object(nil)}) {
		e.abort(sr)
		return
	}
	ev.sse.flush()
	started := false
	res, ok := e.followTokens(r, sr, ev.sse.fl, func(text string, _ *string) bool {
		if !started {
			started = true
			if !ev.send("response.output_item.added", map[string]any{"output_index": 0, "item": rs.message("in_progress", "")}) ||
				!ev.send("response.content_part.added", where(map[string]any{"part": responseOutputText{Type: "output_text", Annotations: []any{}, Logprobs: []any{}}})) {
				return false
			}
		}
		return ev.send("response.output_text.delta", where(map[string]any{"delta": text, "logprobs": []any{}}))
	})
	if !ok {
		return
	}
	final := e.finishResponse(rs, res)
	if started {
		part := responseOutputText{Type: "output_text", Text: res.text, Annotations: []any{}}
		_ = ev.send("response.output_text.done", where(map[string]any{"text": res.text, "logprobs": []any{}})) &&
			ev.send("response.content_part.done", where(map[string]any{"part": part})) &&
			ev.send("response.output_item.done", map[string]any{"output_index": 0, "item": rs.message("completed", res.text)})
	}
	ev.send("response.completed", map[string]any{"response": final})
	ev.sse.flush()
}
