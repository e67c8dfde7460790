package openai

import (
	"bytes"
	"encoding/json"
)

// ModelNotFoundJSON is the error body OpenAI answers, with a 404, for a
// request naming a model it does not serve: its message, its
// invalid_request_error type, param "model" and code "model_not_found".
// The model's name is JSON-escaped (HTML characters left as they are), so
// any name a client sends yields a valid body.
func ModelNotFoundJSON(model string) []byte {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Param   string `json:"param"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	body.Error.Message = "The model `" + model + "` does not exist."
	body.Error.Type, body.Error.Param, body.Error.Code = "invalid_request_error", "model", "model_not_found"
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		// Strings always encode (invalid UTF-8 as U+FFFD); keep a valid
		// body regardless.
		return []byte(`{"error":{"message":"The model does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}` + "\n")
	}
	return buf.Bytes()
}
