package tokenizer

import (
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/llmgw/caddy-llmgw/internal/bytescan"
)

// Long prompts often differ only at their end: a document or a few-shot
// block with a new question after it, in one message. The section cache
// (section_cache.go) cannot help there, as no section repeats whole. The
// prefix cache keeps, for the normalized text of a long section, the ids
// of its pieces up to checkpoints every prefixStride bytes, so a section
// that shares a stored one's first n bytes is encoded from near n on.
//
// Resuming is exact only at a fence: a piece boundary b where the text
// reads ASCII letter or digit, space, ASCII letter (s[b-1], s[b], s[b+1]),
// or a CJK ideograph and a common CJK punctuation mark (isCJKFence).
// With the split patterns of knownPatterns and byte-level pieces (see
// resumablePre), every match that starts before b ends at or before it and
// looks at nothing past s[b]: letter, digit and punctuation runs all stop
// at the space, contractions are at most three characters, and the
// whitespace alternatives cannot start before b since s[b-1] is no space.
// So two texts that share s[:b+2] have the same pieces before b, and the
// pieces from b on are those of s[b:] alone, the scanners being without
// look-behind. A checkpoint at n resumes from the last fence at least
// fenceMargin bytes before n.
const (
	// prefixStride is the spacing of checkpoints in the normalized text.
	prefixStride = 1024
	// minPrefixBytes leaves shorter sections to the section and word
	// caches: what the prefix cache could save there is not worth the
	// hashing.
	minPrefixBytes = 4 * prefixStride
	// fenceMargin keeps a checkpoint's fence clear of its end.
	fenceMargin = 8
	// prefixCacheBudget bounds the cache: the stored texts' bytes, 4 per
	// id and an entry's overhead per checkpoint. Past it the cache is
	// emptied, as the section cache is.
	prefixCacheBudget = 16 << 20
	// prefixEntryBytes is the cost counted per checkpoint entry.
	prefixEntryBytes = 64
)

// prefixEntry is one checkpoint of a stored section: text[:n] is the
// prefix it stands for, ids[:nids] the ids of its pieces before fence.
// fences are more places to resume from, in the whole section: a text
// found by the checkpoint is compared on past it, and resumes from the
// last fence before where it differs rather than from the checkpoint's.
type prefixEntry struct {
	text   string // the stored section, shared by all its checkpoints
	n      int
	fence  int
	ids    []int32 // the stored section's ids, shared likewise
	nids   int
	fences []fencePos // shared likewise; nil for a section too long to hold them
}

// fencePos is a fence of a stored section and the ids before it; one is
// recorded per fenceSpacing bytes at most.
type fencePos struct{ off, nids int32 }

// fenceSpacing is the least distance between recorded fences: a resumed
// encoding starts at most about this far (plus fenceMargin and the word
// the fence sits in) before where the texts differ.
const fenceSpacing = 64

// prefixCache maps the hash of a checkpoint's prefix (with the section's
// first flag) to its entry. A section is stored when one of its prefixes
// was seen before: the first request with a new document is most often
// the only one, and storing each would churn the cache. It is safe for
// concurrent use.
type prefixCache struct {
	seed  maphash.Seed
	mu    sync.RWMutex
	m     map[uint64]prefixEntry
	seen  map[uint64]struct{} // checkpoint hashes of sections not stored
	bytes int
	hits  atomic.Int64 // encodings resumed from a checkpoint
}

func newPrefixCache() *prefixCache {
	return &prefixCache{seed: maphash.MakeSeed(), m: map[uint64]prefixEntry{}, seen: map[uint64]struct{}{}}
}

// hashes appends the hash of (first, s[:k*prefixStride]) for every k ≥ 1
// that fits in s.
func (c *prefixCache) hashes(dst []uint64, s string, first bool) []uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	if first {
		_ = h.WriteByte(1)
	} else {
		_ = h.WriteByte(0)
	}
	for n := prefixStride; n <= len(s); n += prefixStride {
		_, _ = h.WriteString(s[n-prefixStride : n])
		dst = append(dst, h.Sum64())
	}
	return dst
}

// longest returns the entry of the longest stored prefix of s, by its
// checkpoint hashes hs; the text is compared, so a hash collision costs
// nothing but the comparison. The entry's fence and nids are moved to the
// last recorded fence that s shares with the stored text, fenceMargin
// bytes and more before they differ (at or past the checkpoint's own);
// its fences are cut to those before it.
func (c *prefixCache) longest(hs []uint64, s string) (prefixEntry, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for k := len(hs); k > 0; k-- {
		e, ok := c.m[hs[k-1]]
		if ok && e.n == k*prefixStride && e.text[:e.n] == s[:e.n] {
			c.hits.Add(1)
			same := e.n + bytescan.CommonPrefix(stringBytes(e.text[e.n:]), stringBytes(s[e.n:]))
			j := sort.Search(len(e.fences), func(j int) bool { return int(e.fences[j].off)+fenceMargin > same }) - 1
			if j >= 0 && int(e.fences[j].off) > e.fence {
				e.fence, e.nids = int(e.fences[j].off), int(e.fences[j].nids)
			}
			e.fences = e.fences[:sort.Search(len(e.fences), func(j int) bool { return int(e.fences[j].off) >= e.fence })]
			return e, true
		}
	}
	return prefixEntry{}, false
}

// checkpoint is where encoding a section may resume for one checkpoint:
// at fence, after nids of its ids.
type checkpoint struct{ fence, nids int }

// put stores s's checkpoints past the prefix already stored (from, in
// bytes) when any of them was seen before; otherwise it marks them seen.
// cps[k] belongs to hs[k]; a zero fence marks a checkpoint without one.
func (c *prefixCache) put(s string, first bool, from int, hs []uint64, cps []checkpoint, fences []fencePos, ids []int) {
	k0 := from / prefixStride
	if k0 >= len(hs) {
		return
	}
	cost := len(s) + 4*len(ids) + prefixEntryBytes*(len(hs)-k0) + 8*len(fences)
	if cost > prefixCacheBudget/4 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	again := false
	for _, h := range hs[k0:] {
		if _, ok := c.seen[h]; ok {
			again = true
			break
		}
	}
	if !again {
		if len(c.seen)+len(hs) > maxSeenSections {
			clear(c.seen)
		}
		for _, h := range hs[k0:] {
			c.seen[h] = struct{}{}
		}
		return
	}
	if c.bytes+cost > prefixCacheBudget {
		clear(c.m)
		c.bytes = 0
	}
	text, stored := strings.Clone(s), toInt32(ids) // do not pin the request's text
	var fs []fencePos
	if len(fences) > 0 {
		fs = slices.Clone(fences)
	}
	for k := k0; k < len(hs); k++ {
		if cps[k].fence > 0 {
			c.m[hs[k]] = prefixEntry{text: text, n: (k + 1) * prefixStride, fence: cps[k].fence, ids: stored, nids: cps[k].nids, fences: fs}
		}
	}
	c.bytes += cost
}

// isFence reports whether a piece starting at s[i:] is a fence (see above),
// or a CJK fence (see isCJKFence).
func isFence(s string, i int) bool {
	if i <= 0 || i+1 >= len(s) {
		return false
	}
	if s[i] == ' ' {
		return isASCIILetter(s[i+1]) && (isASCIILetter(s[i-1]) || s[i-1] >= '0' && s[i-1] <= '9')
	}
	return s[i] >= 0xE3 && isCJKFence(s, i)
}

// isCJKFence reports whether s[i:] starts with one of the commonest CJK
// punctuation marks (、。，：；！？, all \p{Po}) right after a CJK
// ideograph (U+4E00 to U+9FA5, \p{Lo}): Chinese text has no space-letter
// fences, and without these a Chinese document was encoded whole on
// every request. The argument is the space fence's: with every pattern of
// knownPatterns the match that holds the ideograph is a letter run (or,
// in DeepSeek's sequence, first its CJK run), which stops at the mark and
// looks at nothing past it; no contraction, digit, punctuation or
// whitespace alternative can hold a letter; and the piece at i is matched
// from i alone. The marks are outside DeepSeek's CJK ranges (U+3040 to
// U+30FF holds kana punctuation such as ・, which is why the set is
// short) and its ASCII-punctuation-and-letters alternative.
func isCJKFence(s string, i int) bool {
	r, n := utf8.DecodeRuneInString(s[i:])
	switch r {
	case '、', '。', '，', '：', '；', '！', '？':
	default:
		return false
	}
	if i+n >= len(s) {
		return false
	}
	p, _ := utf8.DecodeLastRuneInString(s[:i])
	return p >= 0x4E00 && p <= 0x9FA5
}

// resumablePre reports whether p is made only of the steps the fence
// argument above holds for: Isolated splits with a known pattern and
// byte-level steps that neither add a prefix space nor map the pieces.
func resumablePre(p preTokenizer) bool {
	switch p := p.(type) {
	case *splitter:
		return p.known && p.behavior == behaviorIsolated && !p.invert
	case *byteLevelPre:
		return !p.addPrefixSpace && !p.mapBytes
	case *sequencePre:
		for _, s := range p.steps {
			if !resumablePre(s) {
				return false
			}
		}
		return len(p.steps) > 0
	}
	return false
}

// appendPrefixed is appendNormalized for a long section through the
// prefix cache: the ids of the longest stored prefix, then the pieces
// from its fence on; what was not stored yet is offered to the cache.
func (t *Tokenizer) appendPrefixed(dst []int, s string, first bool, sc *scratch) []int {
	c := t.prefixes
	hs := c.hashes(sc.hashes[:0], s, first)
	sc.hashes = hs
	r := resume{base: len(dst), first: first}
	sc.fences = sc.fences[:0]
	if e, ok := c.longest(hs, s); ok {
		dst = appendIDs(dst, e.ids[:e.nids])
		r.from = e.fence
		sc.fences = append(sc.fences, e.fences...) // those before r.from
	}
	cps := sc.checkpoints[:0]
	for range hs {
		cps = append(cps, checkpoint{})
	}
	sc.checkpoints = cps
	dst, ok := t.appendFenced(dst, s, r, sc)
	if ok && len(s)-r.from >= 2*prefixStride {
		// (A section beyond what a fencePos holds has none recorded: it
		// resumes from checkpoints only.)
		c.put(s, first, r.from, hs, cps, sc.fences, dst[r.base:])
	}
	sc.checkpoints, sc.fences = cps[:0], sc.fences[:0]
	return dst
}

// resume is where appendFenced starts encoding a section.
type resume struct {
	from  int  // offset in the section: 0, or a fence
	base  int  // where the section's ids start in dst
	first bool // the section starts the input
}

// appendFenced encodes s[r.from:] piece by piece and records in
// sc.checkpoints, for each checkpoint past r.from, the last fence at least
// fenceMargin bytes before it and the ids (counted from r.base in dst)
// before that fence. It reports false when the pieces do not cover
// s[r.from:] exactly, which would make their offsets wrong: nothing may be
// stored.
func (t *Tokenizer) appendFenced(dst []int, s string, r resume, sc *scratch) ([]int, bool) {
	pieces := t.pre.appendPieces(sc.takePieces(), s[r.from:], r.first && r.from == 0, sc)
	cps, base := sc.checkpoints, r.base
	k, last, off := r.from/prefixStride, checkpoint{}, r.from
	nextFence := 0 // where the next fence may be recorded
	if n := len(sc.fences); n > 0 {
		nextFence = int(sc.fences[n-1].off) + fenceSpacing
	}
	for _, p := range pieces {
		if isFence(s, off) {
			for k < len(cps) && off+fenceMargin > (k+1)*prefixStride {
				cps[k] = last
				k++
			}
			last = checkpoint{fence: off, nids: len(dst) - base}
			if off >= nextFence && len(s) <= math.MaxInt32 {
				sc.fences = append(sc.fences, fencePos{off: int32(off), nids: int32(len(dst) - base)})
				nextFence = off + fenceSpacing
			}
		}
		dst = t.model.appendWord(dst, p, t.rawPieces, sc)
		off += len(p)
	}
	for ; k < len(cps) && last.fence+fenceMargin <= (k+1)*prefixStride; k++ {
		cps[k] = last
	}
	sc.givePieces(pieces)
	return dst, off == len(s)
}
