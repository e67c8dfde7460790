package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// Request holds the fields of an OpenAI-style completions or chat
// completions body that the gateway routes and admits on. Raw fields alias
// the body passed to ParseRequest: keep the body unchanged while using them.
//
// Keys are matched exactly (case-sensitively), as vLLM's server does; for a
// key given more than once the last occurrence wins, as in encoding/json and
// Python. A JSON null counts as absent for every field.
type Request struct {
	Model        string // "model"
	Stream       bool   // "stream"
	IncludeUsage bool   // "stream_options": {"include_usage": ...}
	// Prompt is the /v1/completions "prompt", a string or an array (of
	// strings, token ids or token-id arrays), raw; nil if absent.
	Prompt json.RawMessage
	// Messages is the /v1/chat/completions "messages" array, raw and not
	// decoded; nil if absent.
	Messages json.RawMessage
	// Chat-template controls passed to vLLM's renderer; nil if absent.
	AddGenerationPrompt, ContinueFinalMessage, AddSpecialTokens *bool
	ChatTemplate                                                string          // "chat_template"
	ChatTemplateKwargs                                          json.RawMessage // "chat_template_kwargs" object, raw
	Tools                                                       json.RawMessage // "tools" array, raw
	// CacheSalt is vLLM's "cache_salt": it enters the hash of the first KV
	// block, so requests with different salts never share a prefix.
	CacheSalt string

	// The fields below are set by the parsers of the other APIs
	// (ParseResponses, ParseAnthropic, ParsePooling); ParseRequest leaves
	// them zero. Those parsers build Messages and Tools anew (not aliasing
	// the body) in the chat completions form vLLM converts them to.

	// PreviousResponseID is the /v1/responses "previous_response_id". vLLM
	// keeps stored responses in the serving process's memory and prepends
	// the stored conversation to Messages, so a follow-up must go to the
	// engine that stored it.
	PreviousResponseID string
	// Store is the /v1/responses "store"; nil if absent (vLLM then stores
	// the response if its store is enabled).
	Store *bool
	// MaxTokens is the Anthropic "max_tokens" or the Responses
	// "max_output_tokens"; nil if absent.
	MaxTokens *int64
	// PrefillOnly marks a pooling request (embeddings, pooling, score,
	// rerank, classify): it computes no output token, only the prompt.
	PrefillOnly bool
	// Query and Documents are the two sides of a /score or /rerank
	// request, raw: "query" (rerank) or "queries", "text_1", "data_1"
	// (score), and "documents", "items", "text_2", "data_2". The other
	// pooling endpoints put their input in Prompt (or Messages).
	Query, Documents json.RawMessage
	// Alias is the model name the client sent when the gateway rewrote
	// Model from it (a configured alias; see caddymodule's parseRequest):
	// answers about the request name what the client asked for. ""
	// otherwise; no parser sets it.
	Alias string
}

// RequestError describes why a request body was rejected. The handler
// answers it with 400 and the body from JSON.
type RequestError struct {
	// Param is the top-level field at fault, or "" when the body as a whole
	// is malformed.
	Param string
	// Offset is the byte offset in the body where the problem was found.
	Offset int
	// Msg says what is wrong.
	Msg string
}

func (e *RequestError) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("invalid request body: field %q: %s", e.Param, e.Msg)
	}
	return fmt.Sprintf("invalid request body: %s (at byte %d)", e.Msg, e.Offset)
}

// JSON renders the error as an OpenAI-style 400 error body, with "param"
// naming the field at fault.
func (e *RequestError) JSON() []byte {
	return errorJSON(e.Error(), "invalid_request_error", e.Param, http.StatusBadRequest)
}

// ParseRequest extracts the gateway's fields from a request body in one pass
// over the top-level object, validating the whole body as JSON without
// decoding the values it does not keep. It accepts exactly the bodies that
// encoding/json accepts as an object, except that it also requires valid
// UTF-8 and nesting no deeper than 128, and it checks the types of the
// fields it keeps. Every error is a *RequestError.
func ParseRequest(body []byte) (*Request, error) {
	p := &reqParser{s: scanner{b: body}}
	r, err := p.parse()
	// Invalid UTF-8 is reported first, wherever it is, as when the body was
	// checked before parsing. A parsed body's longest ASCII string (the
	// scanner saw its bytes) needs no second pass; ASCII bytes are rune
	// boundaries, so the rest is valid iff the parts around it are.
	lo, hi := p.s.asciiLo, p.s.asciiHi
	if err != nil || !utf8.Valid(body[:lo]) || !utf8.Valid(body[hi:]) {
		if off := invalidUTF8Offset(body); off >= 0 {
			return nil, &RequestError{Offset: off, Msg: "body is not valid UTF-8"}
		}
	}
	return r, err
}

// parse is ParseRequest's pass over the body, which it checks for UTF-8.
func (p *reqParser) parse() (*Request, error) {
	body := p.s.b
	s := &p.s
	s.ws()
	if s.peek() != '{' {
		if s.i >= len(body) {
			return nil, &RequestError{Offset: s.i, Msg: "empty body: expected a JSON object"}
		}
		if _, _, err := s.value(); err != nil {
			return nil, syntaxToRequestError(err)
		}
		return nil, &RequestError{Offset: 0, Msg: "body must be a JSON object"}
	}
	err := s.object(func(ks, ke int, esc bool) error {
		return p.member(keyBytes(body, ks, ke, esc))
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return nil, syntaxToRequestError(err)
	}
	// A mistyped field only counts if no later duplicate replaced it, as
	// the last occurrence is the one vLLM sees. Report the earliest.
	var first *RequestError
	for _, e := range p.typeErrs {
		if e != nil && (first == nil || e.Offset < first.Offset) {
			first = e
		}
	}
	if first != nil {
		return nil, first
	}
	return &p.r, nil
}

func syntaxToRequestError(err error) error {
	var se *syntaxError
	if errors.As(err, &se) {
		return &RequestError{Offset: se.Off, Msg: "malformed JSON: " + se.Msg}
	}
	return err
}

// kind names a JSON value's type by its first byte, for error messages.
func kind(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// field identifies a kept top-level field.
type field int

const (
	fModel field = iota
	fStream
	fStreamOptions
	fPrompt
	fMessages
	fAddGenerationPrompt
	fContinueFinalMessage
	fAddSpecialTokens
	fChatTemplate
	fChatTemplateKwargs
	fTools
	fCacheSalt
	numFields
)

type reqParser struct {
	s        scanner
	r        Request
	typeErrs [numFields]*RequestError // pending per field; a later duplicate clears it
}

// member handles one top-level key with the scanner on its value.
func (p *reqParser) member(key []byte) error {
	s, r := &p.s, &p.r
	switch string(key) {
	case "model":
		return p.str(fModel, "model", &r.Model)
	case "chat_template":
		return p.str(fChatTemplate, "chat_template", &r.ChatTemplate)
	case "cache_salt":
		return p.str(fCacheSalt, "cache_salt", &r.CacheSalt)
	case "stream":
		b, err := p.boolean(fStream, "stream")
		r.Stream = b != nil && *b
		return err
	case "add_generation_prompt":
		b, err := p.boolean(fAddGenerationPrompt, "add_generation_prompt")
		r.AddGenerationPrompt = b
		return err
	case "continue_final_message":
		b, err := p.boolean(fContinueFinalMessage, "continue_final_message")
		r.ContinueFinalMessage = b
		return err
	case "add_special_tokens":
		b, err := p.boolean(fAddSpecialTokens, "add_special_tokens")
		r.AddSpecialTokens = b
		return err
	case "prompt":
		return p.raw(fPrompt, "prompt", `"[`, "a string or an array", &r.Prompt)
	case "messages":
		return p.raw(fMessages, "messages", "[", "an array", &r.Messages)
	case "tools":
		return p.raw(fTools, "tools", "[", "an array", &r.Tools)
	case "chat_template_kwargs":
		return p.raw(fChatTemplateKwargs, "chat_template_kwargs", "{", "an object", &r.ChatTemplateKwargs)
	case "stream_options":
		// A repeated key replaces the whole value, include_usage included.
		p.typeErrs[fStreamOptions] = nil
		r.IncludeUsage = false
		switch s.peek() {
		case 'n':
			return s.skip()
		case '{':
		default:
			return p.typeErr(fStreamOptions, "stream_options", "an object")
		}
		return s.object(func(ks, ke int, esc bool) error {
			if string(keyBytes(s.b, ks, ke, esc)) != "include_usage" {
				return s.skip()
			}
			b, err := p.boolean(fStreamOptions, "stream_options.include_usage")
			r.IncludeUsage = b != nil && *b
			return err
		})
	}
	return s.skip()
}

// typeErr records that field f has the wrong type and skips the value. A
// syntax error inside the value wins, so the message describes the first
// thing wrong with the body.
func (p *reqParser) typeErr(f field, param, want string) error {
	off, c := p.s.i, p.s.peek()
	if err := p.s.skip(); err != nil {
		return err
	}
	p.typeErrs[f] = &RequestError{Param: param, Offset: off, Msg: "must be " + want + ", not " + kind(c)}
	return nil
}

// str reads a string or null ("") into dst.
func (p *reqParser) str(f field, param string, dst *string) error {
	s := &p.s
	p.typeErrs[f] = nil
	*dst = ""
	switch s.peek() {
	case 'n':
		return s.skip()
	case '"':
	default:
		return p.typeErr(f, param, "a string")
	}
	start, end, esc, err := s.str()
	if err != nil {
		return err
	}
	v, err := unquote(s.b, start, end, esc)
	if err != nil { // cannot happen: the scanner validated the string
		return &RequestError{Param: param, Offset: start - 1, Msg: err.Error()}
	}
	*dst = v
	return nil
}

// boolean reads true, false or null (nil). For stream_options.include_usage
// the pending error of stream_options was already reset by the caller.
func (p *reqParser) boolean(f field, param string) (*bool, error) {
	s := &p.s
	if f != fStreamOptions {
		p.typeErrs[f] = nil
	}
	switch s.peek() {
	case 't':
		v := true
		return &v, s.literal()
	case 'f':
		v := false
		return &v, s.literal()
	case 'n':
		return nil, s.skip()
	}
	return nil, p.typeErr(f, param, "a boolean")
}

// raw keeps the value as a sub-slice of the body (nil for null) if its
// first byte is one of firsts.
func (p *reqParser) raw(f field, param, firsts, want string, dst *json.RawMessage) error {
	s := &p.s
	p.typeErrs[f] = nil
	*dst = nil
	c := s.peek()
	if c == 'n' {
		return s.skip()
	}
	if strings.IndexByte(firsts, c) < 0 {
		return p.typeErr(f, param, want)
	}
	start, end, err := s.value()
	if err != nil {
		return err
	}
	*dst = s.b[start:end:end]
	return nil
}

// ErrorJSON renders an OpenAI-style error body:
//
//	{"error":{"message":"...","type":"...","param":null,"code":400}}
//
// An empty typ is derived from code with ErrorType. The message is
// JSON-escaped; invalid UTF-8 in it becomes U+FFFD.
func ErrorJSON(message, typ string, code int) []byte {
	return errorJSON(message, typ, "", code)
}

func errorJSON(message, typ, param string, code int) []byte {
	if typ == "" {
		typ = ErrorType(code)
	}
	body := struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    int     `json:"code"`
		} `json:"error"`
	}{}
	body.Error.Message, body.Error.Type, body.Error.Code = message, typ, code
	if param != "" {
		body.Error.Param = &param
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		// Strings and ints always encode; keep a valid body regardless.
		return []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":500}}`)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// ErrorType returns the OpenAI error type conventionally used with an HTTP
// status: "invalid_request_error" for most 4xx, "authentication_error" (401),
// "permission_error" (403), "not_found_error" (404), "rate_limit_error"
// (429), and "server_error" for 5xx and anything else.
func ErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 400 && status < 500:
		return "invalid_request_error"
	}
	return "server_error"
}
