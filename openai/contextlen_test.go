package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestOutputBudget: the budget vLLM's length check uses, from the body.
func TestOutputBudget(t *testing.T) {
	tests := []struct {
		body string
		chat bool
		want int64
	}{
		{`{"model":"m"}`, true, 0},
		{`{"max_tokens":null}`, true, 0},
		{`{"max_tokens":7}`, true, 7},
		{`{"max_tokens":7}`, false, 7},
		{`{"max_completion_tokens":9,"max_tokens":7}`, true, 9},
		{`{"max_completion_tokens":9,"max_tokens":7}`, false, 7}, // completions have no max_completion_tokens
		{`{"max_completion_tokens":9}`, false, 0},
		{`{"max_completion_tokens":0,"max_tokens":7}`, true, 7}, // `0 or 7`
		{`{"max_completion_tokens":null,"max_tokens":7}`, true, 7},
		{`{"max_tokens":7,"max_tokens":8}`, false, 8}, // the last duplicate
		{`{"messages":[{"max_tokens":1}],"max_tokens":5}`, true, 5},
		{`{"max_tokens":0}`, false, 0},
		{`{"max_tokens":-3}`, false, -1},
		{`{"max_completion_tokens":-3,"max_tokens":7}`, true, -1},
		{`{"max_tokens":1.5}`, false, -1},
		{`{"max_tokens":"8"}`, false, -1},
		{`{"max_tokens":99999999999999999999}`, false, -1},
		{`{"max_t\u006fkens":4}`, false, 4},
		{`[1]`, false, -1},
		{`{"max_tokens":4`, false, -1},
	}
	for _, tt := range tests {
		if got := OutputBudget([]byte(tt.body), tt.chat); got != tt.want {
			t.Errorf("OutputBudget(%s, chat %t) = %d, want %d", tt.body, tt.chat, got, tt.want)
		}
	}
}

// TestContextLengthMessage is the exact rule: with a budget, prompt plus
// budget must not exceed the context; without one, the prompt must be
// shorter than it; unknown lengths and budgets vLLM refuses itself refuse
// nothing.
func TestContextLengthMessage(t *testing.T) {
	tests := []struct {
		limit, prompt int
		budget        int64
		want          string
	}{
		{128, 127, 0, ""},
		{128, 128, 0, "This model's maximum context length is 128 tokens. However, you requested 128 tokens in the messages, Please reduce the length of the messages."},
		{128, 100, 28, ""},
		{128, 100, 29, "This model's maximum context length is 128 tokens. However, you requested 129 tokens (100 in the messages, 29 in the completion). Please reduce the length of the messages or completion."},
		{128, 200, 1, "This model's maximum context length is 128 tokens. However, you requested 201 tokens (200 in the messages, 1 in the completion). Please reduce the length of the messages or completion."},
		{128, 5, 1<<63 - 1, "This model's maximum context length is 128 tokens. However, you requested 9223372036854775807 tokens (5 in the messages, 9223372036854775807 in the completion). Please reduce the length of the messages or completion."},
		{128, 500, -1, ""}, // vLLM refuses the budget itself
		{0, 500, 0, ""},    // the context length is unknown
		{128, 0, 500, ""},  // the prompt's length is unknown
	}
	for _, tt := range tests {
		if got := ContextLengthMessage(tt.limit, tt.prompt, tt.budget); got != tt.want {
			t.Errorf("ContextLengthMessage(%d, %d, %d) = %q, want %q", tt.limit, tt.prompt, tt.budget, got, tt.want)
		}
	}
}

// TestContextLengthJSON: vLLM's error shape.
func TestContextLengthJSON(t *testing.T) {
	var v struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}
	raw := ContextLengthJSON("too <long>")
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if e := v.Error; e.Message != "too <long>" || e.Type != "BadRequestError" || e.Param != nil || e.Code != 400 {
		t.Errorf("body %s", raw)
	}
}

// BenchmarkOutputBudget: the extra pass over a 100 KB chat body that a
// request whose prompt length matters costs.
func BenchmarkOutputBudget(b *testing.B) {
	msg, _ := json.Marshal(strings.Repeat("a fairly ordinary sentence of a long prompt. ", 2300))
	body := []byte(`{"model":"m","messages":[{"role":"user","content":` + string(msg) + `}],"max_tokens":256}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if OutputBudget(body, true) != 256 {
			b.Fatal("wrong budget")
		}
	}
}

// oracleBudget is OutputBudget by encoding/json, for bodies ParseRequest
// accepts (the only ones OutputBudget is given).
func oracleBudget(body []byte, chat bool) int64 {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return -1
	}
	value := func(key string) int64 {
		raw, ok := m[key]
		if !ok || string(raw) == "null" {
			return 0
		}
		var n int64
		switch err := json.Unmarshal(raw, &n); {
		case err != nil || n < 0:
			return -1
		}
		return n
	}
	if chat {
		if n := value("max_completion_tokens"); n != 0 {
			return n
		}
	}
	return value("max_tokens")
}

// FuzzOutputBudget checks OutputBudget against encoding/json on the bodies
// ParseRequest accepts, and that it never panics on any.
func FuzzOutputBudget(f *testing.F) {
	for _, s := range []string{
		`{"max_tokens":5}`, `{"max_completion_tokens":3,"max_tokens":5}`, `{"max_tokens":null}`,
		`{"max_tokens":-0}`, `{"max_tokens":1e2}`, `{"max_tokens":"5"}`, `{"max_t\u006fkens":4}`,
		`{"max_tokens":9223372036854775808}`, `{"messages":[{"max_tokens":1}],"max_tokens":2,"max_tokens":3}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		got := OutputBudget(body, chat)
		if _, err := ParseRequest(body); err != nil {
			return
		}
		if want := oracleBudget(body, chat); got != want {
			t.Fatalf("OutputBudget(%q, chat %t) = %d, encoding/json says %d", body, chat, got, want)
		}
	})
}
