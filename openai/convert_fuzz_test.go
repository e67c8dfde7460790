package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// The fuzz targets of the converting parsers compare them with reference
// conversions written the slow, obvious way: encoding/json into maps, then
// the Python of vLLM transcribed line by line. Maps lose key order, so the
// comparison is of decoded values; the table tests check the order. Python
// renderings the reference does not redo (json.dumps of tool arguments,
// str() of an assistant's tool result, non-string parts of a data URI) are
// masked on both sides.

// refDecode decodes body as a JSON object with numbers kept as text, or
// reports that the converting parsers must reject it.
func refDecode(body []byte) (map[string]any, bool) {
	if !utf8.Valid(body) || !json.Valid(body) || jsonDepth(body) > maxDepth {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	m, ok := v.(map[string]any)
	return m, ok
}

// refInt is pydantic's lax int: an integer or an integral float.
func refInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	if i, err := n.Int64(); err == nil {
		return i, true
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<62 {
		return 0, false
	}
	return int64(f), true
}

func isStrOrNil(v any) bool  { _, s := v.(string); return v == nil || s }
func isBoolOrNil(v any) bool { _, b := v.(bool); return v == nil || b }
func isMapOrNil(v any) bool  { _, m := v.(map[string]any); return v == nil || m }

// refTruthy is Python's bool() of a decoded value.
func refTruthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	case json.Number:
		f, _ := x.Float64()
		return f != 0
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}

// errSkip marks a case the reference does not model: compare nothing.
var errSkip = errors.New("not modelled")

// refBlockOK is AnthropicContentBlock's validation.
func refBlockOK(v any) bool {
	b, ok := v.(map[string]any)
	if !ok {
		return false
	}
	t, _ := b["type"].(string)
	if !anthBlockTypes[t] {
		return false
	}
	for _, k := range anthBlockStrings {
		if !isStrOrNil(b[k]) {
			return false
		}
	}
	if !isMapOrNil(b["source"]) || !isMapOrNil(b["input"]) || !isBoolOrNil(b["is_error"]) {
		return false
	}
	switch c := b["content"].(type) {
	case nil, string:
	case []any:
		for _, e := range c {
			if _, ok := e.(map[string]any); !ok {
				return false
			}
		}
	default:
		return false
	}
	return true
}

// refMessage is a validated Anthropic message.
type refMessage struct {
	role    string
	content any
}

// refAnthropicValidate is pydantic's validation of the fields used.
func refAnthropicValidate(top map[string]any) ([]refMessage, error) {
	if !isStrOrNil(top["model"]) || !isBoolOrNil(top["stream"]) || !isMapOrNil(top["chat_template_kwargs"]) {
		return nil, errors.New("type")
	}
	if n, ok := refInt(top["max_tokens"]); !ok || n <= 0 {
		return nil, errors.New("max_tokens")
	}
	messages, ok := top["messages"].([]any)
	if !ok {
		return nil, errors.New("messages")
	}
	var ms []refMessage
	for _, m := range messages {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil, errors.New("message")
		}
		role, _ := mm["role"].(string)
		if role == "ctx" || role == "msg" {
			role = "user"
		}
		if role != "user" && role != "assistant" && role != "system" {
			return nil, errors.New("role")
		}
		switch c := mm["content"].(type) {
		case string:
		case []any:
			for _, b := range c {
				if !refBlockOK(b) {
					return nil, errors.New("block")
				}
			}
		default:
			return nil, errors.New("content")
		}
		ms = append(ms, refMessage{role, mm["content"]})
	}
	return ms, nil
}

// refAnthropicSystem is _convert_system_message.
func refAnthropicSystem(sys any, ms []refMessage) ([]any, error) {
	var parts []string
	switch s := sys.(type) {
	case nil:
	case string:
		if s != "" {
			parts = append(parts, s)
		}
	case []any:
		for _, b := range s {
			if !refBlockOK(b) {
				return nil, errors.New("system block")
			}
			parts = append(parts, refSystemText(b.(map[string]any))...)
		}
	default:
		return nil, errors.New("system")
	}
	for _, m := range ms {
		if m.role != "system" {
			continue
		}
		if s, ok := m.content.(string); ok {
			parts = append(parts, s)
			continue
		}
		for _, b := range m.content.([]any) {
			parts = append(parts, refSystemText(b.(map[string]any))...)
		}
	}
	if parts == nil {
		return nil, nil
	}
	return []any{map[string]any{"role": "system", "content": strings.Join(parts, "")}}, nil
}

// refAnthropic is _convert_anthropic_to_openai_request on decoded JSON.
func refAnthropic(top map[string]any) ([]any, error) {
	ms, err := refAnthropicValidate(top)
	if err != nil {
		return nil, err
	}
	msgs, err := refAnthropicSystem(top["system"], ms)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.role == "system" {
			continue
		}
		om := map[string]any{"role": m.role}
		if s, ok := m.content.(string); ok {
			om["content"] = s
		} else if msgs, err = refAnthContent(m.content.([]any), m.role, om, msgs); err != nil {
			return nil, err
		}
		if _, has := om["content"]; m.role != "user" || has {
			msgs = append(msgs, om)
		}
	}
	return msgs, nil
}

func refSystemText(b map[string]any) []string {
	t, _ := b["text"].(string)
	if b["type"] == "text" && t != "" && !strings.HasPrefix(t, billingHeader) {
		return []string{t}
	}
	return nil
}

// refAnthContent is _convert_message_content and _convert_block.
func refAnthContent(blocks []any, role string, om map[string]any, out []any) ([]any, error) {
	var parts, calls []any
	var reasoning []string
	for _, bv := range blocks {
		b := bv.(map[string]any)
		switch b["type"] {
		case "text":
			if t, _ := b["text"].(string); t != "" {
				parts = append(parts, map[string]any{"type": "text", "text": t})
			}
		case "image":
			if src, _ := b["source"].(map[string]any); len(src) > 0 {
				u, err := refImageURL(src)
				if err != nil {
					return nil, err
				}
				parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}})
			}
		case "thinking":
			if t, ok := b["thinking"].(string); ok {
				reasoning = append(reasoning, t)
			}
		case "tool_use":
			id, _ := b["id"].(string)
			if id == "" {
				id = "call_1700000000"
			}
			name, _ := b["name"].(string)
			calls = append(calls, map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": name, "arguments": "*"}})
		case "tool_result":
			var err error
			if role != "user" {
				text := ""
				if refTruthy(b["content"]) {
					text, _ = b["content"].(string)
					if _, isList := b["content"].([]any); isList {
						text = "*"
					}
				}
				parts = append(parts, map[string]any{"type": "text", "text": "Tool result: " + text})
			} else if out, err = refUserToolResult(b, out); err != nil {
				return nil, err
			}
		}
	}
	if reasoning != nil {
		om["reasoning"] = strings.Join(reasoning, "")
	}
	if calls != nil {
		om["tool_calls"] = calls
	}
	if len(parts) == 1 && parts[0].(map[string]any)["type"] == "text" {
		om["content"] = parts[0].(map[string]any)["text"]
	} else if len(parts) > 0 {
		om["content"] = parts
	}
	return out, nil
}

func refImageURL(src map[string]any) (string, error) {
	if src["type"] == "url" {
		u, has := src["url"]
		if !has {
			return "", nil
		}
		s, ok := u.(string)
		if !ok {
			return "", errors.New("url")
		}
		return s, nil
	}
	media, data := "image/jpeg", ""
	for k, dst := range map[string]*string{"media_type": &media, "data": &data} {
		if v, has := src[k]; has {
			s, ok := v.(string)
			if !ok {
				return "", errSkip
			}
			*dst = s
		}
	}
	return "data:" + media + ";base64," + data, nil
}

// refUserToolResult is _convert_user_tool_result.
func refUserToolResult(b map[string]any, out []any) ([]any, error) {
	text := ""
	var images, refs []any
	switch c := b["content"].(type) {
	case string:
		text = c
	case []any:
		var texts []string
		for _, iv := range c {
			it := iv.(map[string]any)
			switch it["type"] {
			case "text":
				t, has := it["text"]
				s, ok := t.(string)
				if has && !ok {
					return nil, errors.New("text")
				}
				texts = append(texts, s)
			case "image":
				src, has := it["source"]
				sm, ok := src.(map[string]any)
				if has && !ok {
					return nil, errors.New("source")
				}
				u, err := refImageURL(sm)
				if err != nil {
					return nil, err
				}
				if u != "" {
					images = append(images, map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}})
				}
			case "tool_reference":
				ref := it["tool_name"]
				if !refTruthy(ref) {
					ref = it["name"]
				}
				if refTruthy(ref) {
					refs = append(refs, map[string]any{"type": "tool_reference", "name": ref})
				}
			}
		}
		text = strings.Join(texts, "\n")
	}
	id, _ := b["tool_use_id"].(string)
	out = append(out, map[string]any{"role": "tool", "tool_call_id": id, "content": text})
	if images != nil {
		out = append(out, map[string]any{"role": "user", "content": images})
	}
	if refs != nil {
		out = append(out, map[string]any{"role": "tool", "tool_call_id": id, "content": refs})
	}
	return out, nil
}

// refAnthropicTools is _convert_tools.
func refAnthropicTools(v any) ([]any, error) {
	if v == nil {
		return nil, nil
	}
	tools, ok := v.([]any)
	if !ok {
		return nil, errors.New("tools")
	}
	out := []any{}
	for _, tv := range tools {
		t, ok := tv.(map[string]any)
		if !ok {
			return nil, errors.New("tool")
		}
		name, ok := t["name"].(string)
		schema, sok := t["input_schema"].(map[string]any)
		if !ok || !sok || !isStrOrNil(t["description"]) || !isBoolOrNil(t["strict"]) || !isBoolOrNil(t["defer_loading"]) {
			return nil, errors.New("tool field")
		}
		if _, has := schema["type"]; !has {
			schema["type"] = "object"
		}
		fn := map[string]any{"name": name, "parameters": schema}
		for _, k := range []string{"description", "defer_loading"} {
			if t[k] != nil {
				fn[k] = t[k]
			}
		}
		out = append(out, map[string]any{"type": "function", "function": fn})
	}
	return out, nil
}

// maskPython replaces the renderings the reference does not redo.
func maskPython(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if k == "arguments" {
				if _, ok := e.(string); ok {
					x[k] = "*"
					continue
				}
			}
			x[k] = maskPython(e)
		}
	case []any:
		for i, e := range x {
			x[i] = maskPython(e)
		}
	case string:
		if strings.HasPrefix(x, "Tool result: [") {
			return "Tool result: *"
		}
	}
	return v
}

// decodeAny decodes our output for comparison (numbers as text).
func decodeAny(t *testing.T, b []byte) any {
	t.Helper()
	if b == nil {
		return nil
	}
	if !json.Valid(b) {
		t.Fatalf("output is not valid JSON: %s", b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// roundTrip re-encodes a reference value through JSON, so that numbers
// and containers have the types decodeAny gives.
func roundTrip(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return decodeAny(t, b)
}

// checkError fails unless err is a *RequestError pointing into body.
func checkError(t *testing.T, body []byte, err error) {
	t.Helper()
	var re *RequestError
	if !errors.As(err, &re) {
		t.Fatalf("error %T is not a *RequestError: %v", err, err)
	}
	if re.Offset < 0 || re.Offset > len(body) {
		t.Fatalf("offset %d outside body of %d bytes", re.Offset, len(body))
	}
}

var anthropicSeeds = []string{
	`{"model":"m","max_tokens":8,"system":"S","messages":[{"role":"user","content":"hi"}]}`,
	`{"max_tokens":8,"system":[{"type":"text","text":"A"}],"messages":[{"role":"system","content":"B"},{"role":"assistant","content":[{"type":"thinking","thinking":""},{"type":"tool_use","id":"x","name":"f","input":{"a":[1.5,"é"]}}]}]}`,
	`{"max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"url","url":"u"}},{"type":"tool_reference","name":"n"}]},{"type":"image","source":{"data":"d"}}]}]}`,
	`{"max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]},{"type":"text","text":"y"}]}],"tools":[{"name":"f","input_schema":{}}]}`,
	`{"max_tokens":0,"messages":[]}`, `{"max_tokens":1,"messages":[{"role":"ctx","content":[{"type":"video"}]}]}`,
}

// FuzzParseAnthropic checks ParseAnthropic against refAnthropic: the same
// bodies accepted, the same messages and tools, valid JSON, no panic.
func FuzzParseAnthropic(f *testing.F) {
	for _, s := range anthropicSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fixClock(t)
		got, err := ParseAnthropic(body)
		top, ok := refDecode(body)
		var want, wantTools []any
		if ok {
			var rerr error
			want, rerr = refAnthropic(top)
			if rerr == nil {
				wantTools, rerr = refAnthropicTools(top["tools"])
			}
			if errors.Is(rerr, errSkip) {
				return
			}
			ok = rerr == nil
		}
		if err != nil {
			checkError(t, body, err)
			if ok {
				t.Fatalf("rejected %q: %v; the reference accepts it", body, err)
			}
			return
		}
		if !ok {
			t.Fatalf("accepted %q, which the reference rejects", body)
		}
		compare(t, body, "Messages", got.Messages, want)
		compare(t, body, "Tools", got.Tools, wantTools)
	})
}

// compare checks our output against the reference value, masked.
func compare(t *testing.T, body []byte, what string, got []byte, want []any) {
	t.Helper()
	g := maskPython(decodeAny(t, got))
	var w any
	if want != nil {
		w = maskPython(roundTrip(t, want))
	} else if what == "Messages" {
		w = []any{}
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("body %q\n%s got  %v\n%s want %v", body, what, g, what, w)
	}
}

// largeBodies are bodies the size limit lets through that would take
// quadratic work in a careless converter: n keys in one object (duplicate
// detection), n messages, n items merged into one assistant message.
func largeBodies(n int) map[string]func([]byte) (*Request, error) {
	var keys, msgs, calls strings.Builder
	for i := range n {
		if i > 0 {
			keys.WriteByte(',')
			msgs.WriteByte(',')
			calls.WriteByte(',')
		}
		keys.WriteString(`"k` + itoa(i) + `":1`)
		msgs.WriteString(`{"role":"user","content":"m"}`)
		calls.WriteString(`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}`)
	}
	return map[string]func([]byte) (*Request, error){
		`{"max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","input":{` + keys.String() + `}}]}]}`: ParseAnthropic,
		`{"max_tokens":1,"messages":[` + msgs.String() + `]}`:                                                                ParseAnthropic,
		`{"input":[` + calls.String() + `]}`:                                                                                 ParseResponses,
	}
}

// TestConvertLargeBodies: the largest such bodies convert. Whether they
// convert in linear time is BenchmarkConvertLargeBodies' figure (its 10k
// and 100k cases side by side), not a timed assertion here; a quadratic
// converter would take minutes on these and meet the test timeout.
func TestConvertLargeBodies(t *testing.T) {
	for body, parse := range largeBodies(100000) {
		if _, err := parse([]byte(body)); err != nil {
			t.Fatalf("%d-byte body: %v", len(body), err)
		}
	}
}

// BenchmarkConvertLargeBodies converts largeBodies of 10k and 100k items:
// linear work costs ten times as much per op at 100k, quadratic a hundred.
func BenchmarkConvertLargeBodies(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		b.Run(itoa(n), func(b *testing.B) {
			bodies := largeBodies(n)
			for b.Loop() {
				for body, parse := range bodies {
					if _, err := parse([]byte(body)); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// refResponses is construct_input_messages and
// _construct_message_from_response_item on decoded JSON.
func refResponses(top map[string]any) (msgs []any, continueFinal bool, err error) {
	for _, k := range []string{"model", "previous_response_id", "cache_salt", "instructions"} {
		if !isStrOrNil(top[k]) {
			return nil, false, errors.New(k)
		}
	}
	if !isBoolOrNil(top["stream"]) || !isBoolOrNil(top["store"]) || !isMapOrNil(top["chat_template_kwargs"]) {
		return nil, false, errors.New("type")
	}
	if v := top["max_output_tokens"]; v != nil {
		if _, ok := refInt(v); !ok {
			return nil, false, errors.New("max_output_tokens")
		}
	}
	if s, _ := top["instructions"].(string); s != "" {
		msgs = append(msgs, map[string]any{"role": "system", "content": s})
	}
	switch in := top["input"].(type) {
	case string:
		return append(msgs, map[string]any{"role": "user", "content": in}), false, nil
	case []any:
		for _, it := range in {
			if msgs, err = refItem(it, msgs); err != nil {
				return nil, false, err
			}
		}
		if len(in) > 0 {
			last, _ := in[len(in)-1].(map[string]any)
			t, st := "message", ""
			if v, has := last["type"]; has {
				t, _ = v.(string)
			}
			st, _ = last["status"].(string)
			continueFinal = (t == "message" || t == "reasoning") && (st == "in_progress" || st == "incomplete")
		}
		return msgs, continueFinal, nil
	}
	return nil, false, errors.New("input")
}

// refPrevAssistant is prev_assistant_msg.
func refPrevAssistant(msgs []any) map[string]any {
	if len(msgs) == 0 {
		return nil
	}
	if m, ok := msgs[len(msgs)-1].(map[string]any); ok && m["role"] == "assistant" {
		return m
	}
	return nil
}

func refFirstText(v any) string {
	l, _ := v.([]any)
	if len(l) == 0 {
		return ""
	}
	if s, ok := l[0].(string); ok {
		return s
	}
	m, _ := l[0].(map[string]any)
	s, _ := m["text"].(string)
	return s
}

func refItem(iv any, msgs []any) ([]any, error) {
	it, ok := iv.(map[string]any)
	if !ok {
		return nil, errors.New("item")
	}
	t, _ := it["type"].(string)
	role, _ := it["role"].(string)
	prev := refPrevAssistant(msgs)
	switch {
	case t == "function_call":
		var f [4]string
		for i, k := range []string{"call_id", "name", "arguments", "namespace"} {
			s, ok := it[k].(string)
			if !ok && (i < 3 || it[k] != nil) {
				return nil, errors.New(k)
			}
			f[i] = s
		}
		if f[3] != "" {
			f[1] = f[3] + "__" + f[1]
		}
		call := map[string]any{"id": f[0], "type": "function", "function": map[string]any{"name": f[1], "arguments": f[2]}}
		if prev != nil {
			calls, _ := prev["tool_calls"].([]any)
			prev["tool_calls"] = append(calls, call)
			return msgs, nil
		}
		return append(msgs, map[string]any{"role": "assistant", "tool_calls": []any{call}}), nil
	case t == "reasoning":
		if refTruthy(it["encrypted_content"]) {
			return nil, errors.New("encrypted")
		}
		text := ""
		if c, ok := it["content"].([]any); ok && len(c) > 0 {
			text = refFirstText(c)
		} else if s, ok := it["summary"].([]any); ok && len(s) > 0 {
			text = refFirstText(s)
		}
		if _, has := prev["reasoning"]; prev != nil && !has {
			prev["reasoning"] = text
			return msgs, nil
		}
		return append(msgs, map[string]any{"role": "assistant", "reasoning": text}), nil
	case t == "function_call_output":
		return append(msgs, map[string]any{"role": "tool", "content": it["output"], "tool_call_id": it["call_id"]}), nil
	case role == "assistant" && (t == "" || t == "message"):
		text := ""
		switch c := it["content"].(type) {
		case nil:
		case string:
			text = c
		case []any:
			text = refFirstText(c)
		default:
			return nil, errors.New("content")
		}
		if _, has := prev["content"]; prev != nil && !has {
			prev["content"] = text
			return msgs, nil
		}
		return append(msgs, map[string]any{"role": "assistant", "content": text}), nil
	}
	return append(msgs, it), nil
}

// refResponsesTools is construct_tool_dicts.
func refResponsesTools(v any) ([]any, error) {
	if v == nil {
		return nil, nil
	}
	tools, ok := v.([]any)
	if !ok {
		return nil, errors.New("tools")
	}
	var out []any
	conv := func(t map[string]any, ns string) {
		fn := map[string]any{}
		for k, e := range t {
			if k != "type" {
				fn[k] = e
			}
		}
		if name, has := t["name"]; has && ns != "" {
			s, _ := name.(string)
			fn["name"] = ns + "__" + s
		}
		out = append(out, map[string]any{"type": "function", "function": fn})
	}
	for _, tv := range tools {
		t, ok := tv.(map[string]any)
		if !ok {
			return nil, errors.New("tool")
		}
		switch t["type"] {
		case "function":
			conv(t, "")
		case "namespace":
			ns, _ := t["name"].(string)
			sub, ok := t["tools"].([]any)
			if !ok {
				return nil, errors.New("namespace tools")
			}
			for _, sv := range sub {
				if st, ok := sv.(map[string]any); ok && st["type"] == "function" {
					conv(st, ns)
				}
			}
		}
	}
	return out, nil
}

var responsesSeeds = []string{
	`{"model":"m","instructions":"I","input":"hi","store":true,"previous_response_id":"r"}`,
	`{"input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},{"type":"reasoning","id":"r","summary":[],"content":[{"type":"reasoning_text","text":"t"}]},` +
		`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
	`{"input":[{"role":"assistant","content":"a","status":"incomplete"}],"tools":[{"type":"function","name":"f"},{"type":"namespace","name":"n","tools":[{"type":"function","name":"g"}]}]}`,
	`{"input":[{"type":"reasoning","encrypted_content":"x"}]}`, `{"input":5}`,
}

// FuzzParseResponses checks ParseResponses against refResponses.
func FuzzParseResponses(f *testing.F) {
	for _, s := range responsesSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := ParseResponses(body)
		top, ok := refDecode(body)
		var want, wantTools []any
		var cf bool
		if ok {
			var rerr error
			want, cf, rerr = refResponses(top)
			if rerr == nil {
				wantTools, rerr = refResponsesTools(top["tools"])
			}
			ok = rerr == nil
		}
		if err != nil {
			checkError(t, body, err)
			if ok {
				t.Fatalf("rejected %q: %v; the reference accepts it", body, err)
			}
			return
		}
		if !ok {
			t.Fatalf("accepted %q, which the reference rejects", body)
		}
		compare(t, body, "Messages", got.Messages, want)
		compare(t, body, "Tools", got.Tools, wantTools)
		if *got.ContinueFinalMessage != cf || *got.AddGenerationPrompt == cf {
			t.Fatalf("body %q: ContinueFinalMessage %v, want %v", body, *got.ContinueFinalMessage, cf)
		}
	})
}

// FuzzParsePooling checks ParsePooling against encoding/json.
func FuzzParsePooling(f *testing.F) {
	for _, s := range []string{`{"model":"e","input":["a","b"]}`, `{"input":[[1,2]],"cache_salt":"s"}`,
		`{"messages":[{"role":"user","content":"x"}]}`, `{"queries":"q","items":["i"],"text_1":"a","text_2":"b"}`,
		`{"query":"q","documents":["d"]}`, `{"input":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := ParsePooling(body)
		top, ok := refDecode(body)
		if ok {
			_, in := top["input"].([]any)
			_, ins := top["input"].(string)
			_, msgs := top["messages"].([]any)
			ok = isStrOrNil(top["model"]) && isStrOrNil(top["cache_salt"]) &&
				(top["input"] == nil || in || ins) && (top["messages"] == nil || msgs)
		}
		if err != nil {
			checkError(t, body, err)
			if ok {
				t.Fatalf("rejected %q: %v; encoding/json accepts it", body, err)
			}
			return
		}
		if !ok {
			t.Fatalf("accepted %q, which must be rejected", body)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatal(err)
		}
		raw := func(k string) string {
			if string(m[k]) == "null" {
				return ""
			}
			return string(m[k])
		}
		if !got.PrefillOnly || string(got.Prompt) != raw("input") || string(got.Messages) != raw("messages") {
			t.Fatalf("body %q: Prompt %s Messages %s", body, got.Prompt, got.Messages)
		}
		q, d := "", ""
		for _, p := range scorePairs {
			if raw(p[0]) != "" && raw(p[1]) != "" {
				q, d = raw(p[0]), raw(p[1])
				break
			}
		}
		if string(got.Query) != q || string(got.Documents) != d {
			t.Fatalf("body %q: Query %s Documents %s, want %s %s", body, got.Query, got.Documents, q, d)
		}
	})
}
