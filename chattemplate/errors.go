package chattemplate

import "errors"

// The sentinel errors below are wrapped with context; match them with
// errors.Is.
var (
	// ErrInvalidInput marks a request that vLLM would reject too: a
	// message, part, tool or keyword argument of the wrong shape, or a
	// continue_final_message request the template cannot honour.
	ErrInvalidInput = errors.New("invalid input")
	// ErrUnsupportedContent marks a request that vLLM accepts but whose
	// prompt cannot be computed here, such as an image part, whose
	// placeholder text depends on the model's processor and the media.
	// Callers fall back to the engine's own tokenizer for these.
	ErrUnsupportedContent = errors.New("content cannot be rendered locally")
	// ErrOutputTooLarge marks a rendered prompt longer than the limit.
	ErrOutputTooLarge = errors.New("rendered prompt exceeds the size limit")
	// ErrNoTemplate marks a model directory or selection without a chat
	// template.
	ErrNoTemplate = errors.New("no chat template")
)

// RaiseError is the error a template raises through raise_exception, as
// jinja2 raises TemplateError(message) for transformers. vLLM reports it
// to the client as a bad request.
type RaiseError struct {
	// Message is the template's message, as given.
	Message string
}

// Error implements error.
func (e *RaiseError) Error() string { return "template raised an exception: " + e.Message }
