package openai

import (
	"fmt"
	"net/http"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// OutputBudget is the most tokens a request body asks the engine to
// generate, as vLLM's length check reads it: for a chat request (chat
// true) max_completion_tokens when it is given and not 0 (vLLM takes
// `max_completion_tokens or max_tokens`), else max_tokens; for a
// completion, max_tokens. It is 0 when the body gives none (null counts
// as none), and -1 when the one it gives is not a positive integer, or the
// body is not a JSON object: vLLM then answers with an error of its own,
// which the gateway must not pre-empt with another. The last of duplicate
// keys counts, as for ParseRequest.
//
// It walks the top-level object without decoding what it skips; callers
// run it only when a request's prompt length is known to matter.
func OutputBudget(body []byte, chat bool) int64 {
	s := scanner{b: body}
	s.ws()
	if s.peek() != '{' {
		return -1
	}
	var maxTokens, maxCompletion []byte
	err := s.object(func(ks, ke int, esc bool) error {
		key := keyBytes(body, ks, ke, esc)
		start, end, err := s.value()
		switch string(key) {
		case "max_tokens":
			maxTokens = body[start:end]
		case "max_completion_tokens":
			maxCompletion = body[start:end]
		}
		return err
	})
	if err != nil {
		return -1
	}
	if chat {
		if n := budgetValue(maxCompletion); n != 0 {
			return n
		}
	}
	return budgetValue(maxTokens)
}

// budgetValue is a max_tokens value's budget: 0 when absent, null or 0
// (Python's falsy values, which vLLM's `or` passes over), -1 when it is
// not a positive integer.
func budgetValue(raw []byte) int64 {
	if raw == nil || string(raw) == "null" {
		return 0
	}
	n, ok := jsonlex.ParseInt64(raw)
	switch {
	case ok && n == 0:
		return 0
	case !ok || n < 0:
		return -1
	}
	return n
}

// ContextLengthMessage is the message of vLLM's 400 for a request whose
// prompt of promptTokens tokens, with an output budget of budget tokens
// (see OutputBudget; 0: none given), does not fit a model's context of
// maxModelLen tokens; "" when it fits, or when the rule cannot tell.
//
// The rule is vLLM's (OpenAIServing._validate_input): with a budget, the
// prompt and the budget together must not exceed the context; without
// one, the prompt must be shorter than the context. (For a completion
// without max_tokens vLLM assumes 16, and a chat request's budget may be
// filled in from the generation config; the gateway knows neither, so it
// refuses only what every engine would.) A budget vLLM refuses for
// itself (-1) is left to the engine. The words are those of vLLM 0.6 to
// 0.9, which the simulator in internal/sim/vllmsim answers with too.
func ContextLengthMessage(maxModelLen, promptTokens int, budget int64) string {
	n, p := int64(maxModelLen), int64(promptTokens)
	switch {
	case maxModelLen <= 0 || promptTokens <= 0 || budget < 0:
		return ""
	case budget == 0 && p >= n:
		return fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the messages, Please reduce the length of the messages.",
			n, p)
	case budget > 0 && budget > n-p: // p + budget > n, without overflow
		return fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			n, addCapped(p, budget), p, budget)
	}
	return ""
}

// addCapped is a + b for non-negative a and b, at most the largest int64.
func addCapped(a, b int64) int64 {
	if b > 1<<63-1-a {
		return 1<<63 - 1
	}
	return a + b
}

// ContextLengthJSON is vLLM's error body for a ContextLengthMessage:
// type BadRequestError, param null, code 400.
func ContextLengthJSON(msg string) []byte {
	return errorJSON(msg, "BadRequestError", "", http.StatusBadRequest)
}
