// Package jsonlex is the one JSON lexer under the gateway's JSON walkers
// (openai's request parser, remotetok's /tokenize decoder, chattemplate's
// message decoder, tokenizer's tokenizer.json loader): each walks the
// shape it expects and leaves strings, numbers, literals, whitespace and
// the skipping of values it does not want to this package, so that the
// grammar of RFC 8259 is written down once, on the untrusted-input path.
//
// The functions take the input and a cursor (a byte offset) and return
// the cursor after what they read, rather than hiding it in a type, so
// that a walker keeps its own state and its own fast paths (a run of
// token ids) without an indirection per byte. On malformed input they
// return an *Error whose Off is also the returned cursor.
//
// UTF-8: like encoding/json, the lexer accepts any byte from 0x20 up in a
// string, invalid UTF-8 included; [String.ASCII] tells a caller that must
// reject invalid UTF-8 (the request parser) which strings it need not
// check, and [AppendString] decodes as encoding/json does, each invalid
// byte and each lone surrogate escape becoming U+FFFD. A walker that
// must refuse invalid UTF-8 checks it itself, once, over what it keeps.
package jsonlex

import (
	"fmt"
	"strconv"
)

// Error is malformed JSON at a byte offset. Msg reads as encoding/json's
// syntax errors do ("invalid character 'x' in numeric literal").
type Error struct {
	Off int
	Msg string
}

// Error returns the message with its offset.
func (e *Error) Error() string { return e.Msg + " at byte " + strconv.Itoa(e.Off) }

// Unexpected is the error for the byte at b[i] (or the end of the input)
// where what follows context was expected, in encoding/json's words.
func Unexpected(b []byte, i int, context string) *Error {
	if i >= len(b) {
		return &Error{Off: len(b), Msg: "unexpected end of JSON input " + context}
	}
	c := b[i]
	if c >= 0x20 && c < 0x7f {
		return &Error{Off: i, Msg: fmt.Sprintf("invalid character %q %s", c, context)}
	}
	return &Error{Off: i, Msg: fmt.Sprintf("invalid byte 0x%02x %s", c, context)}
}

// DepthError is the error for a container opened at b[i] past the
// nesting limit max.
func DepthError(i, max int) *Error {
	return &Error{Off: i, Msg: "exceeded max depth of " + strconv.Itoa(max)}
}

// SkipSpace returns the offset of the first byte at or after i that is
// not JSON whitespace, or len(b).
func SkipSpace(b []byte, i int) int {
	for ; i < len(b); i++ {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
		default:
			return i
		}
	}
	return i
}

// Literal reads true, false or null, whichever b[i] starts, and returns
// the cursor after it. On a mismatch the cursor is the first byte that
// differs, as encoding/json reports it.
func Literal(b []byte, i int) (int, error) {
	var word string
	switch {
	case i >= len(b):
		return i, Unexpected(b, i, "looking for beginning of value")
	case b[i] == 't':
		word = "true"
	case b[i] == 'f':
		word = "false"
	case b[i] == 'n':
		word = "null"
	default:
		return i, Unexpected(b, i, "looking for beginning of value")
	}
	if len(b)-i >= len(word) && string(b[i:i+len(word)]) == word {
		return i + len(word), nil
	}
	// Some byte differs, or the input ends, before the word does.
	for k := 0; ; k++ {
		if j := i + k; j >= len(b) || b[j] != word[k] {
			e := Unexpected(b, j, fmt.Sprintf("in literal %s (expecting %q)", word, word[k]))
			return e.Off, e
		}
	}
}
