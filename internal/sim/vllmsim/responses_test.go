package vllmsim

import (
	"net/http"
	"strings"
	"testing"
)

func TestResponsesNonStreaming(t *testing.T) {
	e, c := apiEngine(t, Config{})
	for _, tc := range []struct {
		name  string
		body  map[string]any
		equiv []map[string]any
	}{
		{"string input", map[string]any{"input": "hello there", "max_output_tokens": 5},
			[]map[string]any{{"role": "user", "content": "hello there"}}},
		{"instructions and items", map[string]any{"instructions": "be brief", "max_output_tokens": 5, "input": []any{
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "a"}, map[string]any{"type": "input_text", "text": "b"}}},
			map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "c"}}},
			map[string]any{"role": "user", "content": "d"},
		}}, []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
			{"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := postObject(t, c, e.URL()+"/v1/responses", tc.body, http.StatusOK)
			if id, _ := resp["id"].(string); !strings.HasPrefix(id, "resp_") || resp["object"] != "response" || resp["model"] != "sim-model" {
				t.Errorf("header fields: %v", resp)
			}
			// Every simulated request stops at its token limit: vLLM's
			// status for that is incomplete.
			if resp["status"] != "incomplete" || path(t, resp, "incomplete_details", "reason") != "max_output_tokens" {
				t.Errorf("status %v, incomplete_details %v", resp["status"], resp["incomplete_details"])
			}
			item := path(t, resp, "output", 0)
			if path(t, item, "type") != "message" || path(t, item, "role") != "assistant" || path(t, item, "status") != "completed" ||
				!strings.HasPrefix(path(t, item, "id").(string), "msg_") || path(t, item, "content", 0, "type") != "output_text" {
				t.Errorf("output item %v", item)
			}
			text := path(t, item, "content", 0, "text").(string)
			if want := chatText(t, c, e, tc.equiv, 5); text != want {
				t.Errorf("text %q, the chat path generates %q for the same messages", text, want)
			}
			u := resp["usage"]
			in, out := num(t, path(t, u, "input_tokens")), num(t, path(t, u, "output_tokens"))
			if out != 5 || num(t, path(t, u, "total_tokens")) != in+out || num(t, path(t, u, "output_tokens_details", "reasoning_tokens")) != 0 {
				t.Errorf("usage %v", u)
			}
			_ = num(t, path(t, u, "input_tokens_details", "cached_tokens"))
		})
	}
	if got := e.Stats().RequestsByEndpoint["/v1/responses"]; got != 2 {
		t.Errorf("RequestsByEndpoint[/v1/responses] = %d, want 2", got)
	}
}

func TestResponsesStreaming(t *testing.T) {
	e, c := apiEngine(t, Config{})
	evs := postSSE(t, c, e.URL()+"/v1/responses", map[string]any{"input": "stream me", "stream": true, "max_output_tokens": 4})
	var names []string
	var deltas strings.Builder
	for i, ev := range evs {
		names = append(names, ev.name)
		if seq := num(t, ev.data["sequence_number"]); seq != i {
			t.Errorf("event %d has sequence_number %d", i, seq)
		}
		if ev.name == "response.output_text.delta" {
			deltas.WriteString(ev.data["delta"].(string))
		}
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v\nwant %v", names, want)
	}
	if lp, ok := path(t, evs[3].data, "part", "logprobs").([]any); !ok || len(lp) != 0 || path(t, evs[3].data, "item_id") != path(t, evs[2].data, "item", "id") {
		t.Errorf("content_part.added %v after %v", evs[3].data, evs[2].data)
	}
	if st := path(t, evs[0].data, "response", "status"); st != "in_progress" {
		t.Errorf("created: status %v", st)
	}
	final := evs[len(evs)-1].data["response"]
	text := path(t, final, "output", 0, "content", 0, "text")
	if text != deltas.String() || evs[8].data["text"] != text {
		t.Errorf("deltas %q, done %q, final %q", deltas.String(), evs[8].data["text"], text)
	}
	if num(t, path(t, final, "usage", "output_tokens")) != 4 || path(t, final, "id") != path(t, evs[0].data, "response", "id") {
		t.Errorf("final response %v", final)
	}
	if e.Stats().ResponsesStored != 1 {
		t.Errorf("a streamed response is stored too: ResponsesStored = %d", e.Stats().ResponsesStored)
	}
}

func TestResponsesPreviousResponseChain(t *testing.T) {
	e, c := apiEngine(t, Config{})
	first := "tell me about " + strings.Repeat("prefix caches and block hashes ", 8)
	r1 := postObject(t, c, e.URL()+"/v1/responses", map[string]any{"input": first, "instructions": "rules", "max_output_tokens": 20}, http.StatusOK)
	out1 := path(t, r1, "output", 0, "content", 0, "text").(string)
	// Instructions do not carry over (vLLM drops the stored system
	// messages): the follow-up repeats them to keep the prompt's prefix.
	r2 := postObject(t, c, e.URL()+"/v1/responses", map[string]any{"input": "and then?", "instructions": "rules",
		"previous_response_id": r1["id"], "max_output_tokens": 3}, http.StatusOK)
	if got := path(t, r2, "previous_response_id"); got != r1["id"] {
		t.Errorf("previous_response_id echoed as %v", got)
	}
	// The follow-up's prompt: its instructions, the first conversation,
	// the first output, then the new input.
	equiv := []map[string]any{{"role": "system", "content": "rules"}, {"role": "user", "content": first},
		{"role": "assistant", "content": out1}, {"role": "user", "content": "and then?"}}
	if got, want := path(t, r2, "output", 0, "content", 0, "text"), chatText(t, c, e, equiv, 3); got != want {
		t.Errorf("follow-up generated %q, the chat path %q for the chained messages", got, want)
	}
	// Without instructions the stored system message is gone.
	r3 := postObject(t, c, e.URL()+"/v1/responses", map[string]any{"input": "and then?", "previous_response_id": r1["id"], "max_output_tokens": 3}, http.StatusOK)
	if got, want := path(t, r3, "output", 0, "content", 0, "text"), chatText(t, c, e, equiv[1:], 3); got != want {
		t.Errorf("follow-up without instructions generated %q, the chat path %q", got, want)
	}
	if cached := num(t, path(t, r2, "usage", "input_tokens_details", "cached_tokens")); cached == 0 {
		t.Errorf("follow-up hit no cached tokens: usage %v", r2["usage"])
	}
	if st := e.Stats(); st.ResponsesStored != 3 {
		t.Errorf("ResponsesStored = %d, want 3", st.ResponsesStored)
	}
}

func TestResponsesUnknownPrevious(t *testing.T) {
	e, c := apiEngine(t, Config{})
	notFound := func(t *testing.T, id any) {
		t.Helper()
		m := postObject(t, c, e.URL()+"/v1/responses", map[string]any{"input": "x", "previous_response_id": id}, http.StatusNotFound)
		if path(t, m, "error", "message") != "Response with id '"+id.(string)+"' not found." ||
			path(t, m, "error", "type") != "invalid_request_error" || path(t, m, "error", "param") != "response_id" ||
			num(t, path(t, m, "error", "code")) != 404 {
			t.Errorf("error body %v", m)
		}
	}
	t.Run("never stored", func(t *testing.T) { notFound(t, "resp_0123") })
	t.Run("store false", func(t *testing.T) {
		r := postObject(t, c, e.URL()+"/v1/responses", map[string]any{"input": "x", "store": false}, http.StatusOK)
		notFound(t, r["id"])
	})
	t.Run("forgotten by a restart", func(t *testing.T) {
		r := postObject(t, c, e.URL()+"/v1/responses", map[string]any{"input": "x"}, http.StatusOK)
		postObject(t, c, e.URL()+"/v1/responses", map[string]any{"input": "y", "previous_response_id": r["id"]}, http.StatusOK)
		if err := e.Restart(); err != nil {
			t.Fatal(err)
		}
		c.CloseIdleConnections() // the restart dropped them
		if n := e.Stats().ResponsesStored; n != 0 {
			t.Errorf("ResponsesStored = %d after a restart", n)
		}
		notFound(t, r["id"])
	})
}

func TestResponseStoreBounded(t *testing.T) {
	s := newResponseStore(3, 1<<20)
	for _, id := range []string{"a", "b", "c", "d"} {
		s.put(id, []chatMessage{textMessage("user", id)}, "out")
	}
	if _, ok := s.get("a"); ok || s.len() != 3 {
		t.Errorf("oldest kept or wrong size %d", s.len())
	}
	small := newResponseStore(100, 400)
	for _, id := range []string{"a", "b", "c", "d"} {
		small.put(id, []chatMessage{textMessage("user", strings.Repeat("x", 100))}, "out")
	}
	if small.bytes > 400 || small.len() == 0 {
		t.Errorf("byte bound: %d bytes in %d responses", small.bytes, small.len())
	}
	if off := newResponseStore(-1, 1<<20); off.enabled() {
		t.Error("a negative size stores")
	}
}
