package remotetok

import (
	"context"
	"net/http"
)

// TokenizeDerived is Tokenize for a caller that computes a value from the
// ids for every request (the fleet: the prompt's block keys) and would
// rather cache it with them: derive runs on the ids when their cache
// entry holds no value under tag yet, and its result is kept in the entry
// (one value an entry, the last tag's, counted against CacheMaxBytes at 8
// bytes a word), so that a hit returns both for the cost of a lookup. tag
// must name everything the value depends on besides the ids; the entry
// keeps only its 128-bit keyed hash, so a long tag (one holding client
// input) costs the cache no more than a short one. A result the
// cache does not hold (too large, cache off) is derived on every call.
// derive must return a slice of its own, not tokens or a part of them.
//
// The ids of a call nobody shares (most long prompts: the cache keeps one
// only from its second sighting) are decoded into a pooled buffer, which
// the caller hands back with Release once done with them: an 8k-token
// answer's ids were a fresh 64 KiB each, over half of what the remote path
// allocated.
func (t *Tokenizer) TokenizeDerived(ctx context.Context, url string, h http.Header, req TokenizeRequest,
	tag string, derive func(tokens []uint64) []uint64) (DerivedAnswer, error) {
	buf := tokenScratch.Get().(*[]uint64)
	tokens, key, cached, owned, err := t.tokenize(ctx, target{url: url, h: h, into: buf}, req)
	if !owned { // a failed call is never owned
		recycleTokens(buf)
		buf = nil
	}
	if err != nil {
		return DerivedAnswer{Cached: cached}, err
	}
	a := DerivedAnswer{Tokens: tokens, Cached: cached, buf: buf}
	th := t.tagHash(tag)
	t.mu.Lock()
	if el, ok := t.items[key]; ok {
		if ce := el.Value.(*cacheEntry); ce.derived != nil && ce.derivedTag == th && sameSlice(ce.tokens, tokens) {
			a.Derived = ce.derived
			t.mu.Unlock()
			return a, nil
		}
	}
	t.mu.Unlock()
	t.derivations.Add(1)
	derived := derive(tokens)
	if cap(derived) > len(derived) {
		// Counted whole: keep no spare capacity.
		derived = append(make([]uint64, 0, len(derived)), derived...)
	}
	t.remember(key, tokens, th, derived)
	a.Derived = derived
	return a, nil
}

// DerivedAnswer is what TokenizeDerived returns. Neither slice may be
// modified: both may be shared.
type DerivedAnswer struct {
	Tokens  []uint64 // the prompt's ids
	Derived []uint64 // derive's value for them
	Cached  bool     // the ids came from the cache
	buf     *[]uint64
}

// Release hands the buffer of Tokens back for reuse when they were the
// caller's alone; Tokens must not be read after. Derived stays valid. It
// does nothing for shared ids, or when called again.
func (a *DerivedAnswer) Release() {
	if a.buf != nil {
		recycleTokens(a.buf)
		a.buf = nil
	}
	a.Tokens = nil
}

// recycleTokens puts a buffer of ids back in tokenScratch, unless it grew
// past what the pool keeps.
func recycleTokens(buf *[]uint64) {
	if cap(*buf) <= maxPooledTokens {
		*buf = (*buf)[:0]
		tokenScratch.Put(buf)
	}
}

// remember keeps derived, computed from tokens, in key's entry, if the
// cache still holds it with those very tokens and the entry fits the
// budget with it.
func (t *Tokenizer) remember(key cacheKey, tokens []uint64, tag tagHash, derived []uint64) {
	if derived == nil {
		derived = []uint64{} // nil means none in an entry
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.items[key]
	if !ok {
		return
	}
	ce := el.Value.(*cacheEntry)
	if !sameSlice(ce.tokens, tokens) {
		return
	}
	if entryCost(ce.tokens)+int64(len(derived))*8 > t.o.CacheMaxBytes {
		return
	}
	t.nbytes += int64(len(derived))*8 - int64(cap(ce.derived))*8
	ce.derivedTag, ce.derived = tag, derived
	t.evictLocked()
}

// sameSlice reports whether a and b are the same slice (not merely equal):
// an entry's value may only be paired with the ids it was derived from.
// Between the lookup that returned the ids and the lookup of their entry
// the entry may have been evicted and refilled by another call, whose ids
// need not be equal: the cache key does not name the engine, and during a
// rolling upgrade of tokenizers two engines may answer differently.
func sameSlice(a, b []uint64) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
