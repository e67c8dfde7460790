package chattemplate

import (
	"errors"
	"fmt"
	"time"

	"github.com/ardanlabs/jinja"
)

// MaxOutputBytes is the default bound on a rendered prompt: 16 MiB is
// several times the longest context any served model accepts as text, so
// output beyond it means a runaway template or input, not a real prompt.
const MaxOutputBytes = 16 << 20

// Template is a parsed chat template; safe for concurrent use.
type Template struct {
	tmpl   *jinja.Template
	src    string
	format ContentFormat
	names  map[string]bool // every name the engine may look up in the render context
}

// Parse compiles a chat template. It also works out the template's content
// format the way vLLM does, so Render can shape message content to match.
func Parse(src string) (*Template, error) {
	prep, err := prepareSource(src)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: parse: %w", err)
	}
	tmpl, err := jinja.Compile(prep.src)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: parse: %w", err)
	}
	return &Template{tmpl: tmpl, src: src, format: detectContentFormat(prep.statements), names: prep.names}, nil
}

// ContentFormat returns the content format detected for the template.
func (t *Template) ContentFormat() ContentFormat { return t.format }

// Source returns the template source as given to Parse.
func (t *Template) Source() string { return t.src }

// Input is one chat request to render.
type Input struct {
	Messages             []any             // the request's messages, decoded from JSON (maps with string keys, or Objects from DecodeJSON to keep key order)
	Tools                []any             // the request's tools, or nil
	AddGenerationPrompt  bool              // add_generation_prompt
	ContinueFinalMessage bool              // continue_final_message
	Kwargs               map[string]any    // chat_template_kwargs, spread into the template's context
	Special              map[string]string // bos_token, eos_token, unk_token, pad_token ... from tokenizer_config.json
	Now                  func() time.Time  // for strftime_now; nil means time.Now (tests fix it)

	// ContentFormat overrides the detected content format, as vLLM's
	// --chat-template-content-format does; empty means detected.
	ContentFormat ContentFormat
	// MaxOutputBytes bounds the rendered prompt; 0 means MaxOutputBytes.
	MaxOutputBytes int
}

// Render renders the conversation as vLLM would before tokenizing it: the
// messages and tools are first reshaped the way vLLM's chat front end
// reshapes them, then the template runs with transformers' context, and
// continue_final_message cuts the output as transformers does.
func (t *Template) Render(in Input) (string, error) {
	out, err := t.render(in)
	if err != nil {
		return "", fmt.Errorf("chattemplate: %w", err)
	}
	return out, nil
}

func (t *Template) render(in Input) (string, error) {
	req, err := resolveRequest(in)
	if err != nil {
		return "", err
	}
	format := t.format
	if in.ContentFormat != "" {
		format = in.ContentFormat
	}
	conv, err := vllmConversation(in.Messages, format)
	if err != nil {
		return "", err
	}
	var final string
	if req.continueFinal {
		if final, err = finalText(conv); err != nil {
			return "", err
		}
	}
	data, err := renderContext(in, req, conv, t.names)
	if err != nil {
		return "", err
	}
	out, err := t.execute(data, in.MaxOutputBytes)
	if err != nil {
		return "", err
	}
	if req.continueFinal {
		return cutAfterFinal(out, final)
	}
	return out, nil
}

// execute runs the engine. The engine is not ours, so a panic inside it
// is turned into an error rather than taking the gateway down.
func (t *Template) execute(data map[string]jinja.Value, limit int) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("render: template engine failed: %v", r)
		}
	}()
	out, err = t.tmpl.RenderValues(data)
	if err != nil {
		var raised *RaiseError
		if errors.As(err, &raised) {
			return "", raised
		}
		return "", fmt.Errorf("render: %w", err)
	}
	if limit <= 0 {
		limit = MaxOutputBytes
	}
	if len(out) > limit {
		return "", fmt.Errorf("%w: %d bytes, limit %d", ErrOutputTooLarge, len(out), limit)
	}
	return out, nil
}
