package tokenizer

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// buildNormalizer returns nil for a null normalizer.
func buildNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	c, err := decodeComponent(raw, "normalizer")
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNorm{}, nil
	case "Strip":
		return stripNorm{c.StripLeft, c.StripRight}, nil
	case "StripAccents":
		return stripAccentsNorm{}, nil
	case "Prepend":
		return prependNorm{c.Prepend}, nil
	case "Replace":
		return buildReplace(c, "normalizer")
	case "Sequence":
		var seq sequenceNorm
		for _, sub := range c.Normalizers {
			n, err := buildNormalizer(sub)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	}
	return nil, unsupported("normalizer", c.Type)
}

// buildReplace reads a Replace normalizer or decoder.
func buildReplace(c *componentJSON, kind string) (replaceNorm, error) {
	var r replaceNorm
	if c.Content != nil {
		r.content = *c.Content
	}
	switch {
	case c.Pattern == nil:
		return r, fmt.Errorf("tokenizer: %s Replace has no pattern", kind)
	case c.Pattern.String != nil:
		r.literal = *c.Pattern.String
	case c.Pattern.Regex != nil:
		re, err := compileRegex(*c.Pattern.Regex)
		if err != nil {
			return r, fmt.Errorf("tokenizer: %s Replace: %w", kind, err)
		}
		r.re = re
	default:
		return r, fmt.Errorf("tokenizer: %s Replace pattern is neither String nor Regex", kind)
	}
	return r, nil
}

// buildPreTokenizer returns nil for a null pre-tokenizer.
func buildPreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	c, err := decodeComponent(raw, "pre_tokenizer")
	if err != nil {
		return nil, err
	}
	switch c.Type {
	case "Split":
		return buildSplit(c)
	case "ByteLevel":
		return &byteLevelPre{
			addPrefixSpace: boolOr(c.AddPrefixSpace, false),
			useRegex:       boolOr(c.UseRegex, true),
			mapBytes:       true,
		}, nil
	case "Metaspace":
		return buildMetaspace(c)
	case "Digits":
		b := behaviorContiguous
		if c.IndividualDigits {
			b = behaviorIsolated
		}
		return &splitter{find: predicateFinder{isNumeric}, behavior: b}, nil
	case "Whitespace":
		return &splitter{find: matchFinder{matchWordOrPunct}, behavior: behaviorRemoved, invert: true}, nil
	case "WhitespaceSplit":
		return &splitter{find: predicateFinder{isWhitespaceRune}, behavior: behaviorRemoved}, nil
	case "Punctuation":
		b, err := parseBehavior(c.Behavior, behaviorIsolated)
		if err != nil {
			return nil, err
		}
		return &splitter{find: predicateFinder{isBertPunct}, behavior: b}, nil
	case "BertPreTokenizer":
		return bertPre{}, nil
	case "CharDelimiterSplit":
		return buildCharDelimiter(c)
	case "Sequence":
		return buildPreSequence(c)
	}
	return nil, unsupported("pre_tokenizer", c.Type)
}

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

func buildPreSequence(c *componentJSON) (preTokenizer, error) {
	seq := &sequencePre{}
	for _, sub := range c.Pretokenizers {
		p, err := buildPreTokenizer(sub)
		if err != nil {
			return nil, err
		}
		if p != nil {
			seq.steps = append(seq.steps, p)
		}
	}
	return seq, nil
}

func buildCharDelimiter(c *componentJSON) (preTokenizer, error) {
	d, n := utf8.DecodeRuneInString(c.Delimiter)
	if n == 0 || n != len(c.Delimiter) {
		return nil, fmt.Errorf("tokenizer: CharDelimiterSplit delimiter %q is not one character", c.Delimiter)
	}
	return &splitter{find: predicateFinder{func(r rune) bool { return r == d }}, behavior: behaviorRemoved}, nil
}

// parseBehavior reads a SplitDelimiterBehavior name.
func parseBehavior(name string, def splitBehavior) (splitBehavior, error) {
	switch name {
	case "":
		return def, nil
	case "Removed":
		return behaviorRemoved, nil
	case "Isolated":
		return behaviorIsolated, nil
	case "MergedWithPrevious":
		return behaviorMergedWithPrevious, nil
	case "MergedWithNext":
		return behaviorMergedWithNext, nil
	case "Contiguous":
		return behaviorContiguous, nil
	}
	return 0, fmt.Errorf("tokenizer: split behavior %q is not supported", name)
}

// buildSplit uses a hand-written scanner for known regexes and regexp2 for
// the rest.
func buildSplit(c *componentJSON) (preTokenizer, error) {
	b, err := parseBehavior(c.Behavior, behaviorIsolated)
	if err != nil {
		return nil, err
	}
	s := &splitter{behavior: b, invert: c.Invert}
	switch {
	case c.Pattern == nil:
		return nil, fmt.Errorf("tokenizer: pre_tokenizer Split has no pattern")
	case c.Pattern.String != nil:
		s.find = literalFinder{*c.Pattern.String}
	case c.Pattern.Regex != nil:
		if m, ok := knownPatterns[*c.Pattern.Regex]; ok {
			s.find, s.known = matchFinder{m}, true
		} else if s.find, err = compileRegex(*c.Pattern.Regex); err != nil {
			return nil, fmt.Errorf("tokenizer: pre_tokenizer Split: %w", err)
		}
	default:
		return nil, fmt.Errorf("tokenizer: pre_tokenizer Split pattern is neither String nor Regex")
	}
	return s, nil
}

func buildMetaspace(c *componentJSON) (preTokenizer, error) {
	rep := "\u2581"
	if c.Replacement != nil {
		rep = *c.Replacement
	}
	if rep == "" {
		return nil, fmt.Errorf("tokenizer: Metaspace replacement is empty")
	}
	scheme, err := parseScheme(c)
	if err != nil {
		return nil, err
	}
	return &metaspacePre{replacement: rep, scheme: scheme, split: boolOr(c.Split, true)}, nil
}

// parseScheme reads prepend_scheme, falling back to the older
// add_prefix_space flag.
func parseScheme(c *componentJSON) (prependScheme, error) {
	switch c.PrependScheme {
	case "always":
		return prependAlways, nil
	case "first":
		return prependFirst, nil
	case "never":
		return prependNever, nil
	case "":
		if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
			return prependNever, nil
		}
		return prependAlways, nil
	}
	return 0, fmt.Errorf("tokenizer: Metaspace prepend_scheme %q is not supported", c.PrependScheme)
}

// markRawByteLevel finds a ByteLevel step that ends the pre-tokenizer and
// lets its pieces reach the model unmapped (see byteLevelPre). It reports
// whether it did.
func markRawByteLevel(p preTokenizer) bool {
	switch p := p.(type) {
	case *byteLevelPre:
		p.mapBytes = false
		return true
	case *sequencePre:
		if len(p.steps) > 0 {
			return markRawByteLevel(p.steps[len(p.steps)-1])
		}
	}
	return false
}
