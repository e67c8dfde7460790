package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// charClass is a bit set of the Unicode properties the split patterns ask
// about. Looking a rune's class up once and testing bits is much cheaper than
// calling unicode.Is for each property in a scanner's inner loop.
type charClass uint16

const (
	clsLu    charClass = 1 << iota // uppercase letter
	clsLl                          // lowercase letter
	clsLt                          // titlecase letter
	clsLm                          // modifier letter
	clsLo                          // other letter
	clsM                           // mark (Mn, Mc, Me)
	clsNd                          // decimal digit
	clsNo                          // other numbers (Nl, No)
	clsP                           // punctuation
	clsS                           // symbol
	clsSpace                       // Unicode White_Space, what \s means in Oniguruma
	clsWordX                       // extra \w members: Pc, Join_Control, Other_Alphabetic

	clsL = clsLu | clsLl | clsLt | clsLm | clsLo
	clsN = clsNd | clsNo
)

// classTables is the two-level lookup table for runes at or above 0x80:
// blockOf maps rune>>8 to a block index and blocks holds deduplicated
// 256-entry blocks. It is built once, on first use, from the standard
// library's Unicode tables and is read-only afterwards.
type classTables struct {
	blockOf []uint16
	blocks  [][256]charClass
}

var (
	classOnce  sync.Once
	classTable *classTables
	asciiClass [128]charClass
)

func init() {
	for r := rune(0); r < 128; r++ {
		asciiClass[r] = classOfSlow(r)
	}
}

// classOfSlow computes a rune's class from the unicode package. It is used
// only while building the lookup tables.
func classOfSlow(r rune) charClass {
	var c charClass
	tables := []struct {
		t   *unicode.RangeTable
		bit charClass
	}{
		{unicode.Lu, clsLu}, {unicode.Ll, clsLl}, {unicode.Lt, clsLt},
		{unicode.Lm, clsLm}, {unicode.Lo, clsLo}, {unicode.M, clsM},
		{unicode.Nd, clsNd}, {unicode.Nl, clsNo}, {unicode.No, clsNo},
		{unicode.P, clsP}, {unicode.S, clsS}, {unicode.White_Space, clsSpace},
		{unicode.Pc, clsWordX}, {unicode.Join_Control, clsWordX},
		{unicode.Other_Alphabetic, clsWordX},
	}
	for _, e := range tables {
		if unicode.Is(e.t, r) {
			c |= e.bit
		}
	}
	return c
}

// buildClassTables fills a flat table range by range (far cheaper than asking
// unicode.Is for every code point) and then folds it into deduplicated blocks.
func buildClassTables() *classTables {
	flat := make([]charClass, utf8.MaxRune+1)
	set := func(t *unicode.RangeTable, bit charClass) {
		for _, r := range t.R16 {
			for c := rune(r.Lo); c <= rune(r.Hi); c += rune(r.Stride) {
				flat[c] |= bit
			}
		}
		for _, r := range t.R32 {
			for c := rune(r.Lo); c <= rune(r.Hi); c += rune(r.Stride) {
				flat[c] |= bit
			}
		}
	}
	set(unicode.Lu, clsLu)
	set(unicode.Ll, clsLl)
	set(unicode.Lt, clsLt)
	set(unicode.Lm, clsLm)
	set(unicode.Lo, clsLo)
	set(unicode.M, clsM)
	set(unicode.Nd, clsNd)
	set(unicode.Nl, clsNo)
	set(unicode.No, clsNo)
	set(unicode.P, clsP)
	set(unicode.S, clsS)
	set(unicode.White_Space, clsSpace)
	set(unicode.Pc, clsWordX)
	set(unicode.Join_Control, clsWordX)
	set(unicode.Other_Alphabetic, clsWordX)

	t := &classTables{blockOf: make([]uint16, (utf8.MaxRune+1)>>8)}
	seen := make(map[[256]charClass]uint16)
	for b := range t.blockOf {
		var blk [256]charClass
		copy(blk[:], flat[b<<8:(b+1)<<8])
		idx, ok := seen[blk]
		if !ok {
			idx = uint16(len(t.blocks))
			t.blocks = append(t.blocks, blk)
			seen[blk] = idx
		}
		t.blockOf[b] = idx
	}
	return t
}

// initClasses makes sure the lookup tables exist. Parse calls it so that the
// cost lands on loading rather than on the first request.
func initClasses() {
	classOnce.Do(func() { classTable = buildClassTables() })
}

// classOf returns r's class. Runes outside the Unicode range (including
// utf8.RuneError's invalid-input meaning) are looked up as U+FFFD.
func classOf(r rune) charClass {
	if uint32(r) < 128 {
		return asciiClass[r]
	}
	if uint32(r) > utf8.MaxRune {
		r = utf8.RuneError
	}
	t := classTable
	return t.blocks[t.blockOf[r>>8]][r&0xff]
}

// decodeClass decodes the rune at s[i:] and returns it with its class and
// its length in bytes. s must be valid UTF-8 and i < len(s).
func decodeClass(s string, i int) (rune, charClass, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return rune(b), asciiClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r, classOf(r), n
}

// isSpace reports whether r is Unicode White_Space.
func isSpace(r rune) bool { return classOf(r)&clsSpace != 0 }

// isWordRune reports whether r is a \w character in the Unicode sense used by
// Rust's regex crate: alphabetic, mark, decimal digit, connector punctuation
// or join control.
func isWordRune(r rune) bool {
	c := classOf(r)
	return c&(clsL|clsM|clsNd|clsWordX) != 0 || unicode.Is(unicode.Nl, r)
}
