package tokenizer

// Hand-written scanners for the split patterns that real tokenizers ship.
// Go's regexp has no look-ahead, and these patterns rely on `\s+(?!\S)`; the
// general regexp2 engine handles them but is several times slower than a
// scanner that knows the pattern. Each scanner reproduces exactly what a
// backtracking engine does with the pattern (alternatives tried in order,
// greedy quantifiers giving back one rune at a time), and the fuzz tests
// compare every scanner with regexp2 on arbitrary input.

// matchFunc returns the end of the match of a pattern that starts exactly at
// s[i:] (i < len(s)), or -1 when no match starts there. s is valid UTF-8.
type matchFunc func(s string, i int) int

// Pattern strings exactly as they appear in tokenizer.json files.
const (
	// patGPT2 is GPT-2's pattern, also what ByteLevel's use_regex means.
	patGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// patCL100K is the cl100k-style pattern as Llama 3 writes it.
	patCL100K = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patQwen is the same with single digits, as Qwen 2 and 3 write it.
	patQwen = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patO200K is the o200k pattern as GPT-OSS writes it.
	patO200K = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// DeepSeek V3 splits with three patterns in turn.
	patDigits3  = `\p{N}{1,3}`
	patDeepCJK  = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	patDeepMain = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// knownPatterns maps a pattern string to its scanner.
var knownPatterns = map[string]matchFunc{
	patGPT2:     matchGPT2,
	patCL100K:   func(s string, i int) int { return matchCL100K(s, i, 3) },
	patQwen:     func(s string, i int) int { return matchCL100K(s, i, 1) },
	patO200K:    matchO200K,
	patDigits3:  matchDigits3,
	patDeepCJK:  matchDeepCJK,
	patDeepMain: matchDeepMain,
}

// scanClass returns the end of the run of runes from s[i:] whose class has a
// bit of want.
func scanClass(s string, i int, want charClass) int {
	for i < len(s) {
		_, c, n := decodeClass(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

// classAt returns the class of the rune at s[i:], or 0 at the end of s.
func classAt(s string, i int) charClass {
	if i >= len(s) {
		return 0
	}
	_, c, _ := decodeClass(s, i)
	return c
}

// matchContraction matches 's 't 're 've 'm 'll 'd at s[i:] (s[i] is the
// apostrophe), ASCII case-insensitively when fold is set.
func matchContraction(s string, i int, fold bool) int {
	lower := func(b byte) byte {
		if fold && b >= 'A' && b <= 'Z' {
			return b + 'a' - 'A'
		}
		return b
	}
	if i+1 >= len(s) {
		return -1
	}
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return i + 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return i + 3
		}
	}
	return -1
}

// matchSpaceTail handles the alternatives `\s*[\r\n]+|\s+(?!\S)|\s+` that end
// the cl100k, o200k and DeepSeek patterns, for a match starting at a
// whitespace rune (withCRLF false leaves out the first alternative, as GPT-2's
// pattern does).
func matchSpaceTail(s string, i int, withCRLF bool) int {
	end, lastBreak, lastStart, runes := i, -1, i, 0
	for end < len(s) {
		r, c, n := decodeClass(s, end)
		if c&clsSpace == 0 {
			break
		}
		if r == '\r' || r == '\n' {
			lastBreak = end + n
		}
		lastStart = end
		end += n
		runes++
	}
	if runes == 0 {
		return -1
	}
	switch {
	case withCRLF && lastBreak > 0:
		// \s* backs off to the last line break and [\r\n]+ takes it.
		return lastBreak
	case end == len(s) || runes == 1:
		// \s+(?!\S) takes the whole run at the end of input; a single
		// space before a non-space falls through to \s+.
		return end
	default:
		// \s+(?!\S) gives back the last space so that it can lead the
		// next word.
		return lastStart
	}
}

// matchGPT2 implements patGPT2.
func matchGPT2(s string, i int) int {
	r, c, _ := decodeClass(s, i)
	if r == '\'' {
		if e := matchContraction(s, i, false); e > 0 {
			return e
		}
	}
	j, cj := i, c
	if r == ' ' && i+1 < len(s) {
		j, cj = i+1, classAt(s, i+1)
	}
	switch {
	case cj&clsL != 0:
		return scanClass(s, j, clsL)
	case cj&clsN != 0:
		return scanClass(s, j, clsN)
	case cj&clsSpace == 0 && j < len(s):
		return scanOther(s, j)
	}
	return matchSpaceTail(s, i, false)
}

// scanOther returns the end of a run of runes that are neither whitespace,
// letters nor numbers: [^\s\p{L}\p{N}]+.
func scanOther(s string, i int) int {
	for i < len(s) {
		_, c, n := decodeClass(s, i)
		if c&(clsSpace|clsL|clsN) != 0 {
			break
		}
		i += n
	}
	return i
}

// scanLineBreaks returns the end of a run of \r and \n (and '/' when slash
// is set) from s[i:].
func scanLineBreaks(s string, i int, slash bool) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n' || slash && s[i] == '/') {
		i++
	}
	return i
}

// matchPunctRun implements ` ?[^\s\p{L}\p{N}]+[\r\n]*` (with '/' in the
// trailing class for o200k).
func matchPunctRun(s string, i int, r rune, c charClass, slash bool) int {
	j := i
	if r == ' ' {
		j = i + 1
		c = classAt(s, j)
		if j >= len(s) {
			return -1
		}
	}
	if c&(clsSpace|clsL|clsN) != 0 {
		return -1
	}
	return scanLineBreaks(s, scanOther(s, j), slash)
}

// matchCL100K implements patCL100K (maxDigits 3) and patQwen (maxDigits 1).
func matchCL100K(s string, i int, maxDigits int) int {
	r, c, n := decodeClass(s, i)
	if r == '\'' {
		if e := matchContraction(s, i, true); e > 0 {
			return e
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c&clsL != 0 {
		return scanClass(s, i+n, clsL)
	}
	if r != '\r' && r != '\n' && c&clsN == 0 && classAt(s, i+n)&clsL != 0 {
		return scanClass(s, i+n, clsL)
	}
	if c&clsN != 0 {
		return scanDigits(s, i, maxDigits)
	}
	if e := matchPunctRun(s, i, r, c, false); e > 0 {
		return e
	}
	return matchSpaceTail(s, i, true)
}

// scanDigits matches \p{N}{1,max} at s[i:], whose first rune is a number.
func scanDigits(s string, i, max int) int {
	for k := 0; k < max && i < len(s); k++ {
		_, c, n := decodeClass(s, i)
		if c&clsN == 0 {
			break
		}
		i += n
	}
	return i
}

// matchDigits3 implements `\p{N}{1,3}`.
func matchDigits3(s string, i int) int {
	if classAt(s, i)&clsN == 0 {
		return -1
	}
	return scanDigits(s, i, 3)
}

// isDeepCJK reports whether r is in DeepSeek's CJK class.
func isDeepCJK(r rune) bool {
	return r >= 0x4e00 && r <= 0x9fa5 || r >= 0x3040 && r <= 0x309f || r >= 0x30a0 && r <= 0x30ff
}

// matchDeepCJK implements patDeepCJK.
func matchDeepCJK(s string, i int) int {
	j := i
	for j < len(s) {
		r, _, n := decodeClass(s, j)
		if !isDeepCJK(r) {
			break
		}
		j += n
	}
	if j == i {
		return -1
	}
	return j
}

// isASCIIPunct reports whether b is one of DeepSeek's ASCII punctuation
// characters, which is all of ASCII punctuation.
func isASCIIPunct(b byte) bool {
	return b >= '!' && b <= '/' || b >= ':' && b <= '@' || b >= '[' && b <= '`' || b >= '{' && b <= '~'
}

func isASCIILetter(b byte) bool { return b|0x20 >= 'a' && b|0x20 <= 'z' }

// matchDeepMain implements patDeepMain. Unlike the others this pattern does
// not match every rune (digits and format characters such as ZWJ are left
// over), which the splitter then keeps as pieces of their own.
func matchDeepMain(s string, i int) int {
	r, c, n := decodeClass(s, i)
	if r < 0x80 && isASCIIPunct(byte(r)) && i+1 < len(s) && isASCIILetter(s[i+1]) {
		j := i + 1
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if r != '\r' && r != '\n' && c&(clsL|clsP|clsS) == 0 && classAt(s, i+n)&(clsL|clsM) != 0 {
		return scanClass(s, i+n, clsL|clsM)
	}
	if c&(clsL|clsM) != 0 {
		return scanClass(s, i, clsL|clsM)
	}
	// ` ?[\p{P}\p{S}]+[\r\n]*`
	j, cj := i, c
	if r == ' ' {
		j, cj = i+1, classAt(s, i+1)
	}
	if cj&(clsP|clsS) != 0 {
		return scanLineBreaks(s, scanClass(s, j, clsP|clsS), false)
	}
	if c&clsSpace != 0 {
		return matchSpaceTail(s, i, true)
	}
	return -1
}

// o200k's two letter classes overlap: "upper" is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
// and "lower" is [\p{Ll}\p{Lm}\p{Lo}\p{M}].
const (
	clsUpperO = clsLu | clsLt | clsLm | clsLo | clsM
	clsLowerO = clsLl | clsLm | clsLo | clsM
)

// matchO200K implements patO200K.
func matchO200K(s string, i int) int {
	r, c, n := decodeClass(s, i)
	// The optional leading [^\r\n\p{L}\p{N}] is tried consumed first, then
	// empty, for each of the two word alternatives in turn.
	lead := r != '\r' && r != '\n' && c&(clsL|clsN) == 0
	if lead {
		if e := o200kLowerWord(s, i+n); e > 0 {
			return e
		}
	}
	if e := o200kLowerWord(s, i); e > 0 {
		return e
	}
	if lead {
		if e := o200kUpperWord(s, i+n); e > 0 {
			return e
		}
	}
	if e := o200kUpperWord(s, i); e > 0 {
		return e
	}
	if c&clsN != 0 {
		return scanDigits(s, i, 3)
	}
	if e := matchPunctRun(s, i, r, c, true); e > 0 {
		return e
	}
	return matchSpaceTail(s, i, true)
}

// o200kLowerWord matches upper*lower+contraction? at s[i:]. Greedy upper*
// takes the whole run of upper runes and then gives back runes until lower+
// can start, which is at the last position in the run (or just after it)
// holding a lower rune.
func o200kLowerWord(s string, i int) int {
	u := scanClass(s, i, clsUpperO)
	p := -1
	if classAt(s, u)&clsLowerO != 0 {
		p = u
	} else {
		for q := i; q < u; {
			_, c, n := decodeClass(s, q)
			if c&clsLowerO != 0 {
				p = q
			}
			q += n
		}
	}
	if p < 0 {
		return -1
	}
	return o200kContraction(s, scanClass(s, p, clsLowerO))
}

// o200kUpperWord matches upper+lower*contraction? at s[i:].
func o200kUpperWord(s string, i int) int {
	if i >= len(s) || classAt(s, i)&clsUpperO == 0 {
		return -1
	}
	return o200kContraction(s, scanClass(s, scanClass(s, i, clsUpperO), clsLowerO))
}

// o200kContraction extends a word ending at e by an optional contraction.
func o200kContraction(s string, e int) int {
	if e < len(s) && s[e] == '\'' {
		if c := matchContraction(s, e, true); c > 0 {
			return c
		}
	}
	return e
}
