package chattemplate

import (
	"errors"
	"fmt"
	"time"

	"github.com/ardanlabs/jinja"
)

// request is an Input with its chat_template_kwargs resolved.
type request struct {
	addGenerationPrompt bool
	continueFinal       bool
	tools               jinja.Value // None when the request has none
	kwargs              map[string]jinja.Value
}

// resolveRequest merges chat_template_kwargs over the request's own
// fields as vLLM does: _preprocess_chat builds {add_generation_prompt,
// continue_final_message, tools, documents} and then updates it with
// chat_template_kwargs, so those keys in the kwargs win. Keys vLLM
// rejects (chat_template, tokenize) and keys that would collide with the
// conversation itself are errors; apply_chat_template's own options never
// reach the template and are dropped.
func resolveRequest(in Input) (request, error) {
	req := request{
		addGenerationPrompt: in.AddGenerationPrompt,
		continueFinal:       in.ContinueFinalMessage,
		tools:               jinja.None(),
		kwargs:              make(map[string]jinja.Value, len(in.Kwargs)),
	}
	if in.Tools != nil {
		tools, err := vllmTools(in.Tools)
		if err != nil {
			return request{}, err
		}
		req.tools = tools
	}
	for k, raw := range in.Kwargs {
		v, err := toValue(raw, 0)
		if err != nil {
			return request{}, fmt.Errorf("chat_template_kwargs %q: %w", k, err)
		}
		switch k {
		case "chat_template", "tokenize", "messages", "conversation":
			return request{}, fmt.Errorf("%w: chat_template_kwargs may not set %q", ErrInvalidInput, k)
		case "add_generation_prompt":
			req.addGenerationPrompt = v.IsTruthy()
		case "continue_final_message":
			req.continueFinal = v.IsTruthy()
		case "tools":
			req.tools = v
		case "return_dict", "return_assistant_tokens_mask", "padding", "truncation",
			"max_length", "return_tensors", "tokenizer_kwargs":
		default:
			req.kwargs[k] = v
		}
	}
	if req.addGenerationPrompt && req.continueFinal {
		return request{}, fmt.Errorf("%w: continue_final_message and add_generation_prompt cannot both be set", ErrInvalidInput)
	}
	return req, nil
}

// renderContext assembles the template's variables as transformers does:
// render(messages=..., tools=..., documents=..., add_generation_prompt=...,
// **special_tokens_map, **chat_template_kwargs), over the globals
// raise_exception and strftime_now. tools and documents are None, not
// undefined, when absent, so `tools is defined` holds as in Python.
//
// Only the names the template mentions (names; nil means all) go in: the
// engine copies the context into a map of its own on every render, and
// past eight entries that copy grows a table, a large part of a small
// prompt's render.
func renderContext(in Input, req request, conv []jinja.Value, names map[string]bool) (map[string]jinja.Value, error) {
	now := in.Now
	if now == nil {
		now = time.Now
	}
	want := func(k string) bool { return names == nil || names[k] }
	data := make(map[string]jinja.Value, 8)
	if want("raise_exception") {
		data["raise_exception"] = jinja.NewCallable("raise_exception", raiseException)
	}
	if want("strftime_now") {
		data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
			if len(args) != 1 || !args[0].IsString() {
				return jinja.Undefined(), errors.New("strftime_now takes one format string")
			}
			return jinja.NewString(strftime(args[0].AsString(), now())), nil
		})
	}
	if want(tojsonName) {
		data[tojsonName] = jinja.NewCallable("tojson", tojsonFilter)
	}
	if want(strName) {
		data[strName] = jinja.NewCallable("str", printValue)
	}
	for k, v := range in.Special {
		// special_tokens_map leaves out unset tokens, so they stay undefined.
		if v != "" && want(k) {
			data[k] = jinja.NewString(v)
		}
	}
	if want("messages") {
		data["messages"] = jinja.NewList(conv)
	}
	if want("tools") {
		data["tools"] = req.tools
	}
	if want("documents") {
		data["documents"] = jinja.None()
	}
	if want("add_generation_prompt") {
		data["add_generation_prompt"] = jinja.NewBool(req.addGenerationPrompt)
	}
	for k, v := range req.kwargs {
		if want(k) {
			data[k] = v
		}
	}
	return data, nil
}

// raiseException is transformers' raise_exception global.
func raiseException(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), errors.New("raise_exception takes one message")
	}
	msg := args[0].String()
	if args[0].IsString() {
		msg = args[0].AsString()
	}
	return jinja.Undefined(), &RaiseError{Message: msg}
}

// tojsonFilter is transformers' tojson filter; args[0] is the value.
func tojsonFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson needs a value")
	}
	opts, err := parseJSONOptions(args[1:], kwargs)
	if err != nil {
		return jinja.Undefined(), err
	}
	s, err := pyJSON(args[0], opts)
	if err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(s), nil
}

// printValue is the str() every {{ }} output goes through.
func printValue(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), errors.New("output expression must be one value")
	}
	if args[0].IsString() {
		return args[0], nil
	}
	return jinja.NewString(pyStr(args[0])), nil
}
