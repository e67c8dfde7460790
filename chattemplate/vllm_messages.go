package chattemplate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ardanlabs/jinja"
)

// This file reproduces what vLLM does to a chat request's messages before
// the template sees them: parse_chat_messages, _parse_chat_message_content
// and _postprocess_messages in vllm/entrypoints/chat_utils.py (read at
// commit 001eadc). vLLM rebuilds every message from a fixed set of
// fields, so keys a client adds beyond those never reach the template.

// textPartField names the member holding a text-like part's text, per
// vLLM's MM_PARSER_MAP, or "" when typ is not a text-like part.
func textPartField(typ string) string {
	switch typ {
	case "text", "input_text", "output_text":
		return "text"
	case "refusal", "thinking":
		return typ
	}
	return ""
}

// mediaPartTypes are the part types vLLM turns into multimodal inputs.
// Their prompt text depends on the model's processor and the media
// itself, so they cannot be rendered locally.
var mediaPartTypes = [...]string{
	"image_url", "input_image", "image_embeds", "image_pil", "audio_url",
	"input_audio", "audio_embeds", "video_url", "prompt_embeds",
}

// vllmConversation turns request messages into the conversation vLLM
// renders, for a template whose content format is format.
func vllmConversation(msgs []any, format ContentFormat) ([]jinja.Value, error) {
	out := make([]jinja.Value, 0, len(msgs))
	for i, m := range msgs {
		conv, err := vllmMessage(m, format)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		out = append(out, conv)
	}
	return out, nil
}

// requestMessage reads the members of one request message, converting
// only those asked for: vLLM keeps a fixed few, and converting the whole
// message first made a dict per message that was dropped at once (a
// quarter of rendering a long tool-using chat). A message is an Object
// or a map, as DecodeJSON and encoding/json give them, or a dict value.
type requestMessage struct {
	members map[string]any // an Object's or a map's; nil reads as empty
	dict    jinja.Value    // when the message is a template value already
	isDict  bool
}

func newRequestMessage(m any) (requestMessage, error) {
	switch v := m.(type) {
	case Object:
		return requestMessage{members: v.Values}, nil
	case *Object:
		if v != nil {
			return requestMessage{members: v.Values}, nil
		}
	case map[string]any:
		return requestMessage{members: v}, nil
	case jinja.Value:
		if v.IsDict() {
			return requestMessage{dict: v, isDict: true}, nil
		}
	}
	return requestMessage{}, fmt.Errorf("%w: a message must be an object", ErrInvalidInput)
}

// get returns the member key as a template value and whether it exists.
// An error is a member nested too deeply or of an unsupported Go type.
func (m requestMessage) get(key string) (jinja.Value, bool, error) {
	if m.isDict {
		v, ok := dictGet(m.dict, key)
		return v, ok, nil
	}
	raw, ok := m.members[key]
	if !ok {
		return jinja.Undefined(), false, nil
	}
	v, err := toValue(raw, 1) // the message itself is at depth 0
	return v, true, err
}

// vllmMessage rebuilds one message as _parse_chat_message_content does,
// then parses its tool-call arguments as _postprocess_messages does.
func vllmMessage(raw any, format ContentFormat) (jinja.Value, error) {
	msg, err := newRequestMessage(raw)
	if err != nil {
		return jinja.Undefined(), err
	}
	role, ok, err := msg.get("role")
	if err != nil {
		return jinja.Undefined(), err
	}
	if !ok || !role.IsString() {
		return jinja.Undefined(), fmt.Errorf("%w: a message needs a string role", ErrInvalidInput)
	}
	content, _, err := msg.get("content")
	if err != nil {
		return jinja.Undefined(), err
	}
	parsed, err := messageContent(content, format)
	if err != nil {
		return jinja.Undefined(), err
	}
	out := newDict(6)
	d := out.AsDict()
	d.Set("role", role)
	d.Set("content", parsed)
	switch role.AsString() {
	case "assistant":
		err = assistantFields(msg, d)
	case "tool":
		err = toolFields(msg, d)
	}
	if err != nil {
		return jinja.Undefined(), err
	}
	// name and task are copied only when they are strings.
	for _, k := range [...]string{"name", "task"} {
		v, ok, err := msg.get(k)
		if err != nil {
			return jinja.Undefined(), err
		}
		if ok && v.IsString() {
			d.Set(k, v)
		}
	}
	if role.AsString() == "developer" {
		if err := developerFields(msg, d); err != nil {
			return jinja.Undefined(), err
		}
	}
	return out, nil
}

// developerFields copies tools, None when the message has none.
func developerFields(msg requestMessage, d *jinja.Dict) error {
	tools, ok, err := msg.get("tools")
	if err != nil {
		return err
	}
	if !ok {
		tools = jinja.None()
	}
	d.Set("tools", tools)
	return nil
}

// messageContent normalises content: None becomes no parts and a string
// one text part; the parts then become one "\n"-joined string for
// "string" templates, or a list of {"type": "text", "text": ...} for
// "openai" ones. So a None content reaches a "string" template as "".
func messageContent(content jinja.Value, format ContentFormat) (jinja.Value, error) {
	if content.IsString() && format != ContentOpenAI {
		return content, nil // one text part, joined: the string itself
	}
	var parts []jinja.Value
	switch {
	case content.IsUndefined() || content.IsNone():
	case content.IsString():
		parts = []jinja.Value{content}
	case content.IsList():
		parts = content.AsList().Items
	default:
		return jinja.Undefined(), fmt.Errorf("%w: content must be a string, a list of parts or null", ErrInvalidInput)
	}
	var texts []string
	var items []jinja.Value
	for i, p := range parts {
		item, text, keep, err := contentPart(p)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("content part %d: %w", i, err)
		}
		if keep {
			texts = append(texts, text)
			items = append(items, item)
		}
	}
	if format == ContentOpenAI {
		return jinja.NewList(items), nil
	}
	return jinja.NewString(strings.Join(texts, "\n")), nil
}

// contentPart parses one part as _parse_chat_message_content_part does.
// It returns the part as an "openai" template sees it, its text as a
// "string" template sees it, and whether vLLM keeps it (text parts whose
// text is null are skipped).
func contentPart(p jinja.Value) (jinja.Value, string, bool, error) {
	if p.IsString() {
		return textItem(p.AsString()), p.AsString(), true, nil
	}
	if !p.IsDict() {
		return jinja.Undefined(), "", false, fmt.Errorf("%w: a content part must be a string or an object", ErrInvalidInput)
	}
	typ, _ := dictGet(p, "type")
	uuid, _ := dictGet(p, "uuid")
	hasUUID := !uuid.IsUndefined() && !uuid.IsNone()
	if typ.IsString() && !hasUUID {
		return typedPart(p, typ.AsString())
	}
	if typ.IsUndefined() || typ.IsNone() || hasUUID {
		// vLLM then looks for a bare media field; all of them are media.
		for _, k := range mediaPartTypes {
			if _, ok := dictGet(p, k); ok {
				return jinja.Undefined(), "", false, fmt.Errorf("%w: %s part", ErrUnsupportedContent, k)
			}
		}
		return jinja.Undefined(), "", false, fmt.Errorf("%w: missing 'type' field in content part", ErrInvalidInput)
	}
	return jinja.Undefined(), "", false, fmt.Errorf("%w: invalid 'type' field in content part", ErrInvalidInput)
}

func typedPart(p jinja.Value, typ string) (jinja.Value, string, bool, error) {
	if typ == "tool_reference" {
		// Passed through for the template; vLLM reads its "name".
		name, _ := dictGet(p, "name")
		if name.IsUndefined() || name.IsNone() {
			return jinja.Undefined(), "", false, nil
		}
		if !name.IsString() {
			return jinja.Undefined(), "", false, fmt.Errorf("%w: tool_reference name must be a string", ErrInvalidInput)
		}
		item := newDict(2)
		item.AsDict().Set("type", jinja.NewString("tool_reference"))
		item.AsDict().Set("name", name)
		return item, name.AsString(), true, nil
	}
	if slices.Contains(mediaPartTypes[:], typ) {
		return jinja.Undefined(), "", false, fmt.Errorf("%w: %s part", ErrUnsupportedContent, typ)
	}
	field := textPartField(typ)
	if field == "" {
		return jinja.Undefined(), "", false, fmt.Errorf("%w: unsupported content part type %q", ErrInvalidInput, typ)
	}
	text, _ := dictGet(p, field)
	if text.IsUndefined() || text.IsNone() {
		return jinja.Undefined(), "", false, nil
	}
	if !text.IsString() {
		return jinja.Undefined(), "", false, fmt.Errorf("%w: %s part's %q must be a string", ErrInvalidInput, typ, field)
	}
	return textItem(text.AsString()), text.AsString(), true, nil
}

// textItem is the {"type": "text", "text": s} part vLLM builds.
func textItem(s string) jinja.Value {
	d := newDict(2)
	d.AsDict().Set("type", jinja.NewString("text"))
	d.AsDict().Set("text", jinja.NewString(s))
	return d
}

// assistantFields copies tool_calls (when present and not null) with
// their arguments parsed, and reasoning, which vLLM also passes as
// reasoning_content for older templates. A request's own
// reasoning_content field is not read by vLLM and is dropped.
func assistantFields(msg requestMessage, d *jinja.Dict) error {
	calls, ok, err := msg.get("tool_calls")
	if err != nil {
		return err
	}
	if ok && !calls.IsNone() {
		if !calls.IsList() {
			return fmt.Errorf("%w: tool_calls must be a list", ErrInvalidInput)
		}
		// An empty list is dropped so templates take their plain path.
		if calls.AsList().Len() > 0 {
			parsed, err := parseToolCalls(calls.AsList().Items)
			if err != nil {
				return err
			}
			d.Set("tool_calls", parsed)
		}
	}
	r, ok, err := msg.get("reasoning")
	if err != nil {
		return err
	}
	if ok && !r.IsNone() {
		if !r.IsString() {
			return fmt.Errorf("%w: reasoning must be a string", ErrInvalidInput)
		}
		d.Set("reasoning", r)
		d.Set("reasoning_content", r)
	}
	return nil
}

// parseToolCalls applies _postprocess_messages: an arguments string is
// parsed with json.loads (any JSON value, not only objects, is kept), a
// string that is not JSON becomes {}, and arguments that are neither a
// string, an object nor a list also become {}. The calls are copied, not
// changed in place.
func parseToolCalls(calls []jinja.Value) (jinja.Value, error) {
	out := make([]jinja.Value, len(calls))
	for i, c := range calls {
		fn, ok := dictGet(c, "function")
		if !ok || !fn.IsDict() {
			return jinja.Undefined(), fmt.Errorf("%w: tool call %d needs a function object", ErrInvalidInput, i)
		}
		fn = copyDict(fn)
		args, _ := dictGet(fn, "arguments")
		fn.AsDict().Set("arguments", toolArguments(args))
		call := copyDict(c)
		call.AsDict().Set("function", fn)
		out[i] = call
	}
	return jinja.NewList(out), nil
}

func toolArguments(args jinja.Value) jinja.Value {
	switch {
	case args.IsString():
		doc, err := DecodeJSON([]byte(args.AsString()))
		if err != nil {
			return jinja.NewDict()
		}
		v, err := toValue(doc, 0)
		if err != nil {
			return jinja.NewDict()
		}
		return v
	case args.IsDict() || args.IsList():
		return args
	}
	return jinja.NewDict()
}

// toolFields copies tool_call_id when the key is present, and for
// "openai" templates flattens an all-text content list into one string,
// since most templates print a tool result directly.
func toolFields(msg requestMessage, d *jinja.Dict) error {
	id, ok, err := msg.get("tool_call_id")
	if err != nil {
		return err
	}
	if ok {
		d.Set("tool_call_id", id)
	}
	content := d.Data["content"]
	if !content.IsList() {
		return nil
	}
	var texts []string
	for _, item := range content.AsList().Items {
		typ, _ := dictGet(item, "type")
		if !typ.IsString() || typ.AsString() != "text" {
			return nil // structured content such as tool_reference stays a list
		}
		text, _ := dictGet(item, "text")
		texts = append(texts, text.AsString())
	}
	d.Set("content", jinja.NewString(strings.Join(texts, "\n")))
	return nil
}
