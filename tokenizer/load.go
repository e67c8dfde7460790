package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// MaxFileSize is the largest tokenizer.json LoadFile reads. The biggest
// files in use (Gemma 3's, with a 262k vocabulary) are around 33 MiB.
const MaxFileSize = 128 << 20

// maxTokenID bounds ids so that a malformed file cannot make us allocate an
// id table of arbitrary size.
const maxTokenID = 1 << 24

// LoadFile reads and parses a tokenizer.json file of at most MaxFileSize
// bytes.
func LoadFile(path string) (*Tokenizer, error) {
	return loadFile(path, MaxFileSize)
}

// loadFile is LoadFile with the size limit as a parameter, for tests.
func loadFile(path string, limit int64) (*Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: reading %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("tokenizer: %s is larger than %d bytes", path, limit)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return t, nil
}

// fileJSON is the part of tokenizer.json that encoding needs. truncation
// and padding are ignored: they shape batches, not ids.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         *modelJSON       `json:"model"`
}

type addedTokenJSON struct {
	ID         int64  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

// componentJSON holds the fields of every normalizer, pre-tokenizer,
// post-processor and decoder we support; each type reads the ones it has.
type componentJSON struct {
	Type          string            `json:"type"`
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`

	Pattern  *patternJSON `json:"pattern"`
	Content  *string      `json:"content"`
	Behavior string       `json:"behavior"`
	Invert   bool         `json:"invert"`
	Prepend  string       `json:"prepend"`

	StripLeft  bool `json:"strip_left"`
	StripRight bool `json:"strip_right"`
	Start      int  `json:"start"`
	Stop       int  `json:"stop"`

	AddPrefixSpace   *bool   `json:"add_prefix_space"`
	UseRegex         *bool   `json:"use_regex"`
	Replacement      *string `json:"replacement"`
	PrependScheme    string  `json:"prepend_scheme"`
	Split            *bool   `json:"split"`
	IndividualDigits bool    `json:"individual_digits"`
	Delimiter        string  `json:"delimiter"`
	Suffix           *string `json:"suffix"`

	Single        []templatePieceJSON          `json:"single"`
	SpecialTokens map[string]specialTokensJSON `json:"special_tokens"`
	Cls           []json.RawMessage            `json:"cls"`
	Sep           []json.RawMessage            `json:"sep"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type templatePieceJSON struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type specialTokensJSON struct {
	IDs []int64 `json:"ids"`
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// decodeComponent decodes one component; kind names it in errors.
func decodeComponent(raw json.RawMessage, kind string) (*componentJSON, error) {
	var c componentJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", kind, err)
	}
	return &c, nil
}

func unsupported(kind, typ string) error {
	return fmt.Errorf("tokenizer: %s %q is not supported", kind, typ)
}

// Parse builds a Tokenizer from the contents of a tokenizer.json file.
func Parse(data []byte) (*Tokenizer, error) {
	initClasses()
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: parsing tokenizer.json: %w", err)
	}
	if f.Model == nil {
		return nil, errors.New("tokenizer: tokenizer.json has no model")
	}
	t := &Tokenizer{sections: newSectionCache()}
	var err error
	if t.model, err = buildModel(f.Model); err != nil {
		return nil, err
	}
	if t.normalizer, err = buildNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = buildPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	t.rawPieces = markRawByteLevel(t.pre)
	if resumablePre(t.pre) {
		t.prefixes = newPrefixCache()
	}
	if t.added, err = buildAdded(f.AddedTokens, t.normalizer); err != nil {
		return nil, err
	}
	if t.template, err = buildPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if t.decoder, err = buildDecoder(f.Decoder, t.added); err != nil {
		return nil, err
	}
	return t, nil
}
