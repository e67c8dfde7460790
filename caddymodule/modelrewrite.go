package caddymodule

import (
	"encoding/json"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// rewriteMaxDepth is the nesting rewriteModel walks through: encoding/json's
// own limit, so that every body it accepts is rewritten. The bodies it is
// given passed openai.ParseRequest, which allows far less.
const rewriteMaxDepth = 10000

// rewriteModel returns a copy of body, a JSON object, in which the value of
// every top-level "model" member that is a string is model, JSON-encoded;
// every other byte is as it was, whitespace and escapes included, so the
// engine receives the client's request but for the name. A key is matched
// by its decoded value ("mod\u0065l" is "model"), as encoding/json and
// vLLM's parser match it. Every occurrence is rewritten, not only the last
// (which the gateway's parser and vLLM read), so that a parser reading the
// first sees the same name. ok is false, and body is not copied, when body
// is not one well-formed JSON object or no such member is in it.
func rewriteModel(body []byte, model string) (_ []byte, ok bool) {
	spans, ok := modelSpans(body)
	if !ok || len(spans) == 0 {
		return nil, false
	}
	enc, err := json.Marshal(model)
	if err != nil {
		return nil, false // a Go string always encodes
	}
	grow := 0
	for _, s := range spans {
		grow += len(enc) - (s[1] - s[0])
	}
	out := make([]byte, 0, len(body)+max(grow, 0))
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s[0]]...)
		out = append(out, enc...)
		prev = s[1]
	}
	return append(out, body[prev:]...), true
}

// modelSpans returns the byte spans [start, end) of the string values,
// quotes included, of body's top-level "model" members, in order. ok is
// false when body is not one well-formed JSON object, optionally
// surrounded by whitespace.
func modelSpans(b []byte) (spans [][2]int, ok bool) {
	i := jsonlex.SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	if i = jsonlex.SkipSpace(b, i+1); i < len(b) && b[i] == '}' {
		return nil, jsonlex.SkipSpace(b, i+1) == len(b)
	}
	for {
		key, v, err := jsonlex.Key(b, i)
		if err != nil {
			return nil, false
		}
		if v = jsonlex.SkipSpace(b, v); v < len(b) && b[v] == '"' && isModelKey(b, key) {
			if _, i, err = jsonlex.ReadString(b, v); err != nil {
				return nil, false
			}
			spans = append(spans, [2]int{v, i})
		} else if i, err = jsonlex.Skip(b, v, 1, rewriteMaxDepth); err != nil {
			return nil, false
		}
		if i = jsonlex.SkipSpace(b, i); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return spans, jsonlex.SkipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// isModelKey reports whether key, read from b, decodes to "model".
func isModelKey(b []byte, key jsonlex.String) bool {
	if !key.Escaped {
		return string(b[key.Start:key.End]) == "model"
	}
	return string(jsonlex.AppendString(nil, b, key)) == "model"
}
