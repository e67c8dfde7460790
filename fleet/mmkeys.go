package fleet

import (
	"fmt"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/localtok"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Multimodal block keys. vLLM hashes into each block the (identifier,
// offset) of every multimodal item whose placeholder tokens the block
// covers (kvindex.KeySpec.BlockExtraKeys). A prompt's block keys past its
// first image are thus exact only when the gateway knows both:
//
//   - where each image's placeholders are. The engine's /tokenize (which
//     image prompts use, as the model's processor expands the image)
//     returns the expanded ids; the image's span is then the maximal run of
//     the model's image placeholder id (TokenizerConfig.ImageTokenID), one
//     run per image part in prompt order. That is the span vLLM records
//     for models whose processor replaces the image token by N copies of
//     itself (Qwen2-VL, Qwen2.5-VL, LLaVA-1.5 and -NeXT); models whose
//     span also covers other tokens (break or boundary tokens counted in
//     the span) do not follow it.
//   - each image's identifier: the content part's "uuid", which vLLM takes
//     as the item's hash (chat_utils.py at 001eadc passes it per item;
//     processing/inputs.py's get_mm_hashes uses it verbatim when the
//     request has no mm_processor_kwargs or media_io_kwargs, and hashes it
//     with them otherwise, so such a request is keyed wrongly: its blocks
//     past the image just miss). Without one, an image given as a base64
//     data: URL is keyed by vLLM's hash of its decoded bytes with the
//     engine's model id (kvindex.ImageBytesID; the model id is the
//     engines' /v1/models root of the model unless TokenizerConfig says,
//     the hash algorithm comes from TokenizerConfig). An http(s) URL stays unkeyed:
//     vLLM hashes the bytes it fetches, and the gateway must not fetch
//     them.
//
// mmPrompt is a request's media parts and how its model keys images.
type mmPrompt struct {
	parts []openai.MediaPart
	imageKeying
	// ids are the parts' identifiers (identify), nil when unkeyed says
	// why they are not known.
	ids     []string
	unkeyed string
}

// imageKeying is how a model's images enter its block keys.
type imageKeying struct {
	imageToken uint64 // 0: none configured
	// hashModel and hashAlgorithm are kvindex.ImageBytesID's: "" for the
	// engines' root of the request's model (imageHashModel) and blake3.
	hashModel, hashAlgorithm string
}

// mmKeys is how a prompt's media enter its block keys.
type mmKeys struct {
	media  bool             // the prompt has media parts
	items  []kvindex.MMItem // their spans and identifiers, when keyed
	reason string           // why they are not keyed ("" when keyed)
}

// keyed reports whether the prompt's keys past its media are exact.
func (m mmKeys) keyed() bool { return m.media && m.reason == "" }

// describe is the explain API's word for m: "" for a text prompt.
func (m mmKeys) describe() string {
	switch {
	case !m.media:
		return ""
	case m.keyed():
		return fmt.Sprintf("keyed: %d images", len(m.items))
	}
	return "matched up to the first media item: " + m.reason
}

// mmPromptOf is req's media and its model's image placeholder id.
func (f *Fleet) mmPromptOf(req *openai.Request) mmPrompt {
	if req == nil {
		return mmPrompt{}
	}
	model := req.Model
	p := mmPrompt{parts: openai.MediaParts(req.Messages)}
	if len(p.parts) == 0 {
		return p
	}
	if m := f.imageTokens.Load(); m != nil {
		k, ok := (*m)[model]
		if !ok {
			k = (*m)[localtok.AnyModel]
		}
		p.imageKeying = k
	}
	if p.hashModel == "" && p.imageToken != 0 {
		p.hashModel = f.imageHashModel(model)
	}
	p.identify()
	return p
}

// imageHashModel is the model id vLLM hashes into the identifier of an
// image without a uuid in a request for model: the engine's --model, which
// its /v1/models reports as the model's root (the parent's root for an
// adapter, which runs on its base model); model itself when no engine has
// listed it.
func (f *Fleet) imageHashModel(model string) string {
	if served, ok := f.ResolveAlias(model); ok {
		model = served
	}
	for _, e := range f.registry.Engines() {
		s := e.Models()
		if s.Configured {
			continue // configured names: no root
		}
		if root := rootOf(s.List, model); root != "" {
			return root
		}
	}
	return model
}

// rootOf is the root of model in an engine's model list, its parent's for
// an adapter; "" when the list does not say.
func rootOf(list []upstreams.ServedModel, model string) string {
	for _, m := range list {
		if m.ID != model {
			continue
		}
		if m.Parent == "" {
			return m.Root
		}
		for _, b := range list {
			if b.ID == m.Parent && b.Parent == "" {
				return b.Root
			}
		}
		return ""
	}
	return ""
}

// identify sets p.ids to the identifiers vLLM gives p's parts, or
// p.unkeyed to why they are not known. It hashes images without a uuid
// (milliseconds for MiBs), so it runs once per request, and only when
// the model's image token is configured.
func (p *mmPrompt) identify() {
	if len(p.parts) == 0 {
		return
	}
	ids := make([]string, 0, len(p.parts))
	for _, part := range p.parts {
		if part.Modality != "image" {
			p.unkeyed = part.Modality + " items are not keyed"
			return
		}
		if part.UUID != "" {
			ids = append(ids, part.UUID)
			continue
		}
		if p.imageToken == 0 {
			continue // not hashed: the prompt is unkeyed anyway
		}
		size, r, ok := part.DataURLImage()
		if !ok {
			p.unkeyed = "an image without a uuid and not a base64 data: URL (the engine hashes the bytes it fetches)"
			return
		}
		id, err := kvindex.ImageBytesID(p.hashAlgorithm, p.hashModel, kvindex.ImageBytes{Size: size, R: r})
		if err != nil {
			p.unkeyed = "an image data: URL that does not decode: " + err.Error()
			return
		}
		ids = append(ids, id)
	}
	if p.imageToken == 0 {
		p.unkeyed = "no image_token_id configured for the model"
		return
	}
	p.ids = ids
}

// promptMedia is the media of q's prompt, tokenized as tr says: found
// while tokenizing remotely, else none (a local tokenizer refuses media,
// and a prompt of ids has none), unless the caller gave the tokens.
func (f *Fleet) promptMedia(q Query, tr TokenizeResult) mmPrompt {
	switch {
	case tr.Called:
		return tr.media
	case q.Tokens != nil:
		return f.mmPromptOf(q.Request)
	}
	return mmPrompt{}
}

// keys finds the items of a prompt of tokens (expanded by the engine).
func (p mmPrompt) keys(tokens []uint64) mmKeys {
	if len(p.parts) == 0 {
		return mmKeys{}
	}
	m := mmKeys{media: true}
	if p.ids == nil {
		m.reason = p.unkeyed
		return m
	}
	items := make([]kvindex.MMItem, 0, len(p.parts))
	for i := 0; i < len(tokens); i++ {
		if tokens[i] != p.imageToken {
			continue
		}
		start := i
		for i < len(tokens) && tokens[i] == p.imageToken {
			i++
		}
		if len(items) == len(p.parts) {
			m.reason = "more image placeholder runs than images"
			return m
		}
		items = append(items, kvindex.MMItem{ID: p.ids[len(items)], Offset: start, Length: i - start})
	}
	if len(items) != len(p.parts) {
		m.reason = fmt.Sprintf("%d image placeholder runs for %d images", len(items), len(p.parts))
		return m
	}
	m.items = items
	return m
}

// mmBlockKeys is keyKeep.blockKeys for a prompt with media: hashed whole
// and not kept (its keys depend on identifiers the kept prompts' id
// comparison does not see). Unkeyed media are hashed as text (see above).
// spec names the block size, adapter and salt; its MM is mm's items.
func (k *keyKeep) mmBlockKeys(tokens []uint64, spec kvindex.KeySpec, mm mmKeys) []uint64 {
	if !mm.media {
		return k.blockKeys(tokens, spec.BlockSize, spec.LoRAName, spec.CacheSalt)
	}
	if spec.BlockSize <= 0 {
		return nil
	}
	spec.MM = mm.items
	keys, err := kvindex.RequestKeys(make([]uint64, 0, len(tokens)/spec.BlockSize), tokens, spec)
	if err != nil {
		return nil
	}
	return keys
}

// imageKeyings maps the models of cfgs to how their images are keyed.
func imageKeyings(cfgs []*TokenizerConfig) map[string]imageKeying {
	out := make(map[string]imageKeying)
	for _, c := range cfgs {
		if c != nil && c.ImageTokenID > 0 {
			out[c.Model] = imageKeying{imageToken: c.ImageTokenID, hashModel: c.ImageHashModel,
				hashAlgorithm: c.ImageHashAlgorithm}
		}
	}
	return out
}
