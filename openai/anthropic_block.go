package openai

import (
	"encoding/json"
	"strings"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// anthBlock is an Anthropic content block as vLLM's AnthropicContentBlock
// validates it: the fields the conversion reads, "" for null or absent.
type anthBlock struct {
	typ         string
	text        string
	thinking    string
	hasThinking bool // thinking is not None: "" counts
	id, name    string
	toolUseID   string
	source      []byte // an object, or nil
	input       []byte // an object, or nil
	content     []byte // a string or an array of objects, or nil
}

// anthBlockTypes are the block types AnthropicContentBlock accepts; any
// other is a validation error (400) in vLLM.
var anthBlockTypes = map[string]bool{
	"text": true, "image": true, "tool_use": true, "tool_result": true,
	"tool_reference": true, "thinking": true, "redacted_thinking": true,
}

// anthBlockStrings are the block fields typed str | None.
var anthBlockStrings = []string{"text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data"}

// block validates a content block as pydantic would and returns it.
func (c *converter) block(v []byte, path string) (anthBlock, error) {
	if v[0] != '{' {
		return anthBlock{}, c.err(v, path, "must be an object, not "+kind(v[0]))
	}
	o := parseObject(v)
	var b anthBlock
	tv := o.get("type")
	t, ok := decodeString(tv)
	if !ok || !anthBlockTypes[t] {
		return b, c.err(orNil(tv, v), path+".type", "must be one of text, image, tool_use, tool_result, tool_reference, thinking, redacted_thinking")
	}
	b.typ = t
	strs := make(map[string]string, 2)
	for _, k := range anthBlockStrings {
		f := o.get(k)
		if isNull(f) {
			continue
		}
		s, ok := decodeString(f)
		if !ok {
			return b, c.err(f, path+"."+k, "must be a string, not "+kind(f[0]))
		}
		strs[k] = s
	}
	b.text, b.id, b.name, b.toolUseID = strs["text"], strs["id"], strs["name"], strs["tool_use_id"]
	b.thinking, b.hasThinking = strs["thinking"], !isNull(o.get("thinking"))
	if b.source, ok = optObject(o.get("source")); !ok {
		return b, c.err(o.get("source"), path+".source", "must be an object")
	}
	if b.input, ok = optObject(o.get("input")); !ok {
		return b, c.err(o.get("input"), path+".input", "must be an object")
	}
	if f := o.get("is_error"); !isNull(f) && f[0] != 't' && f[0] != 'f' {
		return b, c.err(f, path+".is_error", "must be a boolean, not "+kind(f[0]))
	}
	return b, c.blockContent(&b, o.get("content"), path+".content")
}

// optObject returns v when it is an object, nil for null; ok is false for
// another kind.
func optObject(v []byte) ([]byte, bool) {
	if isNull(v) {
		return nil, true
	}
	return v, v[0] == '{'
}

// blockContent checks a block's content: str | list[dict] | None.
func (c *converter) blockContent(b *anthBlock, v []byte, path string) error {
	if isNull(v) {
		return nil
	}
	switch v[0] {
	case '"':
	case '[':
		for i, e := range parseElems(v) {
			if e[0] != '{' {
				return c.err(e, path+"["+itoa(i)+"]", "must be an object, not "+kind(e[0]))
			}
		}
	default:
		return c.err(v, path, "must be a string or an array, not "+kind(v[0]))
	}
	b.content = v
	return nil
}

// imageURL is _convert_image_source_to_url: a "url" source's url, else a
// base64 data URI whose parts are Python's str() of the values (a null
// media type reads "None", as in vLLM's f-string).
func (c *converter) imageURL(src []byte, path string) (string, error) {
	o := parseObject(src)
	if t, _ := decodeString(o.get("type")); t == "url" {
		u := o.get("url")
		if u == nil {
			return "", nil
		}
		s, ok := decodeString(u)
		if !ok {
			return "", c.err(u, path+".url", "must be a string, not "+kind(u[0]))
		}
		return s, nil
	}
	media, data := "image/jpeg", ""
	if v := o.get("media_type"); v != nil {
		media = pyStr(v)
	}
	if v := o.get("data"); v != nil {
		data = pyStr(v)
	}
	return "data:" + media + ";base64," + data, nil
}

// userToolResult converts a tool_result block of a user message
// (_convert_user_tool_result): a tool message with the text parts joined
// by newlines, then a user message with its images, then a tool message
// with its tool references, each only when there are some.
func (c *converter) userToolResult(b anthBlock, path string) error {
	text, images, refs := "", [][]byte(nil), [][]byte(nil)
	if s, ok := decodeString(b.content); ok {
		text = s
	} else if b.content != nil {
		var err error
		if text, images, refs, err = c.toolResultItems(b.content, path+".content"); err != nil {
			return err
		}
	}
	c.toolMessage(b.toolUseID, jstr(text))
	if images != nil {
		m := &msg{}
		m.set("role", jstr("user"))
		m.set("content", images)
		c.out = append(c.out, m)
	}
	if refs != nil {
		c.toolMessage(b.toolUseID, appendList(nil, refs))
	}
	return nil
}

// toolResultItems reads the items of a tool result's list content: the
// text of text items, joined by newlines; image parts; and tool
// references (tool_name, else name, when truthy, copied as they are).
// Other items are ignored, as in vLLM.
func (c *converter) toolResultItems(content []byte, path string) (string, [][]byte, [][]byte, error) {
	var texts []string
	var images, refs [][]byte
	for i, e := range parseElems(content) {
		ip := path + "[" + itoa(i) + "]"
		o := parseObject(e)
		switch t, _ := decodeString(o.get("type")); t {
		case "text":
			s, ok := "", true
			if v := o.get("text"); v != nil {
				s, ok = decodeString(v)
			}
			if !ok { // "\n".join fails on it in vLLM
				return "", nil, nil, c.err(o.get("text"), ip+".text", "must be a string")
			}
			texts = append(texts, s)
		case "image":
			src := o.get("source")
			if src == nil {
				src = []byte("{}")
			} else if src[0] != '{' {
				return "", nil, nil, c.err(src, ip+".source", "must be an object, not "+kind(src[0]))
			}
			u, err := c.imageURL(src, ip+".source")
			if err != nil {
				return "", nil, nil, err
			}
			if u != "" {
				images = append(images, imagePart(u).enc)
			}
		case "tool_reference":
			ref := o.get("tool_name")
			if !truthy(ref) {
				ref = o.get("name")
			}
			if truthy(ref) {
				refs = append(refs, append(append([]byte(`{"type":"tool_reference","name":`), ref...), '}'))
			}
		}
	}
	return strings.Join(texts, "\n"), images, refs, nil
}

// toolMessage appends {"role":"tool","tool_call_id":id,"content":content}.
func (c *converter) toolMessage(id string, content []byte) {
	m := &msg{}
	m.set("role", jstr("tool"))
	m.set("tool_call_id", jstr(id))
	m.set("content", content)
	c.out = append(c.out, m)
}

// tools converts Anthropic tools to chat completions tools (_convert_tools
// and AnthropicTool's validator, which adds "type": "object" to a schema
// without a type, at the end as a dict assignment does). Null fields are
// left out: vLLM's ChatCompletionToolsParam fills in the same defaults.
func (c *converter) tools(v []byte) (json.RawMessage, error) {
	if isNull(v) {
		return nil, nil
	}
	if v[0] != '[' {
		return nil, c.err(v, "tools", "must be an array, not "+kind(v[0]))
	}
	var out [][]byte
	for i, e := range parseElems(v) {
		t, err := c.tool(e, "tools["+itoa(i)+"]")
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return appendList(nil, out), nil
}

// tool converts one tool.
func (c *converter) tool(v []byte, path string) ([]byte, error) {
	if v[0] != '{' {
		return nil, c.err(v, path, "must be an object, not "+kind(v[0]))
	}
	o := parseObject(v)
	name, ok := decodeString(o.get("name"))
	if !ok {
		return nil, c.err(orNil(o.get("name"), v), path+".name", "must be a string")
	}
	schema := o.get("input_schema")
	if schema == nil || schema[0] != '{' {
		return nil, c.err(orNil(schema, v), path+".input_schema", "must be an object")
	}
	if parseObject(schema).get("type") == nil {
		schema = withTypeObject(schema)
	}
	fn := &msg{}
	fn.set("name", jstr(name))
	if d := o.get("description"); !isNull(d) {
		if d[0] != '"' {
			return nil, c.err(d, path+".description", "must be a string, not "+kind(d[0]))
		}
		fn.set("description", d)
	}
	fn.set("parameters", schema)
	for _, k := range []string{"strict", "defer_loading"} {
		if f := o.get(k); !isNull(f) && f[0] != 't' && f[0] != 'f' {
			return nil, c.err(f, path+"."+k, "must be a boolean, not "+kind(f[0]))
		}
	}
	if d := o.get("defer_loading"); !isNull(d) {
		fn.set("defer_loading", d)
	}
	return append(fn.appendTo([]byte(`{"type":"function","function":`)), '}'), nil
}

// withTypeObject returns a copy of the object schema with "type":"object"
// added as its last member.
func withTypeObject(schema []byte) []byte {
	end := len(schema) - 1 // '}'
	body := strings.TrimSpace(string(schema[1:end]))
	out := append([]byte{'{'}, body...)
	if body != "" {
		out = append(out, ',')
	}
	return append(out, `"type":"object"}`...)
}

// jsonInt reads an integer as pydantic's lax int does from JSON: an
// integer, or a float with no fractional part.
func jsonInt(v []byte) (int64, bool) {
	if n, ok := jsonlex.ParseInt64(v); ok {
		return n, true
	}
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return 0, false
	}
	f, err := jsonlex.ParseFloat(v)
	if err != nil || f != float64(int64(f)) || f > 1<<62 || f < -(1<<62) {
		return 0, false
	}
	return int64(f), true
}
