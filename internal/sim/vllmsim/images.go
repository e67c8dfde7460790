package vllmsim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/openai"
)

// Images. With Config.ImageTokens > 0 the simulated model is a vision
// model shaped like Qwen2-VL: an image content part (image_url, or the
// Responses API's input_image) renders as
//
//	<|vision_start|><|image_pad|><|vision_end|>
//
// and its processor expands the <|image_pad|> to ImageTokens copies, which
// are the item's placeholder span (vLLM's PlaceholderRange). /tokenize
// returns the expanded ids, as vLLM's does. The item's identifier is the
// part's "uuid" when the client gives one (vLLM uses it as the mm hash),
// else, for a base64 data: URL, vLLM's blake3 hash of the image's bytes
// with the model's path (Config.Model, its /v1/models root) as model id
// (kvindex.ImageBytesID). vLLM hashes an http(s) URL's image by the bytes
// it fetches; the simulator fetches nothing and hashes the URL instead, a
// stand-in no gateway can reproduce, as it cannot the real one. Blocks
// are hashed with the items' extra keys as vLLM does (kvindex.KeySpec).

// imageRender collects the images of a rendered chat, in prompt order.
type imageRender struct {
	model string // the model id hashed into an image's identifier
	ids   []string
}

// maxImageURLBytes bounds one image's URL (a data: URL holds the image).
const maxImageURLBytes = 32 << 20

// add writes p's placeholder text to sb and records its identifier.
func (r *imageRender) add(sb *strings.Builder, p contentPart) error {
	url, err := imageURL(p)
	if err != nil {
		return err
	}
	id := ""
	if p.UUID != nil {
		id = *p.UUID
	}
	if id == "" {
		id, err = r.hashImage(url)
		if err != nil {
			return err
		}
	}
	r.ids = append(r.ids, id)
	sb.WriteString("<|vision_start|><|image_pad|><|vision_end|>")
	return nil
}

// hashImage is the identifier of an image part without a uuid.
func (r *imageRender) hashImage(url string) (string, error) {
	size, data, ok := openai.DataURLBytes([]byte(url))
	if !ok {
		sum := sha256.Sum256([]byte(url))
		return "sim-" + hex.EncodeToString(sum[:16]), nil
	}
	id, err := kvindex.ImageBytesID(kvindex.MMHashBlake3, r.model, kvindex.ImageBytes{Size: size, R: data})
	if err != nil {
		return "", badRequest("image data URL: %v", err)
	}
	return id, nil
}

// imageURL is an image part's URL: {"url": s} (image_url) or s
// (input_image).
func imageURL(p contentPart) (string, error) {
	raw := bytes.TrimSpace(p.ImageURL)
	if len(raw) > maxImageURLBytes {
		return "", badRequest("image of %d bytes is too large", len(raw))
	}
	var url string
	if len(raw) > 0 && raw[0] == '{' {
		var obj struct {
			URL string `json:"url"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return "", badRequest("image_url: %v", err)
		}
		url = obj.URL
	} else if err := json.Unmarshal(raw, &url); err != nil {
		return "", badRequest("image_url must be an object or a string")
	}
	if url == "" {
		return "", badRequest("image part without a URL")
	}
	return url, nil
}

// expandImages replaces each <|image_pad|> of tokens by n copies and
// returns the items' spans with ids, in order. The pads must be exactly
// the rendered images (a client writing the placeholder text is refused,
// as the processor could not tell its images apart).
func expandImages(tokens []uint64, ids []string, n int) ([]uint64, []kvindex.MMItem, error) {
	if len(ids) == 0 {
		return tokens, nil, nil
	}
	out := make([]uint64, 0, len(tokens)+len(ids)*(n-1))
	items := make([]kvindex.MMItem, 0, len(ids))
	for _, t := range tokens {
		if t != tokImagePad {
			out = append(out, t)
			continue
		}
		if len(items) == len(ids) {
			return nil, nil, badRequest("the prompt has more image placeholders than images")
		}
		items = append(items, kvindex.MMItem{ID: ids[len(items)], Offset: len(out), Length: n})
		for range n {
			out = append(out, tokImagePad)
		}
	}
	if len(items) != len(ids) {
		return nil, nil, badRequest("%d images but %d placeholders", len(ids), len(items))
	}
	return out, items, nil
}
