package openai

import (
	"bytes"
	"encoding/json"
)

// MediaPart is one multimodal content part of a chat request's messages.
// vLLM turns each into a multimodal item whose identifier (the item's
// extra key in the blocks its placeholder tokens cover) is the part's
// "uuid" when the client gives one, else a hash of the decoded media
// (vllm/multimodal/processing.py _hash_mm_items), which only the engine
// can compute.
type MediaPart struct {
	// Modality is "image", "audio", "video" or "embeds" (precomputed
	// embeddings of any kind).
	Modality string
	// UUID is the part's "uuid", "" when absent or null.
	UUID string
}

// mediaModality maps the part types vLLM parses as media (MM_PARSER_MAP
// in vllm/entrypoints/chat_utils.py) to their modality.
var mediaModality = map[string]string{
	"image_url": "image", "input_image": "image", "image_pil": "image",
	"audio_url": "audio", "input_audio": "audio",
	"video_url":    "video",
	"image_embeds": "embeds", "audio_embeds": "embeds", "prompt_embeds": "embeds",
}

// mediaTypeOrder is the order vLLM looks for a bare media member in a part
// without a usable "type" (or with a uuid).
var mediaTypeOrder = [...]string{
	"image_url", "input_image", "image_embeds", "image_pil", "audio_url",
	"input_audio", "audio_embeds", "video_url", "prompt_embeds",
}

// MediaParts returns the media parts of a chat request's raw "messages"
// array in prompt order, nil when it has none. The array is one a parser
// of this package validated; what is not a message or part is skipped (the
// engine answers for it).
func MediaParts(messages json.RawMessage) []MediaPart {
	if !mayHaveMedia(messages) {
		return nil
	}
	var out []MediaPart
	for _, m := range parseElems(bytes.TrimSpace(messages)) {
		if len(m) == 0 || m[0] != '{' {
			continue
		}
		content := parseObject(m).get("content")
		if len(content) == 0 || content[0] != '[' {
			continue
		}
		for _, p := range parseElems(content) {
			if mp, ok := mediaPart(p); ok {
				out = append(out, mp)
			}
		}
	}
	return out
}

// mediaSuffixes end every media part type's name, quoted, after its
// '_': messages without any of them have no media part.
var mediaSuffixes = [...]string{`url"`, `image"`, `audio"`, `embeds"`, `pil"`}

// mayHaveMedia is a quick test that spares most text-only requests the
// walk: every media part names its type in a member or a "type" value,
// whose name has a '_' before one of mediaSuffixes. It skips from '_' to
// '_'; past maxUnderscores of them (code is full of '_') it answers maybe,
// and the walk decides. BenchmarkMediaParts: a 1 MiB prose chat takes
// tens of microseconds, the walk a few hundred, whatever the text.
func mayHaveMedia(messages []byte) bool {
	b := messages
	for range maxUnderscores {
		i := bytes.IndexByte(b, '_')
		if i < 0 {
			return false
		}
		b = b[i+1:]
		for _, t := range mediaSuffixes {
			if len(b) >= len(t) && string(b[:len(t)]) == t {
				return true
			}
		}
	}
	return true
}

// maxUnderscores bounds mayHaveMedia's work on text full of '_'.
const maxUnderscores = 64

// mediaPart reads one content part, as vLLM's
// _parse_chat_message_content_part tells media from text: by "type"
// unless a uuid is given or the type is missing, then by which media
// member the part has.
func mediaPart(p []byte) (MediaPart, bool) {
	if len(p) == 0 || p[0] != '{' {
		return MediaPart{}, false
	}
	o := parseObject(p)
	uuid, _ := decodeString(o.get("uuid"))
	typ, typed := decodeString(o.get("type"))
	if typed && isNull(o.get("uuid")) {
		m, ok := mediaModality[typ]
		return MediaPart{Modality: m, UUID: uuid}, ok
	}
	for _, t := range mediaTypeOrder {
		if o.get(t) != nil {
			return MediaPart{Modality: mediaModality[t], UUID: uuid}, true
		}
	}
	return MediaPart{}, false
}
