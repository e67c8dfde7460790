package caddymodule

import (
	"errors"
	"net/http"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/openai"
)

// The gateway's own error answers, in the format of the API the request
// was for: Anthropic's on /v1/messages, so that its SDKs raise their own
// error types, OpenAI's everywhere else (the Responses and pooling APIs
// answer errors in it too). Each writer returns nil: the response is
// complete, and Caddy must not write another one.

// anthropic reports whether r is for the Anthropic Messages API.
func anthropic(r *http.Request) bool {
	return openai.EndpointOf(r.URL.Path) == openai.EndpointMessages
}

// answer is one of the gateway's error answers: its status, its message,
// and its body in OpenAI's format.
type answer struct {
	status int
	msg    string
	body   []byte
}

// writeError writes a, its OpenAI body, or, for the Anthropic API, its
// message in Anthropic's shape.
func writeError(w http.ResponseWriter, r *http.Request, a answer) error {
	if anthropic(r) {
		a.body = openai.AnthropicErrorJSON(a.msg, a.status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
	return nil
}

// errorEvent is the SSE event that ends a stream already answered 200
// with an error, in the format of r's API.
func errorEvent(r *http.Request, msg string, status int) []byte {
	if anthropic(r) {
		return openai.AnthropicErrorEvent(msg, status)
	}
	return openai.ErrorEvent(msg, status)
}

// writeJSONError answers status with msg in the format of r's API, typed
// as OpenAI types that status (openai.ErrorType).
func writeJSONError(w http.ResponseWriter, r *http.Request, status int, msg string) error {
	return writeError(w, r, answer{status, msg, openai.ErrorJSON(msg, "", status)})
}

// modelNotFound answers a request for a model no engine of the pool
// serves as OpenAI does: 404, model_not_found. Waiting would not help (an
// engine's models change with its restart, not with its load), nor would
// sending it to an engine, which would answer the same after a tokenize
// and a trip. band labels the rejection's count.
func modelNotFound(w http.ResponseWriter, r *http.Request, band, model string) error {
	rejectedTotal.WithLabelValues(band, "model_not_found").Inc()
	msg := "The model `" + model + "` does not exist."
	return writeError(w, r, answer{http.StatusNotFound, msg, openai.ModelNotFoundJSON(model)})
}

// writeRequestError answers a body its parser rejected with 400 and an
// error naming the field at fault.
func writeRequestError(w http.ResponseWriter, r *http.Request, err error) error {
	var re *openai.RequestError
	if !errors.As(err, &re) {
		return writeJSONError(w, r, http.StatusBadRequest, err.Error())
	}
	return writeError(w, r, answer{http.StatusBadRequest, re.Error(), re.JSON()})
}

// writeContextLength answers a contextLengthError as vLLM does: 400, type
// BadRequestError, and counts the request as rejected for its band.
func writeContextLength(w http.ResponseWriter, r *http.Request, band admission.Band, msg string) error {
	rejectedTotal.WithLabelValues(band.String(), "context_length").Inc()
	return writeError(w, r, answer{http.StatusBadRequest, msg, openai.ContextLengthJSON(msg)})
}
