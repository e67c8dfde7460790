package openai

import "encoding/json"

// OpenAI Responses (/v1/responses) as vLLM serves it with a chat template
// (not the Harmony path of gpt-oss models): the request becomes chat
// messages rendered like a chat completion. The conversion below follows
// vLLM's vllm/entrypoints/openai/responses/utils.py at commit
// 01ca842df5b1ddd7f91aa376294040d126a453f2 (vLLM main branch;
// its release tag was not determined):
// construct_input_messages, construct_chat_messages_with_tool_call,
// _construct_message_from_response_item, should_continue_final_message and
// construct_tool_dicts, with the namespace-tool flattening of
// vllm/tool_parsers/utils.py (iter_response_function_tool_dicts).
//
// With previous_response_id, vLLM puts the stored conversation (without
// its system messages) between the instructions and the new input; the
// gateway does not have it, so Messages holds only this request's turn.

// ParseResponses parses an OpenAI Responses API body. Model, Stream,
// PreviousResponseID, Store, MaxTokens ("max_output_tokens"),
// ChatTemplateKwargs and CacheSalt are read as they are; Messages is the
// chat messages array vLLM builds from "instructions" and "input", Tools
// the function tools in chat completions form, and AddGenerationPrompt
// and ContinueFinalMessage what vLLM passes to the chat template (it
// continues a final assistant message whose status is in_progress or
// incomplete). Every error is a *RequestError.
func ParseResponses(body []byte) (*Request, error) {
	top, err := parseBody(body)
	if err != nil {
		return nil, err
	}
	c := &converter{body: body}
	r := &Request{}
	if err := c.responsesScalars(top, r); err != nil {
		return nil, err
	}
	instr, err := c.optString(top.get("instructions"), "instructions")
	if err != nil {
		return nil, err
	}
	if instr != "" {
		m := &msg{}
		m.set("role", jstr("system"))
		m.set("content", jstr(instr))
		c.out = append(c.out, m)
	}
	input := top.get("input")
	continueFinal := false
	switch {
	case input != nil && input[0] == '"':
		s, _ := decodeString(input)
		m := &msg{}
		m.set("role", jstr("user"))
		m.set("content", jstr(s))
		c.out = append(c.out, m)
	case input != nil && input[0] == '[':
		items := parseElems(input)
		for i, it := range items {
			if err := c.item(it, "input["+itoa(i)+"]"); err != nil {
				return nil, err
			}
		}
		continueFinal = len(items) > 0 && partialFinal(items[len(items)-1])
	default:
		return nil, c.err(input, "input", "must be a string or an array, not "+kindOf(input))
	}
	addGen := !continueFinal
	r.AddGenerationPrompt, r.ContinueFinalMessage = &addGen, &continueFinal
	r.Messages = encodeMessages(c.out)
	if r.Tools, err = c.responsesTools(top.get("tools")); err != nil {
		return nil, err
	}
	return r, nil
}

// responsesScalars reads the fields kept as they are.
func (c *converter) responsesScalars(top object, r *Request) error {
	var err error
	for _, f := range []struct {
		key string
		dst *string
	}{{"model", &r.Model}, {"previous_response_id", &r.PreviousResponseID}, {"cache_salt", &r.CacheSalt}} {
		if *f.dst, err = c.optString(top.get(f.key), f.key); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		key string
		dst **bool
	}{{"stream", nil}, {"store", &r.Store}} {
		v := top.get(f.key)
		if isNull(v) {
			continue
		}
		if v[0] != 't' && v[0] != 'f' {
			return c.err(v, f.key, "must be a boolean, not "+kind(v[0]))
		}
		b := v[0] == 't'
		if f.dst == nil {
			r.Stream = b
		} else {
			*f.dst = &b
		}
	}
	if v := top.get("max_output_tokens"); !isNull(v) {
		n, ok := jsonInt(v)
		if !ok {
			return c.err(v, "max_output_tokens", "must be an integer")
		}
		r.MaxTokens = &n
	}
	if v := top.get("chat_template_kwargs"); !isNull(v) {
		if v[0] != '{' {
			return c.err(v, "chat_template_kwargs", "must be an object, not "+kind(v[0]))
		}
		r.ChatTemplateKwargs = clip(v)
	}
	return nil
}

// partialFinal is should_continue_final_message for the last input item:
// a message (the default type) or reasoning item still in progress.
func partialFinal(it []byte) bool {
	if it[0] != '{' {
		return false
	}
	o := parseObject(it)
	t := "message"
	if v := o.get("type"); v != nil {
		t, _ = decodeString(v)
	}
	status, _ := decodeString(o.get("status"))
	return (t == "message" || t == "reasoning") && (status == "in_progress" || status == "incomplete")
}

// prevAssistant is the last message built when it is an assistant's,
// which function calls, reasoning and output text merge into.
func (c *converter) prevAssistant() *msg {
	if len(c.out) == 0 {
		return nil
	}
	m := c.out[len(c.out)-1]
	if role, ok := m.get("role").([]byte); ok && string(role) == `"assistant"` {
		return m
	}
	return nil
}

// item converts one input item (_construct_message_from_response_item).
// Items the function has no case for (user, system and developer
// messages, and any other type) are passed on unchanged: the chat
// template renderer reads their role and content parts (input_text and
// the like) as it does a chat message's.
func (c *converter) item(it []byte, path string) error {
	if it[0] != '{' {
		return c.err(it, path, "must be an object, not "+kind(it[0]))
	}
	o := parseObject(it)
	t, _ := decodeString(o.get("type"))
	role, _ := decodeString(o.get("role"))
	switch {
	case t == "function_call":
		return c.functionCall(o, it, path)
	case t == "reasoning":
		return c.reasoningItem(o, path)
	case t == "function_call_output":
		m := &msg{}
		m.set("role", jstr("tool"))
		m.set("content", rawOrNull(o.get("output")))
		m.set("tool_call_id", rawOrNull(o.get("call_id")))
		c.out = append(c.out, m)
		return nil
	case role == "assistant" && (t == "" || t == "message"):
		return c.assistantItem(o.get("content"), path)
	}
	m := &msg{} // a dict as Python has it: a later item may merge into it
	for _, mb := range o {
		m.set(mb.key, mb.val)
	}
	c.out = append(c.out, m)
	return nil
}

// rawOrNull is v, or null when absent (dict.get's None).
func rawOrNull(v []byte) []byte {
	if v == nil {
		return []byte("null")
	}
	return v
}

// functionCall converts a function_call item into a tool call, appended
// to the previous assistant message when there is one.
func (c *converter) functionCall(o object, it []byte, path string) error {
	var f [4]string
	for i, k := range []string{"call_id", "name", "arguments", "namespace"} {
		v := o.get(k)
		s, ok := decodeString(v)
		if !ok && (i < 3 || !isNull(v)) {
			return c.err(orNil(v, it), path+"."+k, "must be a string, not "+kindOf(v))
		}
		f[i] = s
	}
	name := f[1]
	if f[3] != "" {
		name = f[3] + "__" + name // flat_namespace_tool_name
	}
	call := append([]byte(`{"id":`), jstr(f[0])...)
	call = append(call, `,"function":{"name":`...)
	call = append(call, jstr(name)...)
	call = append(call, `,"arguments":`...)
	call = append(call, jstr(f[2])...)
	call = append(call, `},"type":"function"}`...)
	if prev := c.prevAssistant(); prev != nil {
		calls, _ := prev.get("tool_calls").([][]byte)
		prev.set("tool_calls", append(calls, call))
		return nil
	}
	m := &msg{}
	m.set("role", jstr("assistant"))
	m.set("tool_calls", [][]byte{call})
	c.out = append(c.out, m)
	return nil
}

// reasoningItem converts a reasoning item: the text of its first content
// part, else of its first summary part, set on the previous assistant
// message unless that has reasoning already. Encrypted reasoning is an
// error in vLLM.
func (c *converter) reasoningItem(o object, path string) error {
	if v := o.get("encrypted_content"); truthy(v) {
		return c.err(v, path+".encrypted_content", "encrypted content is not supported")
	}
	text := ""
	for _, k := range []string{"content", "summary"} {
		v := o.get(k)
		if !truthy(v) || v[0] != '[' {
			continue
		}
		text = firstText(parseElems(v))
		break
	}
	if prev := c.prevAssistant(); prev != nil && !prev.has("reasoning") {
		prev.set("reasoning", jstr(text))
		return nil
	}
	m := &msg{}
	m.set("role", jstr("assistant"))
	m.set("reasoning", jstr(text))
	c.out = append(c.out, m)
	return nil
}

// firstText is the "text" of the first part, "" if it has none.
func firstText(parts [][]byte) string {
	if len(parts) == 0 {
		return ""
	}
	if s, ok := decodeString(parts[0]); ok {
		return s
	}
	if parts[0][0] != '{' {
		return ""
	}
	s, _ := decodeString(parseObject(parts[0]).get("text"))
	return s
}

// assistantItem converts an assistant message item: its content string,
// or the text of its first content part only, as vLLM does; set on the
// previous assistant message unless that has content already.
func (c *converter) assistantItem(content []byte, path string) error {
	text := ""
	switch {
	case content == nil || content[0] == 'n':
	case content[0] == '"':
		text, _ = decodeString(content)
	case content[0] == '[':
		text = firstText(parseElems(content))
	default:
		return c.err(content, path+".content", "must be a string or an array, not "+kind(content[0]))
	}
	if prev := c.prevAssistant(); prev != nil && !prev.has("content") {
		prev.set("content", jstr(text))
		return nil
	}
	m := &msg{}
	m.set("role", jstr("assistant"))
	m.set("content", jstr(text))
	c.out = append(c.out, m)
	return nil
}

// responsesTools converts the function tools, flat in the Responses API
// ({"type":"function","name":...}), to chat completions tools, and the
// function tools of namespace tools to tools named namespace__name; other
// tool types (built-in tools, MCP) are not rendered by the template.
func (c *converter) responsesTools(v []byte) (json.RawMessage, error) {
	if isNull(v) {
		return nil, nil
	}
	if v[0] != '[' {
		return nil, c.err(v, "tools", "must be an array, not "+kind(v[0]))
	}
	var out [][]byte
	for i, e := range parseElems(v) {
		path := "tools[" + itoa(i) + "]"
		if e[0] != '{' {
			return nil, c.err(e, path, "must be an object, not "+kind(e[0]))
		}
		o := parseObject(e)
		switch t, _ := decodeString(o.get("type")); t {
		case "function":
			out = append(out, chatTool(o, ""))
		case "namespace":
			ns, _ := decodeString(o.get("name"))
			sub := o.get("tools")
			if sub == nil || sub[0] != '[' {
				return nil, c.err(orNil(sub, e), path+".tools", "must be an array")
			}
			for _, se := range parseElems(sub) {
				if se[0] != '{' {
					continue
				}
				so := parseObject(se)
				if st, _ := decodeString(so.get("type")); st == "function" {
					out = append(out, chatTool(so, ns))
				}
			}
		}
	}
	if out == nil {
		return nil, nil
	}
	return appendList(nil, out), nil
}

// chatTool is {"type":"function","function":{...}} with the tool's
// members but "type", its name prefixed with namespace + "__" if any.
func chatTool(o object, namespace string) []byte {
	fn := &msg{}
	for _, m := range o {
		switch {
		case m.key == "type":
		case m.key == "name" && namespace != "":
			s, _ := decodeString(m.val)
			fn.set("name", jstr(namespace+"__"+s))
		default:
			fn.set(m.key, m.val)
		}
	}
	out := fn.appendTo([]byte(`{"type":"function","function":`))
	return append(out, '}')
}

// get returns the value of key, or nil.
func (m *msg) get(key string) any {
	for i, k := range m.keys {
		if k == key {
			return m.vals[i]
		}
	}
	return nil
}
