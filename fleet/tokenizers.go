package fleet

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/localtok"
	"github.com/llmgw/caddy-llmgw/openai"
)

// TokenizerConfig names one model's tokenizer: a local Hugging Face
// tokenizer directory, or the engines' /tokenize.
type TokenizerConfig struct {
	// The model name requests carry in "model" (vLLM's served model
	// name), or "*" for every model without an entry of its own.
	// Required.
	Model string `json:"model"`

	// A directory holding the model's tokenizer.json and
	// tokenizer_config.json (optionally chat_template.jinja), as
	// published with the model; or "remote" to ask the engines' /tokenize,
	// which is what models without an entry get. Required.
	Dir string `json:"dir"`

	// ImageTokenID is the token id the model's processor expands an
	// image into (Qwen2-VL's <|image_pad|> 151655, LLaVA's <image>): the
	// maximal runs of it in the engine's tokenized prompt are the images'
	// placeholder spans, which vLLM hashes an image's identifier into.
	// With it, an image content part carrying a "uuid" is keyed exactly
	// and a repeated image prompt matches past the image (see
	// fleet/mmkeys.go for the models it fits). Default: 0, none: the
	// precise match of an image prompt stops at its first image.
	ImageTokenID uint64 `json:"image_token_id,omitempty"`

	// ImageHashModel is the model id vLLM hashes into the identifier of
	// an image part without a "uuid" given as a base64 data: URL: the
	// engine's --model (its /v1/models "root"), not a --served-model-name
	// nor a LoRA adapter's name. Used with ImageTokenID. Default: the
	// root the engines' /v1/models lists for the request's model (its
	// base model's for an adapter), else the request's "model".
	ImageHashModel string `json:"image_hash_model,omitempty"`

	// ImageHashAlgorithm is the engines' multimodal hash algorithm
	// (vLLM's --mm-hasher-algorithm): "blake3", "sha256" or "sha512".
	// Default: "blake3", vLLM's.
	ImageHashAlgorithm string `json:"image_hash_algorithm,omitempty"`
}

// RemoteTokenizer is TokenizerConfig.Dir's value for the engines'
// /tokenize.
const RemoteTokenizer = "remote"

// validateTokenizers checks the tokenizer entries and the check settings.
func (c *Config) validateTokenizers() error {
	seen := map[string]bool{}
	for i, t := range c.Tokenizers {
		switch {
		case t == nil || t.Model == "":
			return fmt.Errorf("tokenizer %d: model name is required", i)
		case t.Dir == "":
			return fmt.Errorf("tokenizer for model %q: a directory or %q is required", t.Model, RemoteTokenizer)
		case seen[t.Model]:
			return fmt.Errorf("tokenizer for model %q listed twice", t.Model)
		}
		if err := kvindex.ValidMMHashAlgorithm(t.ImageHashAlgorithm); err != nil {
			return fmt.Errorf("tokenizer for model %q: %w", t.Model, err)
		}
		seen[t.Model] = true
	}
	if s := c.TokenizerCheckSample; s != nil && (*s < 0 || *s > 1) {
		return fmt.Errorf("tokenizer check sample %g must be between 0 and 1", *s)
	}
	if l := c.TokenizerMismatchLimit; l != nil && *l < 0 {
		return fmt.Errorf("tokenizer mismatch limit must not be negative, got %d", *l)
	}
	return nil
}

// LoadTokenizers loads the local tokenizers c names (a directory whose
// files are unchanged since the last config is not parsed again), so that
// a missing or malformed directory fails the config before it starts.
func (f *Fleet) LoadTokenizers(c *Config) error {
	models := make(map[string]*localtok.Model)
	for _, t := range c.Tokenizers {
		if t == nil || t.Dir == RemoteTokenizer {
			continue
		}
		m, err := f.tokModels.Load(t.Dir)
		if err != nil {
			return fmt.Errorf("tokenizer for model %q: %w", t.Model, err)
		}
		models[t.Model] = m
	}
	c.models = models
	return nil
}

// applyTokenizers replaces the set of local tokenizers with c's. The
// checks' counters carry over; a model that fell back to remote
// tokenization tries its local tokenizer again.
func (f *Fleet) applyTokenizers(c Config) {
	if c.models == nil {
		if err := f.LoadTokenizers(&c); err != nil {
			f.logger.Error("local tokenizers not loaded; their models use the engines' /tokenize", zap.Error(err))
		}
	}
	f.noteTokenizerNames(c.Tokenizers)
	dirs := make([]string, 0, len(c.models))
	for _, m := range c.models {
		dirs = append(dirs, m.Dir())
	}
	f.tokModels.Retain(dirs)
	var next *localtok.Set
	if len(c.models) > 0 {
		o := localtok.Options{Sample: localtok.DefaultSample, MismatchLimit: localtok.DefaultMismatchLimit,
			Logger: f.logger.Named("tokenizer")}
		if c.TokenizerCheckSample != nil {
			o.Sample = *c.TokenizerCheckSample
		}
		if c.TokenizerMismatchLimit != nil {
			o.MismatchLimit = *c.TokenizerMismatchLimit
		}
		next = localtok.NewSet(c.models, o, f.local.Load())
	}
	if old := f.local.Swap(next); old != nil {
		old.Close()
	}
}

// TokenizerStats reports what each local tokenizer did, nil when none is
// configured.
func (f *Fleet) TokenizerStats() []localtok.Stats {
	if s := f.local.Load(); s != nil {
		return s.Stats()
	}
	return nil
}

// localTokens tokenizes req with its model's local tokenizer, when it has
// one that can; ok false sends it to the engines' /tokenize. remote is
// the /tokenize call a sampled check compares with. The ids are in a
// pooled buffer: the caller hands it back with releaseTokens once the
// decision is made.
func (f *Fleet) localTokens(req *openai.Request, remote func(context.Context) ([]uint64, error)) (tokens []uint64, ok bool) {
	s := f.local.Load()
	if s == nil {
		return nil, false
	}
	bp := tokenBuffers.Get().(*[]uint64)
	tokens, ok = s.AppendTokenize((*bp)[:0], req, remote)
	if !ok {
		*bp = tokens[:0]
		tokenBuffers.Put(bp)
		return nil, false
	}
	return tokens, true
}

// tokenBuffers is a documented pool of the buffers local tokenizing
// writes a prompt's ids into. The ids are needed only while a decision is
// made (its block keys are computed from them, and kept); a fresh 64 KiB
// per 8k-token request was the largest allocation on the local path.
// Buffers beyond maxPooledTokens ids are dropped.
var tokenBuffers = sync.Pool{New: func() any { return new([]uint64) }}

const maxPooledTokens = 1 << 17

// releaseTokens hands back the buffer of ids localTokens gave (tr.Local)
// or a /tokenize answer's (tr.remote, when they were this request's
// alone); other ids (the caller's, the tokenize cache's) are left alone.
// It returns tr without its hold on them: it must be called once.
func releaseTokens(tokens []uint64, tr TokenizeResult) TokenizeResult {
	tr.remote.Release()
	if !tr.Local || tokens == nil || cap(tokens) > maxPooledTokens {
		return tr
	}
	tokens = tokens[:0]
	tokenBuffers.Put(&tokens)
	return tr
}
