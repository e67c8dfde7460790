package openai

import (
	"strings"
	"time"
)

// Anthropic Messages (/v1/messages) as vLLM serves it: the request is
// converted to a chat completions request and rendered with the chat
// template. The conversion below follows vLLM's
// vllm/entrypoints/anthropic/serving.py, AnthropicServingMessages.
// _convert_anthropic_to_openai_request and the helpers it calls
// (_convert_system_message, _convert_messages, _convert_block,
// _convert_user_tool_result, _convert_tools), at vLLM commit
// 0001948bc76939369ca855c90b36d81256477e85, with the request models of
// vllm/entrypoints/anthropic/protocol.py at commit
// 00589e563e771f2de7abeb48bd0814873e891411 (vLLM main branch;
// their release tag was not determined).
//
// Later vLLM (vllm/entrypoints/anthropic/inline_system.py) can keep
// system messages inside "messages" in place, or fold them into a
// neighbouring user turn, depending on a probe of the model's chat
// template at startup; the gateway cannot know the probe's outcome, so it
// follows the version above, which hoists them into the leading system
// message.

// anthropicNow is the clock of the ids vLLM makes up for tool_use blocks
// without one ("call_<unix seconds>"); tests replace it.
var anthropicNow = time.Now

// billingHeader starts the per-request attribution text Claude Code puts
// in its system blocks; vLLM drops such blocks because the hash in them
// defeats prefix caching.
const billingHeader = "x-anthropic-billing-header"

// ParseAnthropic parses an Anthropic Messages API body. Model, Stream,
// MaxTokens and ChatTemplateKwargs are read as they are; Messages is the
// chat messages array vLLM builds from "system" and "messages", and Tools
// the tools in chat completions form ({"type":"function","function":
// {...}}). IncludeUsage is set with Stream, as vLLM asks for usage in
// every converted stream. Every error is a *RequestError naming the
// top-level field, with the path of the nested value in its message.
func ParseAnthropic(body []byte) (*Request, error) {
	top, err := parseBody(body)
	if err != nil {
		return nil, err
	}
	c := &converter{body: body}
	r := &Request{}
	if err := c.scalars(top, r); err != nil {
		return nil, err
	}
	if err := c.system(top.get("system"), top.get("messages")); err != nil {
		return nil, err
	}
	for i, m := range parseElems(top.get("messages")) {
		if err := c.message(m, "messages["+itoa(i)+"]"); err != nil {
			return nil, err
		}
	}
	r.Messages = encodeMessages(c.out)
	if r.Tools, err = c.tools(top.get("tools")); err != nil {
		return nil, err
	}
	return r, nil
}

// converter holds the chat messages built so far, for the Anthropic and
// Responses conversions, and the body its errors point into.
type converter struct {
	body []byte
	out  []*msg
}

// err is a *RequestError about v under the top-level field of path.
func (c *converter) err(v []byte, path, msg string) error {
	param, _, _ := strings.Cut(path, "[")
	param, _, _ = strings.Cut(param, ".")
	return fieldErr(c.body, v, param, path, msg)
}

// scalars reads the fields kept as they are and checks the types of
// "messages" and "max_tokens", which vLLM requires.
func (c *converter) scalars(top object, r *Request) error {
	var err error
	if r.Model, err = c.optString(top.get("model"), "model"); err != nil {
		return err
	}
	if v := top.get("stream"); !isNull(v) {
		if v[0] != 't' && v[0] != 'f' {
			return c.err(v, "stream", "must be a boolean, not "+kind(v[0]))
		}
		r.Stream, r.IncludeUsage = v[0] == 't', v[0] == 't'
	}
	if r.MaxTokens, err = c.positiveInt(top.get("max_tokens"), "max_tokens"); err != nil {
		return err
	}
	if v := top.get("chat_template_kwargs"); !isNull(v) {
		if v[0] != '{' {
			return c.err(v, "chat_template_kwargs", "must be an object, not "+kind(v[0]))
		}
		r.ChatTemplateKwargs = clip(v)
	}
	v := top.get("messages")
	if v == nil || v[0] != '[' {
		return c.err(v, "messages", "must be an array, not "+kindOf(v))
	}
	return nil
}

// positiveInt reads a required integer > 0 (pydantic's int accepts 8.0).
func (c *converter) positiveInt(v []byte, path string) (*int64, error) {
	if isNull(v) {
		return nil, c.err(v, path, "field required")
	}
	n, ok := jsonInt(v)
	if !ok {
		return nil, c.err(v, path, "must be an integer")
	}
	if n <= 0 {
		return nil, c.err(v, path, "must be positive")
	}
	return &n, nil
}

// optString reads a string or null ("").
func (c *converter) optString(v []byte, path string) (string, error) {
	if isNull(v) {
		return "", nil
	}
	s, ok := decodeString(v)
	if !ok {
		return "", c.err(v, path, "must be a string, not "+kind(v[0]))
	}
	return s, nil
}

// system builds the leading system message: the top-level "system" (a
// string, or the text of its text blocks) followed by the text of the
// system messages inside "messages", joined without a separator; text
// blocks starting with Claude Code's billing header are dropped. No
// message when there is no part at all (_convert_system_message).
func (c *converter) system(sys, messages []byte) error {
	var parts []string
	switch {
	case isNull(sys):
	case sys[0] == '"':
		if s, _ := decodeString(sys); s != "" {
			parts = append(parts, s)
		}
	case sys[0] == '[':
		p, err := c.systemBlocks(sys, "system")
		if err != nil {
			return err
		}
		parts = append(parts, p...)
	default:
		return c.err(sys, "system", "must be a string or an array, not "+kind(sys[0]))
	}
	for i, m := range parseElems(messages) {
		path := "messages[" + itoa(i) + "]"
		role, content, err := c.roleContent(m, path)
		if err != nil {
			return err
		}
		if role != "system" {
			continue
		}
		if s, ok := decodeString(content); ok {
			parts = append(parts, s)
			continue
		}
		p, err := c.systemBlocks(content, path+".content")
		if err != nil {
			return err
		}
		parts = append(parts, p...)
	}
	if parts != nil {
		m := &msg{}
		m.set("role", jstr("system"))
		m.set("content", jstr(strings.Join(parts, "")))
		c.out = append(c.out, m)
	}
	return nil
}

// systemBlocks returns the texts of the text blocks of a system prompt.
func (c *converter) systemBlocks(v []byte, path string) ([]string, error) {
	var parts []string
	for i, e := range parseElems(v) {
		b, err := c.block(e, path+"["+itoa(i)+"]")
		if err != nil {
			return nil, err
		}
		if b.typ == "text" && b.text != "" && !strings.HasPrefix(b.text, billingHeader) {
			parts = append(parts, b.text)
		}
	}
	return parts, nil
}

// roleContent checks a message object and returns its role, with the
// roles Claude Code sends ("ctx", "msg") mapped to "user" as vLLM's
// AnthropicMessage.normalize_role does, and its raw content: a string or
// an array of blocks.
func (c *converter) roleContent(m []byte, path string) (string, []byte, error) {
	if m[0] != '{' {
		return "", nil, c.err(m, path, "must be an object, not "+kind(m[0]))
	}
	o := parseObject(m)
	rv := o.get("role")
	role, ok := decodeString(rv)
	switch {
	case role == "ctx" || role == "msg":
		role = "user"
	case !ok || role != "user" && role != "assistant" && role != "system":
		return "", nil, c.err(orNil(rv, m), path+".role", `must be "user", "assistant" or "system"`)
	}
	content := o.get("content")
	if content == nil || content[0] != '"' && content[0] != '[' {
		return "", nil, c.err(orNil(content, m), path+".content", "must be a string or an array, not "+kindOf(content))
	}
	return role, content, nil
}

// orNil returns v, or the enclosing value when v is absent, for the
// offset of an error.
func orNil(v, enclosing []byte) []byte {
	if v == nil {
		return enclosing
	}
	return v
}

// message converts one non-system message (_convert_messages): string
// content is kept; blocks go through _convert_message_content, and a user
// message left without content (only tool results) is not added, its
// tool messages standing in for it.
func (c *converter) message(m []byte, path string) error {
	role, content, err := c.roleContent(m, path)
	if err != nil || role == "system" {
		return err
	}
	om := &msg{}
	om.set("role", jstr(role))
	if s, ok := decodeString(content); ok {
		om.set("content", jstr(s))
	} else if err := c.blocks(content, role, om, path+".content"); err != nil {
		return err
	}
	if role != "user" || om.has("content") {
		c.out = append(c.out, om)
	}
	return nil
}

// part is one content part being built: a text part's text is kept so a
// lone text part can become plain string content.
type part struct {
	text   string
	isText bool
	enc    []byte
}

// blocks converts the content blocks of a message into om
// (_convert_message_content and _convert_block): reasoning, then tool
// calls, then content, which is a plain string for a single text part.
func (c *converter) blocks(content []byte, role string, om *msg, path string) error {
	var parts []part
	var calls [][]byte
	var reasoning []string
	for i, e := range parseElems(content) {
		bp := path + "[" + itoa(i) + "]"
		b, err := c.block(e, bp)
		if err != nil {
			return err
		}
		switch b.typ {
		case "text":
			if b.text != "" {
				parts = append(parts, textPart(b.text))
			}
		case "image":
			if !truthy(b.source) {
				break
			}
			url, err := c.imageURL(b.source, bp+".source")
			if err != nil {
				return err
			}
			parts = append(parts, imagePart(url))
		case "thinking":
			if b.hasThinking {
				reasoning = append(reasoning, b.thinking)
			}
		case "tool_use":
			calls = append(calls, c.toolCall(b))
		case "tool_result":
			if role != "user" {
				text := ""
				if truthy(b.content) {
					text = pyStr(b.content)
				}
				parts = append(parts, textPart("Tool result: "+text))
			} else if err := c.userToolResult(b, bp); err != nil {
				return err
			}
		} // redacted_thinking, tool_reference: nothing
	}
	setContent(om, parts, calls, reasoning)
	return nil
}

// setContent sets the converted keys of a message in vLLM's order.
func setContent(om *msg, parts []part, calls [][]byte, reasoning []string) {
	if reasoning != nil {
		om.set("reasoning", jstr(strings.Join(reasoning, "")))
	}
	if calls != nil {
		om.set("tool_calls", calls)
	}
	switch {
	case len(parts) == 1 && parts[0].isText:
		om.set("content", jstr(parts[0].text))
	case len(parts) > 0:
		enc := make([][]byte, len(parts))
		for i, p := range parts {
			enc[i] = p.enc
		}
		om.set("content", enc)
	}
}

// textPart is {"type":"text","text":text}.
func textPart(text string) part {
	enc := append([]byte(`{"type":"text","text":`), jstr(text)...)
	return part{text: text, isText: true, enc: append(enc, '}')}
}

// imagePart is {"type":"image_url","image_url":{"url":url}}.
func imagePart(url string) part {
	enc := append([]byte(`{"type":"image_url","image_url":{"url":`), jstr(url)...)
	return part{enc: append(enc, '}', '}')}
}

// toolCall converts a tool_use block (_convert_tool_use_block): the
// arguments are Python's json.dumps of the input, which is what the
// template prints.
func (c *converter) toolCall(b anthBlock) []byte {
	id := b.id
	if id == "" {
		id = "call_" + itoa(int(anthropicNow().Unix()))
	}
	args := "{}"
	if truthy(b.input) {
		args = pyDumps(b.input)
	}
	out := append([]byte(`{"id":`), jstr(id)...)
	out = append(out, `,"type":"function","function":{"name":`...)
	out = append(out, jstr(b.name)...)
	out = append(out, `,"arguments":`...)
	out = append(out, jstr(args)...)
	return append(out, '}', '}')
}
