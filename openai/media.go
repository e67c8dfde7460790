package openai

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
)

// MediaPart is one multimodal content part of a chat request's messages.
// vLLM turns each into a multimodal item whose identifier (the item's
// extra key in the blocks its placeholder tokens cover) is the part's
// "uuid" when the client gives one, else a hash of the media: for an
// image given as bytes, of those bytes as received (DataURLImage; see
// kvindex.ImageBytesID).
type MediaPart struct {
	// Modality is "image", "audio", "video" or "embeds" (precomputed
	// embeddings of any kind).
	Modality string
	// UUID is the part's "uuid", "" when absent or null.
	UUID string
	// url is an image part's URL, the raw JSON string ({"url": s} of
	// image_url, or input_image's s); nil for other parts.
	url json.RawMessage
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
		return MediaPart{Modality: m, UUID: uuid, url: imagePartURL(o, typ)}, ok
	}
	for _, t := range mediaTypeOrder {
		if o.get(t) != nil {
			return MediaPart{Modality: mediaModality[t], UUID: uuid, url: imagePartURL(o, t)}, true
		}
	}
	return MediaPart{}, false
}

// imagePartURL is the raw URL string of an image part of type typ, as
// vLLM's parsers read it from the "image_url" member: image_url's
// {"url": s}, input_image's s (either form is taken for either type: the
// engine refuses a mismatch, so its key does not matter); nil when absent.
func imagePartURL(o object, typ string) json.RawMessage {
	if typ != "image_url" && typ != "input_image" {
		return nil
	}
	v := o.get("image_url")
	if len(v) > 0 && v[0] == '{' {
		v = parseObject(v).get("url")
	}
	if len(v) == 0 || v[0] != '"' {
		return nil
	}
	return v
}

// DataURLImage returns the bytes of an image part's base64 data: URL as
// vLLM decodes them (DataURLBytes); ok is false for a part without such a
// URL: an http(s) URL, whose bytes only the engine fetches, or none.
func (p MediaPart) DataURLImage() (size int64, r io.Reader, ok bool) {
	s := []byte(p.url)
	if len(s) < 2 {
		return 0, nil, false
	}
	if bytes.IndexByte(s, '\\') >= 0 { // escaped: decode the JSON string
		var v string
		if json.Unmarshal(s, &v) != nil {
			return 0, nil, false
		}
		s = []byte(v)
	} else {
		s = s[1 : len(s)-1]
	}
	return DataURLBytes(s)
}

// DataURLBytes returns the bytes of a base64 data: URL as vLLM decodes
// them into an image's original bytes (MediaConnector's data URL loader:
// "data:<type>;base64,<data>", the data decoded strictly, padding
// required): their size and a reader decoding them as it is read, so an
// image of many MiB is hashed without a copy. ok is false for another
// URL, and for a data URL vLLM would refuse or that holds characters
// outside the base64 alphabet.
func DataURLBytes(url []byte) (size int64, r io.Reader, ok bool) {
	const scheme = "data:"
	if len(url) < len(scheme) || !bytes.EqualFold(url[:len(scheme)], []byte(scheme)) {
		return 0, nil, false
	}
	spec, data, found := bytes.Cut(url[len(scheme):], []byte{','})
	if !found {
		return 0, nil, false
	}
	if _, enc, _ := bytes.Cut(spec, []byte{';'}); string(enc) != "base64" {
		return 0, nil, false
	}
	size, ok = base64Size(data)
	if !ok {
		return 0, nil, false
	}
	return size, base64.NewDecoder(base64.StdEncoding, bytes.NewReader(data)), true
}

// base64Size is the decoded size of padded standard base64 data, ok false
// when data is not that (a length not a multiple of 4, a character
// outside the alphabet, padding anywhere but the last two places).
func base64Size(data []byte) (int64, bool) {
	if len(data)%4 != 0 {
		return 0, false
	}
	pad := 0
	for i, c := range data {
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/':
			if pad > 0 {
				return 0, false
			}
		case c == '=' && i >= len(data)-2:
			pad++
		default:
			return 0, false
		}
	}
	return int64(len(data)/4*3 - pad), true
}
