package tokenizer

import "strings"

// Tokenizer encodes text to token ids and back as described by a Hugging
// Face tokenizer.json. It is immutable after Parse apart from its internal
// word cache, and safe for concurrent use.
type Tokenizer struct {
	added      *addedVocab
	normalizer normalizer   // nil: text is used as it is
	pre        preTokenizer // nil: each section is one piece
	// rawPieces says pieces reach the model as plain text standing for
	// their byte-level form (see byteLevelPre).
	rawPieces bool
	model     *bpeModel
	template  template
	decoder   decoder // nil: tokens are joined with spaces, as HF does
	// sections caches the ids of long stretches between added tokens
	// (section_cache.go); nil disables it.
	sections *sectionCache
	// prefixes caches the ids of long sections up to checkpoints, for
	// sections that share a prefix with a stored one (prefix_cache.go);
	// nil when the pre-tokenizer cannot resume mid-text, or disabled.
	prefixes *prefixCache
}

// Encode returns the ids of text. With addSpecialTokens the post-processor's
// template is applied (a BOS token, say); without, only the text's own
// tokens are returned. Added tokens that occur in text, special or not, are
// always encoded as themselves. Invalid UTF-8 is read as U+FFFD per bad byte.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []int {
	return t.AppendEncode(make([]int, 0, len(text)/3+4), text, addSpecialTokens)
}

// AppendEncode is Encode appending to dst, so a caller can reuse a buffer.
func (t *Tokenizer) AppendEncode(dst []int, text string, addSpecialTokens bool) []int {
	text = validUTF8(text)
	sc := getScratch()
	defer putScratch(sc)
	if !addSpecialTokens {
		return t.appendText(dst, text, sc)
	}
	return t.template.apply(dst, func(d []int) []int { return t.appendText(d, text, sc) })
}

// appendText encodes text without post-processing: first the added tokens
// found in the raw text, then each stretch between them.
func (t *Tokenizer) appendText(dst []int, text string, sc *scratch) []int {
	secs := t.added.split(sc.sections[:0], text, t.added.raw)
	for _, sec := range secs {
		if sec.token >= 0 {
			dst = append(dst, int(t.added.tokens[sec.token].id))
			continue
		}
		dst = t.appendCachedSection(dst, text[sec.start:sec.end], sec.start == 0, sc)
	}
	clear(secs)
	sc.sections = secs[:0]
	return dst
}

// appendSection normalizes a stretch of raw text, splits out the
// normalized added tokens in it and encodes the rest.
func (t *Tokenizer) appendSection(dst []int, s string, first bool, sc *scratch) []int {
	if t.normalizer != nil {
		s = t.normalizer.normalize(s)
	}
	if s == "" {
		return dst
	}
	if len(t.added.norm.term) == 1 {
		return t.appendNormalized(dst, s, first, sc)
	}
	subs := t.added.split(sc.subs[:0], s, t.added.norm)
	for _, sub := range subs {
		if sub.token >= 0 {
			dst = append(dst, int(t.added.tokens[sub.token].id))
			continue
		}
		dst = t.appendNormalized(dst, s[sub.start:sub.end], first && sub.start == 0, sc)
	}
	sc.subs = subs[:0]
	return dst
}

// appendNormalized pre-tokenizes normalized text and runs the model on
// each piece.
func (t *Tokenizer) appendNormalized(dst []int, s string, first bool, sc *scratch) []int {
	if t.pre == nil {
		return t.model.appendWord(dst, s, t.rawPieces, sc)
	}
	if t.prefixes != nil && len(s) >= minPrefixBytes {
		return t.appendPrefixed(dst, s, first, sc)
	}
	pieces := t.pre.appendPieces(sc.takePieces(), s, first, sc)
	for _, p := range pieces {
		dst = t.model.appendWord(dst, p, t.rawPieces, sc)
	}
	sc.givePieces(pieces)
	return dst
}

// Decode returns the text of ids. Ids that name no token are skipped; with
// skipSpecialTokens so are special added tokens. Unlike Python's
// transformers, no clean_up_tokenization_spaces pass is applied: this is
// the tokenizers library's own decode.
func (t *Tokenizer) Decode(ids []int, skipSpecialTokens bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if skipSpecialTokens && t.isSpecial(id) {
			continue
		}
		if tok, ok := t.IDToToken(id); ok {
			tokens = append(tokens, tok)
		}
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.decodeChain(tokens), "")
}

func (t *Tokenizer) isSpecial(id int) bool {
	if id < 0 || id >= maxTokenID {
		return false
	}
	idx, ok := t.added.byID[int32(id)]
	return ok && t.added.tokens[idx].special
}

// TokenToID returns the id of a token of the vocabulary or an added token
// (added tokens take precedence, as in HF).
func (t *Tokenizer) TokenToID(token string) (int, bool) {
	if idx, ok := t.added.byContent[token]; ok {
		return int(t.added.tokens[idx].id), true
	}
	if id, ok := t.model.vocab.get(token); ok {
		return int(id), true
	}
	return 0, false
}

// IDToToken returns the token with the given id, looking at added tokens
// first and then the vocabulary.
func (t *Tokenizer) IDToToken(id int) (string, bool) {
	if id < 0 || id >= maxTokenID {
		return "", false
	}
	if idx, ok := t.added.byID[int32(id)]; ok {
		return t.added.tokens[idx].content, true
	}
	if tok := t.model.vocab.idToken(id); tok != "" {
		return tok, true
	}
	return "", false
}

// VocabSize returns one more than the largest id in use, counting added
// tokens: the size an id table for this tokenizer needs.
func (t *Tokenizer) VocabSize() int {
	n := t.model.vocab.ids()
	for _, tok := range t.added.tokens {
		n = max(n, int(tok.id)+1)
	}
	return n
}
