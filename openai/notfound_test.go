package openai

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// TestModelNotFoundJSON: OpenAI's shape, and any name (quotes, control
// characters, invalid UTF-8) gives valid JSON naming it.
func TestModelNotFoundJSON(t *testing.T) {
	for _, model := range []string{"gpt-x", `a"b\c<d>`, "nl\n\x00", "\xff\xfe", ""} {
		var got struct {
			Error struct {
				Message, Type, Param, Code string
			}
		}
		if err := json.Unmarshal(ModelNotFoundJSON(model), &got); err != nil {
			t.Fatalf("%q: invalid JSON: %v", model, err)
		}
		e := got.Error
		if e.Type != "invalid_request_error" || e.Param != "model" || e.Code != "model_not_found" {
			t.Errorf("%q: %+v", model, e)
		}
		if utf8.ValidString(model) { // invalid bytes are replaced
			if want := "The model `" + model + "` does not exist."; e.Message != want {
				t.Errorf("message %q, want %q", e.Message, want)
			}
		}
	}
}
