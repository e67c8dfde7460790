package localtok

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/llmgw/caddy-llmgw/chattemplate"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/tokenizer"
)

// ErrRemote is returned for a request that only the engine can tokenize
// (see the package doc): the caller asks the engine's /tokenize.
var ErrRemote = errors.New("localtok: the request needs the engine's own tokenizer")

// Model is one model's tokenizer directory, loaded. It is safe for
// concurrent use.
type Model struct {
	dir  string
	tok  *tokenizer.Tokenizer
	chat *chattemplate.Config // nil without tokenizer_config.json
}

// Load reads a Hugging Face tokenizer directory: tokenizer.json (required)
// and, when tokenizer_config.json is there, the chat templates it and the
// files beside it name (chattemplate.LoadDir). A directory without a chat
// template still tokenizes completions prompts; its chat requests go to
// the engine.
func Load(dir string) (*Model, error) {
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("loading tokenizer %s: %w", dir, err)
	}
	m := &Model{dir: dir, tok: tok}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		if m.chat, err = chattemplate.LoadDir(dir); err != nil {
			return nil, fmt.Errorf("loading chat template %s: %w", dir, err)
		}
		if m.tok, err = classPostProcessor(tok, m.chat); err != nil {
			return nil, fmt.Errorf("loading tokenizer %s: %w", dir, err)
		}
	}
	return m, nil
}

// rebuildsPostProcessor are the tokenizer classes (as tokenizer_config.json
// names them; AutoTokenizer loads the fast class either way, as vLLM does)
// whose constructor replaces tokenizer.json's post-processor with
// [bos] text [eos] from add_bos_token (default true) and add_eos_token
// (default false): transformers' LlamaTokenizerFast and GemmaTokenizerFast
// (update_post_processor). DeepSeek V3 ships a ByteLevel post-processor
// with tokenizer_class LlamaTokenizerFast, so its completions prompts get
// a BOS that tokenizer.json alone does not give.
var rebuildsPostProcessor = map[string]bool{
	"LlamaTokenizer": true, "LlamaTokenizerFast": true,
	"GemmaTokenizer": true, "GemmaTokenizerFast": true,
}

// classPostProcessor applies the tokenizer class's post-processor rule to
// tok, or returns tok as it is for other classes.
func classPostProcessor(tok *tokenizer.Tokenizer, cfg *chattemplate.Config) (*tokenizer.Tokenizer, error) {
	if !rebuildsPostProcessor[cfg.TokenizerClass] {
		return tok, nil
	}
	var bos, eos string
	if cfg.AddBOSToken == nil || *cfg.AddBOSToken {
		if bos = cfg.Special["bos_token"]; bos == "" {
			return nil, fmt.Errorf("%s with add_bos_token needs a bos_token", cfg.TokenizerClass)
		}
	}
	if cfg.AddEOSToken != nil && *cfg.AddEOSToken {
		if eos = cfg.Special["eos_token"]; eos == "" {
			return nil, fmt.Errorf("%s with add_eos_token needs an eos_token", cfg.TokenizerClass)
		}
	}
	return tok.WithBOSEOS(bos, eos)
}

// Dir is the directory the model was loaded from.
func (m *Model) Dir() string { return m.dir }

// Tokenize returns req's prompt token ids as vLLM computes them: a chat
// request's messages rendered with the model's template and encoded
// without special tokens (unless the request asks for them), a completions
// prompt encoded with them (unless it asks not to). ErrRemote means the
// engine must tokenize it; any other error is a request this model cannot
// render (the engine would most likely reject it too).
func (m *Model) Tokenize(req *openai.Request) ([]uint64, error) {
	return m.AppendTokenize(nil, req)
}

// AppendTokenize is Tokenize appending the ids to dst, so that a caller
// can reuse a buffer; on error dst is returned as it was.
func (m *Model) AppendTokenize(dst []uint64, req *openai.Request) ([]uint64, error) {
	switch {
	case len(req.Messages) > 0:
		return m.chatTokens(dst, req)
	case len(req.Prompt) > 0:
		return m.promptTokens(dst, req)
	}
	return dst, ErrRemote
}

// promptTokens encodes a completions prompt given as a string or a list of
// one string; token ids, and batches of prompts, are not rendered here.
func (m *Model) promptTokens(dst []uint64, req *openai.Request) ([]uint64, error) {
	var text string
	p := bytes.TrimSpace(req.Prompt)
	switch {
	case len(p) > 0 && p[0] == '"':
		if err := json.Unmarshal(p, &text); err != nil {
			return dst, fmt.Errorf("prompt: %w", err)
		}
	case len(p) > 0 && p[0] == '[':
		var list []string
		if err := json.Unmarshal(p, &list); err != nil || len(list) != 1 {
			return dst, ErrRemote
		}
		text = list[0]
	default:
		return dst, ErrRemote
	}
	addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	return m.encode(dst, text, addSpecial), nil
}

// chatTokens renders the messages with the model's template and encodes
// the text. vLLM encodes a rendered chat with add_special_tokens=false by
// default: the template writes BOS itself where the model wants it.
func (m *Model) chatTokens(dst []uint64, req *openai.Request) ([]uint64, error) {
	if m.chat == nil || req.ChatTemplate != "" {
		return dst, ErrRemote
	}
	ap := decodeArenas.Get().(*[]byte)
	in, err := chatInput(req, ap)
	if err != nil {
		return dst, err
	}
	text, err := m.chat.Render(in)
	if err == nil {
		// The decoded messages are dead once rendered (the text is the
		// template's own copy); an error may quote them, so its arena
		// is left to the collector.
		releaseArena(ap)
	}
	switch {
	case errors.Is(err, chattemplate.ErrNoTemplate):
		return dst, ErrRemote // the engine may be started with --chat-template
	case errors.Is(err, chattemplate.ErrUnsupportedContent):
		return dst, ErrRemote // images, audio: the engine's processor adds their tokens
	}
	if err != nil {
		return dst, fmt.Errorf("rendering the chat template: %w", err)
	}
	addSpecial := req.AddSpecialTokens != nil && *req.AddSpecialTokens
	return m.encode(dst, text, addSpecial), nil
}

// chatInput decodes the request's template inputs, with vLLM's defaults
// (add_generation_prompt true, continue_final_message false). Messages and
// tools keep their key order (chattemplate.DecodeJSON): a template's tojson
// writes a tool's schema in the request's order, as Python does.
//
// Strings that must be decoded (escapes, non-ASCII) go into *arena; the
// others are views of the request's body, which nothing changes.
func chatInput(req *openai.Request, arena *[]byte) (chattemplate.Input, error) {
	in := chattemplate.Input{AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt}
	in.ContinueFinalMessage = req.ContinueFinalMessage != nil && *req.ContinueFinalMessage
	var err error
	if in.Messages, err = decodeList(req.Messages, "messages", arena); err != nil {
		return in, err
	}
	if in.Tools, err = decodeList(req.Tools, "tools", arena); err != nil {
		return in, err
	}
	if present(req.ChatTemplateKwargs) {
		v, err := chattemplate.DecodeJSON(req.ChatTemplateKwargs)
		obj, ok := v.(chattemplate.Object)
		if err != nil || !ok {
			return in, fmt.Errorf("chat_template_kwargs must be an object")
		}
		in.Kwargs = obj.Values
	}
	return in, nil
}

// decodeList decodes a JSON array field, nil when absent or null.
func decodeList(raw []byte, field string, arena *[]byte) ([]any, error) {
	if !present(raw) {
		return nil, nil
	}
	v, err := chattemplate.DecodeJSONArena(raw, arena)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s must be a list", field)
	}
	return list, nil
}

// present reports whether a raw JSON field holds a value other than null.
func present(raw []byte) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

// decodeArenas is a documented pool of the buffers chatTokens decodes a
// request's strings into (chattemplate.DecodeJSONArena): a chat whose text
// has newlines or quotes decoded its whole history into fresh strings, an
// allocation the size of the conversation on every request. An arena
// goes back once the template has rendered; arenas grown beyond
// maxPooledArena bytes are dropped rather than kept.
var decodeArenas = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledArena = 4 << 20

func releaseArena(p *[]byte) {
	if cap(*p) > maxPooledArena {
		return
	}
	*p = (*p)[:0]
	decodeArenas.Put(p)
}
