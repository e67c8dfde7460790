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

// mediaSuffixes end every media part type's name, quoted: messages
// without any of them have no media part. They start with '_', rare in
// JSON, so each scan skips fast; the quoted names start with '"', which
// the scan stops at in every string (40 times slower on a long text chat,
// BenchmarkMediaParts).
var mediaSuffixes = [...][]byte{[]byte(`_url"`), []byte(`_image"`), []byte(`_audio"`), []byte(`_embeds"`), []byte(`_pil"`)}

// mayHaveMedia is a quick test that spares a text-only request the walk:
// every media part names its type in a member or a "type" value.
func mayHaveMedia(messages []byte) bool {
	for _, t := range mediaSuffixes {
		if bytes.Contains(messages, t) {
			return true
		}
	}
	return false
}

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
