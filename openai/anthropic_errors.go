package openai

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// AnthropicErrorType is the Anthropic API's error type for an HTTP status,
// the names its SDKs and clients read: invalid_request_error (400 and
// other 4xx), authentication_error (401), permission_error (403),
// not_found_error (404), request_too_large (413), rate_limit_error (429),
// overloaded_error (503 and 529: no capacity, retry later) and api_error
// (other 5xx).
func AnthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 || status < 400 {
		return "api_error"
	}
	return "invalid_request_error"
}

// AnthropicErrorJSON renders an error body in the Anthropic Messages API's
// shape, the one its SDKs parse into their error types:
//
//	{"type":"error","error":{"type":"not_found_error","message":"..."}}
//
// The message is JSON-escaped; invalid UTF-8 in it becomes U+FFFD.
func AnthropicErrorJSON(message string, status int) []byte {
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Type, body.Error.Type, body.Error.Message = "error", AnthropicErrorType(status), message
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		// Strings always encode; keep a valid body regardless.
		return []byte(`{"type":"error","error":{"type":"api_error","message":"internal error"}}`)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// AnthropicErrorEvent is AnthropicErrorJSON as the SSE error event an
// Anthropic stream ends with when it fails after its 200:
//
//	event: error
//	data: {"type":"error","error":{"type":"overloaded_error","message":"..."}}
func AnthropicErrorEvent(message string, status int) []byte {
	body := AnthropicErrorJSON(message, status)
	out := make([]byte, 0, len(body)+len("event: error\ndata: \n\n"))
	out = append(out, "event: error\ndata: "...)
	out = append(out, body...)
	return append(out, "\n\n"...)
}
