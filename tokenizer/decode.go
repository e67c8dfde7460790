package tokenizer

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns tokens back into text, HF's Decoder::decode_chain: each
// step maps the list of token strings to a new list, and the final list is
// concatenated.
type decoder interface {
	decodeChain(tokens []string) []string
}

// byteLevelDec maps byte-level runes back to bytes. Added tokens pass
// through as they are (as HF's JS port does), so a special token whose
// content happens to use byte-level runes is not garbled. A token with a
// rune outside the alphabet contributes its own UTF-8 bytes, as in HF's
// Rust decoder.
type byteLevelDec struct{ added map[string]bool }

func (d byteLevelDec) decodeChain(tokens []string) []string {
	var out []string
	var buf []byte
	flush := func() {
		if len(buf) > 0 {
			out = append(out, string(appendLossyUTF8(nil, buf)))
			buf = buf[:0]
		}
	}
	for _, tok := range tokens {
		if d.added[tok] {
			flush()
			out = append(out, tok)
			continue
		}
		var ok bool
		if buf, ok = unByteLevel(buf, tok); !ok {
			buf = append(buf, tok...)
		}
	}
	flush()
	return out
}

// byteFallbackDec turns runs of <0xXX> tokens back into text; a run that is
// not valid UTF-8 becomes one U+FFFD per byte, as in HF.
type byteFallbackDec struct{}

func (byteFallbackDec) decodeChain(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if s := string(run); utf8.ValidString(s) {
			out = append(out, s)
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, tok := range tokens {
		if b, ok := parseByteToken(tok); ok {
			run = append(run, b)
			continue
		}
		flush()
		out = append(out, tok)
	}
	flush()
	return out
}

// parseByteToken recognises "<0xXX>".
func parseByteToken(tok string) (byte, bool) {
	if len(tok) != 6 || !strings.HasPrefix(tok, "<0x") || tok[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(tok[3:5], 16, 8)
	return byte(v), err == nil
}

// fuseDec joins all tokens into one.
type fuseDec struct{}

func (fuseDec) decodeChain(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// stripDec removes up to start copies of content from the front of each
// token and up to stop from the back.
type stripDec struct {
	content     rune
	start, stop int
}

func (d stripDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		r := []rune(tok)
		lo, hi := 0, len(r)
		for lo < d.start && lo < hi && r[lo] == d.content {
			lo++
		}
		for k := 0; k < d.stop && hi > lo && r[hi-1] == d.content; k++ {
			hi--
		}
		out[i] = string(r[lo:hi])
	}
	return out
}

// replaceDec replaces a literal or regex in each token.
type replaceDec struct{ replaceNorm }

func (d replaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		out[i] = d.normalize(tok)
	}
	return out
}

// metaspaceDec turns the replacement rune back into spaces and drops the
// space that the pre-tokenizer prepended to the first token.
type metaspaceDec struct {
	replacement string
	scheme      prependScheme
}

func (d metaspaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		s := strings.ReplaceAll(tok, d.replacement, " ")
		if i == 0 && d.scheme != prependNever {
			s = strings.TrimPrefix(s, " ")
		}
		out[i] = s
	}
	return out
}

// bpeDec replaces the end-of-word suffix with a space (none after the last
// token).
type bpeDec struct{ suffix string }

func (d bpeDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		sep := " "
		if i == len(tokens)-1 {
			sep = ""
		}
		out[i] = strings.ReplaceAll(tok, d.suffix, sep)
	}
	return out
}

// sequenceDec runs decoders in turn.
type sequenceDec []decoder

func (q sequenceDec) decodeChain(tokens []string) []string {
	for _, d := range q {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}
