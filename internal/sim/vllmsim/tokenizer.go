package vllmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The simulated tokenizer. It only has to be deterministic and prefix-stable
// (a text cut at a word boundary tokenizes to a prefix of the whole text's
// tokens), so it splits text into words (with their single leading space),
// single punctuation runes and whitespace runs, and maps each piece to an id
// by hashing it into a Qwen-sized vocabulary. Special tokens are recognised
// in text, as Hugging Face tokenizers do for chat templates.
const (
	vocabRegular   = 151643 // ids 0..151642 are ordinary pieces
	tokEndOfText   = 151643 // "<|endoftext|>"
	tokImStart     = 151644 // "<|im_start|>"
	tokImEnd       = 151645 // "<|im_end|>"
	tokBOS         = 151646 // "<|bos|>", added with add_special_tokens
	tokVisionStart = 151652 // "<|vision_start|>", before an image (Qwen2-VL's ids)
	tokVisionEnd   = 151653 // "<|vision_end|>", after it
	tokImagePad    = 151655 // "<|image_pad|>", an image's placeholder
	maxPieceBytes  = 12     // longer words are split in chunks, so token counts follow text length
	maxPromptBytes = 8 << 20
)

var specialTokens = [...]struct {
	text string
	id   uint64
}{
	{"<|endoftext|>", tokEndOfText},
	{"<|im_start|>", tokImStart},
	{"<|im_end|>", tokImEnd},
	{"<|bos|>", tokBOS},
	{"<|vision_start|>", tokVisionStart},
	{"<|vision_end|>", tokVisionEnd},
	{"<|image_pad|>", tokImagePad},
}

// pieceID maps a piece of text to a regular token id (FNV-1a, 64 bit).
func pieceID(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h % vocabRegular
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' }

// tokenize appends the token ids of text to dst. With addSpecial the BOS
// token comes first (vLLM's add_special_tokens).
func tokenize(dst []uint64, text string, addSpecial bool) []uint64 {
	if addSpecial {
		dst = append(dst, tokBOS)
	}
	i := 0
	for i < len(text) {
		if text[i] == '<' && i+1 < len(text) && text[i+1] == '|' {
			if id, n := matchSpecial(text[i:]); n > 0 {
				dst = append(dst, id)
				i += n
				continue
			}
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		switch {
		case r == ' ' && i+1 < len(text) && startsWord(text[i+1:]):
			// A single space belongs to the word after it.
			end := wordEnd(text, i+1)
			dst = appendChunks(dst, text[i:end])
			i = end
		case isWordRune(r):
			end := wordEnd(text, i)
			dst = appendChunks(dst, text[i:end])
			i = end
		case unicode.IsSpace(r):
			end := i + size
			for end < len(text) {
				r2, s2 := utf8.DecodeRuneInString(text[end:])
				if !unicode.IsSpace(r2) {
					break
				}
				// Leave a final ' ' for the word that follows it.
				if r2 == ' ' && end+1 < len(text) && startsWord(text[end+1:]) {
					break
				}
				end += s2
			}
			dst = appendChunks(dst, text[i:end])
			i = end
		default:
			dst = append(dst, pieceID(text[i:i+size]))
			i += size
		}
	}
	return dst
}

func matchSpecial(s string) (uint64, int) {
	for _, st := range specialTokens {
		if strings.HasPrefix(s, st.text) {
			return st.id, len(st.text)
		}
	}
	return 0, 0
}

func startsWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return isWordRune(r)
}

func wordEnd(text string, i int) int {
	for i < len(text) {
		r, size := utf8.DecodeRuneInString(text[i:])
		if !isWordRune(r) {
			break
		}
		i += size
	}
	return i
}

// appendChunks appends piece as tokens of at most maxPieceBytes bytes, cut at
// rune boundaries.
func appendChunks(dst []uint64, piece string) []uint64 {
	for len(piece) > maxPieceBytes {
		n := maxPieceBytes
		for n > 0 && !utf8.RuneStart(piece[n]) {
			n--
		}
		if n == 0 {
			n = maxPieceBytes
		}
		dst = append(dst, pieceID(piece[:n]))
		piece = piece[n:]
	}
	if piece != "" {
		dst = append(dst, pieceID(piece))
	}
	return dst
}

// outputWords is the vocabulary of generated text. Each entry is " word", a
// single token for tokenize, so generated text re-tokenizes to the generated ids.
var outputWords = [...]string{
	" the", " model", " cache", " token", " block", " engine", " request", " prefix",
	" gateway", " fleet", " route", " batch", " queue", " memory", " tensor", " layer",
	" answer", " question", " simple", " result", " value", " system", " event", " stream",
	" data", " time", " step", " prompt", " output", " input", " state", " graph",
	" and", " of", " to", " in", " is", " that", " for", " it",
	" with", " as", " on", " by", " this", " be", " are", " from",
	" at", " or", " an", " was", " we", " can", " which", " will",
	" not", " all", " but", " more", " one", " has", " new", " each",
}

// outputToken returns the k-th generated token and its text for a request
// whose prompt ids hash to seed: a fixed function, so outputs are reproducible.
func outputToken(seed uint64, k int) (uint64, string) {
	x := seed + uint64(k)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	w := outputWords[x%uint64(len(outputWords))]
	return pieceID(w), w
}

// promptSeed hashes prompt token ids into the seed of outputToken.
func promptSeed(ids []uint64) uint64 {
	h := uint64(14695981039346656037)
	for _, id := range ids {
		h ^= id
		h *= 1099511628211
	}
	return h
}

// chatMessage is one OpenAI chat message. Content is a string, null, or a
// list of parts of which only text parts are accepted (text-only model).
type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name,omitempty"`
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
	// ImageURL is an image_url part's {"url": ...} or an input_image
	// part's URL string; UUID the client's identifier for the item.
	ImageURL json.RawMessage `json:"image_url"`
	UUID     *string         `json:"uuid"`
}

// errBadRequest marks client errors (HTTP 400).
var errBadRequest = errors.New("bad request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

// messageText is a message's text, its parts joined by newlines. An image
// part is refused, unless img is not nil (a vision model): it then writes
// its placeholder and records the image.
func messageText(m chatMessage, img *imageRender) (string, error) {
	c := bytes.TrimSpace(m.Content)
	if len(c) == 0 || bytes.Equal(c, []byte("null")) {
		return "", nil
	}
	switch c[0] {
	case '"':
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return "", badRequest("message content: %v", err)
		}
		return s, nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(c, &parts); err != nil {
			return "", badRequest("message content parts: %v", err)
		}
		var sb strings.Builder
		for i, p := range parts {
			if i > 0 {
				sb.WriteByte('\n')
			}
			if p.Type == "text" {
				sb.WriteString(p.Text)
				continue
			}
			if img == nil || (p.Type != "image_url" && p.Type != "input_image") {
				return "", badRequest("content part type %q is not supported by this text-only model", p.Type)
			}
			if err := img.add(&sb, p); err != nil {
				return "", err
			}
		}
		return sb.String(), nil
	}
	return "", badRequest("message content must be a string or a list of parts")
}

// renderChat applies the simulator's fixed ChatML-style chat template:
//
//	[<|im_start|>system\n# Tools\n{tools}<|im_end|>\n]
//	<|im_start|>{role}\n{content}[{tool_calls}]<|im_end|>\n ...
//	[<|im_start|>assistant\n]
//
// continueFinal leaves the last message open (no end marker, no generation
// prompt), as vLLM's continue_final_message does.
func renderChat(msgs []chatMessage, tools json.RawMessage, addGenerationPrompt, continueFinal bool) (string, error) {
	return renderChatImages(msgs, chatOptions{tools: tools, addGenerationPrompt: addGenerationPrompt, continueFinal: continueFinal})
}

// chatOptions are renderChatImages' settings besides the messages.
type chatOptions struct {
	tools                              json.RawMessage
	addGenerationPrompt, continueFinal bool
	img                                *imageRender // nil for a text-only model
}

// renderChatImages is renderChat for a model that may take images.
func renderChatImages(msgs []chatMessage, o chatOptions) (string, error) {
	tools, addGenerationPrompt, continueFinal := o.tools, o.addGenerationPrompt, o.continueFinal
	if len(msgs) == 0 {
		return "", badRequest("messages must not be empty")
	}
	if continueFinal && addGenerationPrompt {
		return "", badRequest("continue_final_message and add_generation_prompt cannot both be true")
	}
	var sb strings.Builder
	if t := bytes.TrimSpace(tools); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		var compact bytes.Buffer
		if err := json.Compact(&compact, t); err != nil {
			return "", badRequest("tools: %v", err)
		}
		sb.WriteString("<|im_start|>system\n# Tools\n")
		sb.Write(compact.Bytes())
		sb.WriteString("<|im_end|>\n")
	}
	for i, m := range msgs {
		if m.Role == "" {
			return "", badRequest("message %d has no role", i)
		}
		text, err := messageText(m, o.img)
		if err != nil {
			return "", err
		}
		sb.WriteString("<|im_start|>")
		sb.WriteString(m.Role)
		sb.WriteByte('\n')
		sb.WriteString(text)
		if tc := bytes.TrimSpace(m.ToolCalls); len(tc) > 0 && !bytes.Equal(tc, []byte("null")) {
			var compact bytes.Buffer
			if err := json.Compact(&compact, tc); err != nil {
				return "", badRequest("tool_calls: %v", err)
			}
			sb.Write(compact.Bytes())
		}
		if continueFinal && i == len(msgs)-1 {
			break
		}
		sb.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		sb.WriteString("<|im_start|>assistant\n")
	}
	if sb.Len() > maxPromptBytes {
		return "", badRequest("prompt of %d bytes is too long", sb.Len())
	}
	return sb.String(), nil
}
