package chattemplate

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// continue_final_message follows transformers 4.x (render_jinja_template
// in transformers/utils/chat_template_utils.py), the major version vLLM
// pins (transformers >= 4.56, < 5): the template renders the conversation
// as usual, with add_generation_prompt off, and the output is cut right
// after the last occurrence of the final message's text, stripped of
// surrounding white space, dropping whatever the template writes to close
// the message. (Transformers 5 marks the message with a sentinel instead,
// which keeps trailing white space the message had; when vLLM moves to it,
// so must this.)

// finalText is the text continue_final_message continues: the final
// message's content, or its last part that has a "text" member. Like
// transformers, it refuses a final message without such text.
func finalText(conv []jinja.Value) (string, error) {
	if len(conv) == 0 {
		return "", fmt.Errorf("%w: continue_final_message needs a final message", ErrInvalidInput)
	}
	final := conv[len(conv)-1].AsDict()
	content := final.Data["content"]
	switch {
	case content.IsString():
		return content.AsString(), nil
	case content.IsList():
		items := content.AsList().Items
		for i := len(items) - 1; i >= 0; i-- {
			if text, ok := dictGet(items[i], "text"); ok && text.IsString() {
				return text.AsString(), nil
			}
		}
		return "", fmt.Errorf("%w: continue_final_message is set but the final message has no text to continue", ErrInvalidInput)
	}
	return "", fmt.Errorf("%w: continue_final_message is set but the final message has no content", ErrInvalidInput)
}

// cutAfterFinal cuts the rendered conversation right after the last
// occurrence of the stripped final text, which must appear in it.
func cutAfterFinal(rendered, final string) (string, error) {
	stripped := strings.TrimFunc(final, pyIsSpace)
	loc := strings.LastIndex(rendered, stripped)
	if loc < 0 {
		return "", fmt.Errorf("%w: continue_final_message is set but the final message does not appear in the rendered chat", ErrInvalidInput)
	}
	return rendered[:loc+len(stripped)], nil
}

// pyIsSpace is Python's str.isspace for one character: Unicode white
// space plus the ASCII separators U+001C to U+001F, which Python strips
// and Go's unicode.IsSpace does not.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}
