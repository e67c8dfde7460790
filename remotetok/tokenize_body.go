package remotetok

import (
	"strconv"
	"unicode/utf8"
)

// appendBody appends the /tokenize body for w, its raw fields copied as
// they are (TokenizeRequest.Verbatim): the same members, in the same
// order, as encoding/json writes for tokenizeWire. The size is summed
// first so that the body, as long as the prompt, is allocated once.
func (w *tokenizeWire) appendBody(dst []byte) []byte {
	size := w.bodySize()
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
	w.eachField(wireFields{
		raw: func(name string, _ byte, v []byte) {
			if len(v) > 0 {
				member(name)
				dst = append(dst, v...)
			}
		},
		str: func(name string, _ byte, v string) {
			if v != "" {
				member(name)
				dst = appendJSONString(dst, v)
			}
		},
		flag: func(name string, _ byte, v *bool) {
			if v != nil {
				member(name)
				dst = strconv.AppendBool(dst, *v)
			}
		},
	})
	return append(dst, '}')
}

// bodySize bounds the verbatim body's length from above (but for string
// fields that grow when escaped, which append handles).
func (w *tokenizeWire) bodySize() int {
	return 256 + len(w.Model) + len(w.Prompt) + len(w.Messages) + len(w.ChatTemplate) + len(w.ChatTemplateKwargs) + len(w.Tools)
}

// wireFields are what eachField calls for each field, by kind: raw JSON,
// a string, an optional flag. name is the field's JSON member, tag the
// byte that marks it in the cache key.
type wireFields struct {
	raw  func(name string, tag byte, v []byte)
	str  func(name string, tag byte, v string)
	flag func(name string, tag byte, v *bool)
}

// eachField visits the fields a /tokenize request carries, set or not, in
// the order encoding/json writes tokenizeWire's members. The body and the
// cache key both walk this one list, so what is sent and what the cache
// is keyed by cannot drift apart.
func (w *tokenizeWire) eachField(f wireFields) {
	f.str("model", 'm', w.Model)
	f.raw("prompt", 'p', w.Prompt)
	f.raw("messages", 'M', w.Messages)
	f.flag("add_generation_prompt", 'g', w.AddGenerationPrompt)
	f.flag("continue_final_message", 'c', w.ContinueFinalMessage)
	f.flag("add_special_tokens", 's', w.AddSpecialTokens)
	f.str("chat_template", 'T', w.ChatTemplate)
	f.raw("chat_template_kwargs", 'k', w.ChatTemplateKwargs)
	f.raw("tools", 't', w.Tools)
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
