package upstreams

import (
	"strconv"
	"unicode/utf8"
)

// appendBody appends the /tokenize body for w, its raw fields copied as
// they are (TokenizeRequest.Verbatim): the same members, in the same
// order, as encoding/json writes for tokenizeWire. The size is summed
// first so that the body, as long as the prompt, is allocated once.
func (w *tokenizeWire) appendBody(dst []byte) []byte {
	size := 256 + len(w.Model) + len(w.Prompt) + len(w.Messages) + len(w.ChatTemplate) + len(w.ChatTemplateKwargs) + len(w.Tools)
	if cap(dst)-len(dst) < size {
		dst = append(make([]byte, 0, len(dst)+size+size/16), dst...)
	}
	dst = append(dst, '{')
	start := len(dst)
	member := func(name string) {
		if len(dst) > start {
			dst = append(dst, ',')
		}
		dst = append(append(append(dst, '"'), name...), '"', ':')
	}
	raw := func(name string, v []byte) {
		if len(v) > 0 {
			member(name)
			dst = append(dst, v...)
		}
	}
	str := func(name, v string) {
		if v != "" {
			member(name)
			dst = appendJSONString(dst, v)
		}
	}
	flag := func(name string, v *bool) {
		if v != nil {
			member(name)
			dst = strconv.AppendBool(dst, *v)
		}
	}
	str("model", w.Model)
	raw("prompt", w.Prompt)
	raw("messages", w.Messages)
	flag("add_generation_prompt", w.AddGenerationPrompt)
	flag("continue_final_message", w.ContinueFinalMessage)
	flag("add_special_tokens", w.AddSpecialTokens)
	str("chat_template", w.ChatTemplate)
	raw("chat_template_kwargs", w.ChatTemplateKwargs)
	raw("tools", w.Tools)
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string that decodes to what
// encoding/json's encoding of s decodes to: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD.
// (encoding/json also escapes <, >, & and U+2028/9, which changes the
// bytes, not the value.)
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(append(dst, s[start:i]...), `\ufffd`...)
			i++
			start = i
			continue
		}
		i += n
	}
	return append(append(dst, s[start:]...), '"')
}
