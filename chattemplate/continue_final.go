package chattemplate

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// continueTag is the sentinel transformers appends to the final message
// when continue_final_message is set (render_jinja_template in
// transformers/utils/chat_template_utils.py): the template renders the
// conversation as usual, with add_generation_prompt off, and the output
// is cut where the sentinel lands, dropping whatever the template writes
// to close the message.
const continueTag = "CONTINUE_FINAL_MESSAGE_TAG "

// markFinalMessage appends continueTag to the final message's content, or
// to its last part that has a "text" member, and returns the text it
// extended. Like transformers, it refuses a template whose source never
// mentions "content", a final message without content, and a content
// list with no text part.
func markFinalMessage(conv []jinja.Value, src string) (string, error) {
	if len(conv) == 0 {
		return "", fmt.Errorf("%w: continue_final_message needs a final message", ErrInvalidInput)
	}
	if !strings.Contains(src, "content") {
		return "", fmt.Errorf("%w: continue_final_message is set but the template has no \"content\" field", ErrInvalidInput)
	}
	final := conv[len(conv)-1].AsDict()
	content := final.Data["content"]
	switch {
	case content.IsString():
		final.Set("content", jinja.NewString(content.AsString()+continueTag))
		return content.AsString(), nil
	case content.IsList():
		items := content.AsList().Items
		for i := len(items) - 1; i >= 0; i-- {
			text, ok := dictGet(items[i], "text")
			if !ok {
				continue
			}
			if !text.IsString() {
				break
			}
			items[i].AsDict().Set("text", jinja.NewString(text.AsString()+continueTag))
			return text.AsString(), nil
		}
		return "", fmt.Errorf("%w: continue_final_message is set but the final message has no text to continue", ErrInvalidInput)
	}
	return "", fmt.Errorf("%w: continue_final_message is set but the final message has no content", ErrInvalidInput)
}

// cutAtContinueTag cuts the rendered conversation at the last sentinel.
// When the template kept the sentinel's trailing space the cut is exact;
// otherwise the template trimmed the message, and trailing whitespace
// before the sentinel goes too. Both the stripped final text and the
// stripped sentinel must appear in the output.
func cutAtContinueTag(rendered, final string) (string, error) {
	bare := strings.TrimFunc(continueTag, pyIsSpace)
	if !strings.Contains(rendered, strings.TrimFunc(final, pyIsSpace)) || !strings.Contains(rendered, bare) {
		return "", fmt.Errorf("%w: continue_final_message is set but the final message does not appear in the rendered chat", ErrInvalidInput)
	}
	loc := strings.LastIndex(rendered, bare)
	if strings.HasPrefix(rendered[loc:], continueTag) {
		return rendered[:loc], nil
	}
	return strings.TrimRightFunc(rendered[:loc], pyIsSpace), nil
}

// pyIsSpace is Python's str.isspace for one character: Unicode white
// space plus the ASCII separators U+001C to U+001F, which Python strips
// and Go's unicode.IsSpace does not.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}
