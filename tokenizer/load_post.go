package tokenizer

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// buildAdded indexes added_tokens. Normalized tokens are searched for by
// their normalized content, since that is what the normalized text holds.
func buildAdded(list []addedTokenJSON, n normalizer) (*addedVocab, error) {
	av := &addedVocab{
		byContent: make(map[string]int32, len(list)),
		byID:      make(map[int32]int32, len(list)),
		raw:       newTokenTrie(),
		norm:      newTokenTrie(),
	}
	for i, a := range list {
		if a.ID < 0 || a.ID >= maxTokenID {
			return nil, fmt.Errorf("tokenizer: added token %q has id %d, outside [0, %d)", a.Content, a.ID, maxTokenID)
		}
		if a.Content == "" {
			return nil, fmt.Errorf("tokenizer: added token %d has empty content", a.ID)
		}
		t := addedToken{
			id: int32(a.ID), content: a.Content, special: a.Special,
			lstrip: a.LStrip, rstrip: a.RStrip, singleWord: a.SingleWord,
			normalized: boolOr(a.Normalized, !a.Special),
		}
		idx := int32(i)
		av.tokens = append(av.tokens, t)
		if _, dup := av.byContent[t.content]; !dup {
			av.byContent[t.content] = idx
		}
		av.byID[t.id] = idx
		if !t.normalized {
			av.raw.add(t.content, idx)
			continue
		}
		content := t.content
		if n != nil {
			content = n.normalize(content)
		}
		av.norm.add(content, idx)
		if _, dup := av.byContent[content]; !dup {
			av.byContent[content] = idx
		}
	}
	return av, nil
}

// buildPostProcessor returns the template for addSpecialTokens=true.
func buildPostProcessor(raw json.RawMessage) (template, error) {
	if isNull(raw) {
		return identityTemplate, nil
	}
	c, err := decodeComponent(raw, "post_processor")
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return identityTemplate, nil
	case "TemplateProcessing":
		return buildTemplate(c)
	case "BertProcessing", "RobertaProcessing":
		cls, err := tokenPairID(c.Cls, "cls")
		if err != nil {
			return nil, err
		}
		sep, err := tokenPairID(c.Sep, "sep")
		if err != nil {
			return nil, err
		}
		return template{{ids: []int{cls}}, {seq: true}, {ids: []int{sep}}}, nil
	case "Sequence":
		t := identityTemplate
		for _, sub := range c.Processors {
			st, err := buildPostProcessor(sub)
			if err != nil {
				return nil, err
			}
			t = st.compose(t)
		}
		return t, nil
	}
	return nil, unsupported("post_processor", c.Type)
}

// buildTemplate reads TemplateProcessing's single template. Special tokens
// take their ids from the processor's special_tokens table, as HF does.
func buildTemplate(c *componentJSON) (template, error) {
	var t template
	for _, p := range c.Single {
		switch {
		case p.Sequence != nil:
			if p.Sequence.ID == "A" {
				t = append(t, templateItem{seq: true})
			}
		case p.SpecialToken != nil:
			st, ok := c.SpecialTokens[p.SpecialToken.ID]
			if !ok {
				return nil, fmt.Errorf("tokenizer: TemplateProcessing uses %q, which is not in its special_tokens", p.SpecialToken.ID)
			}
			ids := make([]int, len(st.IDs))
			for i, id := range st.IDs {
				if id < 0 || id >= maxTokenID {
					return nil, fmt.Errorf("tokenizer: TemplateProcessing token %q has id %d", p.SpecialToken.ID, id)
				}
				ids[i] = int(id)
			}
			t = append(t, templateItem{ids: ids})
		default:
			return nil, fmt.Errorf("tokenizer: TemplateProcessing has an item that is neither SpecialToken nor Sequence")
		}
	}
	return t, nil
}

// tokenPairID reads the id from a ["[CLS]", 101] pair.
func tokenPairID(pair []json.RawMessage, name string) (int, error) {
	var id int
	if len(pair) != 2 || json.Unmarshal(pair[1], &id) != nil || id < 0 || id >= maxTokenID {
		return 0, fmt.Errorf("tokenizer: post_processor %s is not a [token, id] pair", name)
	}
	return id, nil
}

// buildDecoder returns nil for a null decoder.
func buildDecoder(raw json.RawMessage, av *addedVocab) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	c, err := decodeComponent(raw, "decoder")
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "ByteLevel":
		added := make(map[string]bool, len(av.tokens))
		for _, t := range av.tokens {
			added[t.content] = true
		}
		return byteLevelDec{added}, nil
	case "ByteFallback":
		return byteFallbackDec{}, nil
	case "Fuse":
		return fuseDec{}, nil
	case "Strip":
		return buildStripDec(c)
	case "Replace":
		r, err := buildReplace(c, "decoder")
		return replaceDec{r}, err
	case "Metaspace":
		return buildMetaspaceDec(c)
	case "BPEDecoder":
		suffix := "</w>"
		if c.Suffix != nil {
			suffix = *c.Suffix
		}
		return bpeDec{suffix}, nil
	case "Sequence":
		var seq sequenceDec
		for _, sub := range c.Decoders {
			d, err := buildDecoder(sub, av)
			if err != nil {
				return nil, err
			}
			if d != nil {
				seq = append(seq, d)
			}
		}
		return seq, nil
	}
	return nil, unsupported("decoder", c.Type)
}

func buildStripDec(c *componentJSON) (decoder, error) {
	content := " "
	if c.Content != nil {
		content = *c.Content
	}
	r, n := utf8.DecodeRuneInString(content)
	if n == 0 || n != len(content) || c.Start < 0 || c.Stop < 0 {
		return nil, fmt.Errorf("tokenizer: decoder Strip wants one character and non-negative counts")
	}
	return stripDec{content: r, start: c.Start, stop: c.Stop}, nil
}

func buildMetaspaceDec(c *componentJSON) (decoder, error) {
	rep := "\u2581"
	if c.Replacement != nil {
		rep = *c.Replacement
	}
	scheme, err := parseScheme(c)
	if err != nil {
		return nil, err
	}
	return metaspaceDec{replacement: rep, scheme: scheme}, nil
}
