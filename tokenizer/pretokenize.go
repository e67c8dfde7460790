package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// preTokenizer splits a normalized section of text into the pieces that the
// model encodes one by one.
type preTokenizer interface {
	// appendPieces appends the pre-tokens of s to dst. first reports that s
	// begins the input text, which Metaspace's "first" scheme asks about.
	appendPieces(dst []string, s string, first bool, sc *scratch) []string
}

// splitBehavior says what a split does with the matched delimiters, with
// the meanings of HF's SplitDelimiterBehavior.
type splitBehavior int

const (
	behaviorRemoved splitBehavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

// span is a stretch of the text being split; match says whether the pattern
// matched it (after inversion).
type span struct {
	start, end int
	match      bool
}

// finder appends to dst the spans of s: matches and the gaps between them,
// in order, covering s.
type finder interface {
	spans(dst []span, s string) []span
}

// matchFinder finds matches with a hand-written scanner.
type matchFinder struct{ match matchFunc }

func (f matchFinder) spans(dst []span, s string) []span {
	gap := 0
	for i := 0; i < len(s); {
		if e := f.match(s, i); e > i {
			if gap < i {
				dst = append(dst, span{gap, i, false})
			}
			dst = append(dst, span{i, e, true})
			i, gap = e, e
			continue
		}
		i += runeLen(s, i)
	}
	if gap < len(s) {
		dst = append(dst, span{gap, len(s), false})
	}
	return dst
}

// runeLen returns the length of the rune at s[i:].
func runeLen(s string, i int) int {
	if s[i] < utf8.RuneSelf {
		return 1
	}
	_, n := utf8.DecodeRuneInString(s[i:])
	return n
}

// literalFinder finds non-overlapping occurrences of a string, left to right.
type literalFinder struct{ lit string }

func (f literalFinder) spans(dst []span, s string) []span {
	gap := 0
	if f.lit != "" {
		for i := 0; i < len(s); {
			k := strings.Index(s[i:], f.lit)
			if k < 0 {
				break
			}
			k += i
			if gap < k {
				dst = append(dst, span{gap, k, false})
			}
			dst = append(dst, span{k, k + len(f.lit), true})
			i, gap = k+len(f.lit), k+len(f.lit)
		}
	}
	if gap < len(s) {
		dst = append(dst, span{gap, len(s), false})
	}
	return dst
}

// predicateFinder matches single runes for which is returns true, each one
// a match of its own, as HF's char-predicate patterns do.
type predicateFinder struct{ is func(rune) bool }

func (f predicateFinder) spans(dst []span, s string) []span {
	gap := 0
	for i, r := range s {
		if !f.is(r) {
			continue
		}
		if gap < i {
			dst = append(dst, span{gap, i, false})
		}
		n := utf8.RuneLen(r)
		dst = append(dst, span{i, i + n, true})
		gap = i + n
	}
	if gap < len(s) {
		dst = append(dst, span{gap, len(s), false})
	}
	return dst
}

// splitter applies a finder with a delimiter behavior.
type splitter struct {
	find     finder
	behavior splitBehavior
	invert   bool
	known    bool // find is a scanner of knownPatterns
}

func (p *splitter) appendPieces(dst []string, s string, _ bool, sc *scratch) []string {
	if mf, ok := p.find.(matchFinder); ok && p.behavior == behaviorIsolated && !p.invert {
		return appendIsolated(dst, s, mf.match)
	}
	spans := p.find.spans(sc.spans[:0], s)
	if p.invert {
		for i := range spans {
			spans[i].match = !spans[i].match
		}
	}
	spans = applyBehavior(spans, p.behavior)
	for _, sp := range spans {
		if sp.start < sp.end && !(p.behavior == behaviorRemoved && sp.match) {
			dst = append(dst, s[sp.start:sp.end])
		}
	}
	sc.spans = spans[:0]
	return dst
}

// appendIsolated is the hot path of the common configuration, an Isolated
// split with a known pattern: it appends matches and gaps without building
// spans first.
func appendIsolated(dst []string, s string, match matchFunc) []string {
	gap := 0
	for i := 0; i < len(s); {
		if e := match(s, i); e > i {
			if gap < i {
				dst = append(dst, s[gap:i])
			}
			dst = append(dst, s[i:e])
			i, gap = e, e
			continue
		}
		i += runeLen(s, i)
	}
	if gap < len(s) {
		dst = append(dst, s[gap:])
	}
	return dst
}

// applyBehavior rewrites spans in place the way HF's NormalizedString::split
// does: afterwards a span with match set is a delimiter to drop (Removed)
// and every other span is a piece.
func applyBehavior(spans []span, b splitBehavior) []span {
	switch b {
	case behaviorIsolated:
		for i := range spans {
			spans[i].match = false
		}
	case behaviorContiguous:
		out := spans[:0]
		prev := false
		for _, sp := range spans {
			if len(out) > 0 && sp.match == prev {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prev = sp.match
		}
		return out
	case behaviorMergedWithPrevious:
		out := spans[:0]
		prev := false
		for _, sp := range spans {
			if sp.match && !prev && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prev = sp.match
		}
		return out
	case behaviorMergedWithNext:
		return mergeWithNext(spans)
	}
	return spans
}

// mergeWithNext glues each delimiter to the piece after it, walking from the
// end as HF does so that runs of delimiters behave the same way.
func mergeWithNext(spans []span) []span {
	out := make([]span, 0, len(spans))
	prev := false
	for i := len(spans) - 1; i >= 0; i-- {
		sp := spans[i]
		if sp.match && !prev && len(out) > 0 {
			out[len(out)-1].start = sp.start
		} else {
			out = append(out, span{sp.start, sp.end, false})
		}
		prev = sp.match
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return append(spans[:0], out...)
}

// sequencePre runs pre-tokenizers in turn, each on every piece the one before
// produced.
type sequencePre struct{ steps []preTokenizer }

func (p *sequencePre) appendPieces(dst []string, s string, first bool, sc *scratch) []string {
	cur := append(sc.takePieces(), s)
	for k, step := range p.steps {
		if k == len(p.steps)-1 {
			for j, piece := range cur {
				dst = step.appendPieces(dst, piece, first && j == 0, sc)
			}
			break
		}
		next := sc.takePieces()
		for j, piece := range cur {
			next = step.appendPieces(next, piece, first && j == 0, sc)
		}
		sc.givePieces(cur)
		cur = next
	}
	if len(p.steps) == 0 {
		dst = append(dst, s)
	}
	sc.givePieces(cur)
	return dst
}

// byteLevelPre is HF's ByteLevel pre-tokenizer. When it is the last step
// (the usual case) mapBytes is false: the pieces stay raw text and the model
// maps bytes to the byte-level alphabet itself, which saves building a
// string per piece.
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
	mapBytes       bool
}

func (p *byteLevelPre) appendPieces(dst []string, s string, _ bool, _ *scratch) []string {
	if p.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	start := len(dst)
	if p.useRegex {
		dst = appendIsolated(dst, s, matchGPT2)
	} else {
		dst = append(dst, s)
	}
	if p.mapBytes {
		for i := start; i < len(dst); i++ {
			dst[i] = byteLevelString(dst[i])
		}
	}
	return dst
}

// prependScheme says when Metaspace adds the replacement at the front.
type prependScheme int

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// metaspacePre is HF's Metaspace pre-tokenizer: spaces become the
// replacement rune (▁ by default), which may also be prepended, and with
// split set the text is cut before each replacement.
type metaspacePre struct {
	replacement string
	scheme      prependScheme
	split       bool
}

func (p *metaspacePre) appendPieces(dst []string, s string, first bool, sc *scratch) []string {
	s = strings.ReplaceAll(s, " ", p.replacement)
	if (p.scheme == prependAlways || p.scheme == prependFirst && first) && !strings.HasPrefix(s, p.replacement) {
		s = p.replacement + s
	}
	if !p.split {
		return append(dst, s)
	}
	sp := splitter{find: literalFinder{p.replacement}, behavior: behaviorMergedWithNext}
	return sp.appendPieces(dst, s, first, sc)
}

// isWhitespaceRune is HF's char::is_whitespace test.
func isWhitespaceRune(r rune) bool { return isSpace(r) }

// isBertPunct is the punctuation test of HF's Punctuation and Bert
// pre-tokenizers: ASCII punctuation or Unicode category P.
func isBertPunct(r rune) bool {
	if r < utf8.RuneSelf {
		return isASCIIPunct(byte(r))
	}
	return classOf(r)&clsP != 0
}

// isNumeric is Rust's char::is_numeric: categories Nd, Nl and No.
func isNumeric(r rune) bool { return classOf(r)&clsN != 0 }

// matchWordOrPunct implements `\w+|[^\w\s]+`, the pattern of HF's Whitespace
// pre-tokenizer, with Unicode \w and \s.
func matchWordOrPunct(s string, i int) int {
	r, _ := utf8.DecodeRuneInString(s[i:])
	word := isWordRune(r)
	if !word && isSpace(r) {
		return -1
	}
	j := i
	for j < len(s) {
		r, n := utf8.DecodeRuneInString(s[j:])
		if isWordRune(r) != word || !word && isSpace(r) {
			break
		}
		j += n
	}
	return j
}

// bertPre is HF's BertPreTokenizer: split on whitespace, then isolate each
// punctuation rune.
type bertPre struct{}

func (bertPre) appendPieces(dst []string, s string, first bool, sc *scratch) []string {
	ws := splitter{find: predicateFinder{isWhitespaceRune}, behavior: behaviorRemoved}
	words := ws.appendPieces(sc.takePieces(), s, first, sc)
	punct := splitter{find: predicateFinder{isBertPunct}, behavior: behaviorIsolated}
	for _, w := range words {
		dst = punct.appendPieces(dst, w, first, sc)
	}
	sc.givePieces(words)
	return dst
}
