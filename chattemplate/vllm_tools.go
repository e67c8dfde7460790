package chattemplate

import (
	"fmt"

	"github.com/ardanlabs/jinja"
)

// vllmTools rebuilds a request's tools as vLLM passes them to the
// template: serving_chat.py hands over [tool.model_dump() for tool in
// request.tools], where each tool is a ChatCompletionToolsParam (fields
// type = "function", function) and each function a FunctionDefinition
// (name, description = None, parameters = None) in
// vllm/entrypoints/openai/protocol.py. model_dump writes the declared
// fields first, in declaration order and with defaults filled in, then
// any extra members in request order (OpenAIBaseModel allows extras).
// So a template's `tool | tojson` shows "description": null for a tool
// without one, whatever order the client used.
func vllmTools(tools []any) (jinja.Value, error) {
	out := make([]jinja.Value, len(tools))
	for i, t := range tools {
		v, err := toValue(t, 0)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("tool %d: %w", i, err)
		}
		out[i], err = vllmTool(v)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("tool %d: %w", i, err)
		}
	}
	return jinja.NewList(out), nil
}

func vllmTool(tool jinja.Value) (jinja.Value, error) {
	if !tool.IsDict() {
		return jinja.Undefined(), fmt.Errorf("%w: a tool must be an object", ErrInvalidInput)
	}
	typ, ok := dictGet(tool, "type")
	if !ok {
		typ = jinja.NewString("function")
	}
	if !typ.IsString() || typ.AsString() != "function" {
		return jinja.Undefined(), fmt.Errorf("%w: tool type must be \"function\"", ErrInvalidInput)
	}
	fn, ok := dictGet(tool, "function")
	if !ok || !fn.IsDict() {
		return jinja.Undefined(), fmt.Errorf("%w: a tool needs a function object", ErrInvalidInput)
	}
	dumped, err := functionDefinition(fn)
	if err != nil {
		return jinja.Undefined(), err
	}
	out := newDict(2)
	out.AsDict().Set("type", typ)
	out.AsDict().Set("function", dumped)
	copyExtras(out, tool)
	return out, nil
}

// functionDefinition validates and dumps a FunctionDefinition.
func functionDefinition(fn jinja.Value) (jinja.Value, error) {
	name, _ := dictGet(fn, "name")
	if !name.IsString() {
		return jinja.Undefined(), fmt.Errorf("%w: a function needs a string name", ErrInvalidInput)
	}
	desc, ok := dictGet(fn, "description")
	if !ok {
		desc = jinja.None()
	}
	if !desc.IsNone() && !desc.IsString() {
		return jinja.Undefined(), fmt.Errorf("%w: function description must be a string", ErrInvalidInput)
	}
	params, ok := dictGet(fn, "parameters")
	if !ok {
		params = jinja.None()
	}
	if !params.IsNone() && !params.IsDict() {
		return jinja.Undefined(), fmt.Errorf("%w: function parameters must be an object", ErrInvalidInput)
	}
	out := newDict(3)
	out.AsDict().Set("name", name)
	out.AsDict().Set("description", desc)
	out.AsDict().Set("parameters", params)
	copyExtras(out, fn)
	return out, nil
}

// copyExtras appends src's members that dst does not have yet, in order.
func copyExtras(dst, src jinja.Value) {
	s := src.AsDict()
	for _, k := range s.Keys {
		if !dst.AsDict().Has(k) {
			dst.AsDict().Set(k, s.Data[k])
		}
	}
}
