package remotetok

import (
	"bytes"
	"container/list"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/httpbody"
	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
	"github.com/llmgw/caddy-llmgw/internal/sighting"
	"github.com/llmgw/caddy-llmgw/remotetok/internal/h1client"
)

// TokenizerOptions tunes a [Tokenizer]. Zero fields take the defaults.
type TokenizerOptions struct {
	// Timeout bounds one /tokenize call; default 500ms.
	Timeout time.Duration
	// MaxConcurrent bounds the /tokenize calls in flight; a call beyond it
	// fails at once with [ErrTokenizerBusy]. Default 64.
	MaxConcurrent int
	// CacheEntries bounds the LRU cache's entry count; default 4096.
	// Negative disables the cache.
	CacheEntries int
	// CacheMaxBytes bounds the memory the cache holds: each entry counts
	// its token ids (8 bytes each) plus [TokenizeCacheEntryOverhead].
	// Default [DefaultTokenizeCacheBytes]. A result larger than the whole
	// budget is not cached.
	CacheMaxBytes int64
	// MaxResponseBytes limits a /tokenize response; default 16 MiB.
	MaxResponseBytes int64
	// MaxTokens limits the token ids of one response; default
	// [DefaultMaxTokenizeTokens].
	MaxTokens int
	// Client makes the calls; default a dedicated client whose idle
	// connections [Tokenizer.Close] closes: for http:// engines, calls
	// made on the caller's goroutine (remotetok/internal/h1client); for https://
	// ones, a net/http Transport of its own.
	Client *http.Client
}

// DefaultTokenizeCacheBytes is the default [TokenizerOptions.CacheMaxBytes]:
// 32 MiB, 512 results of 8k tokens or 4096 of 1k. The cache only saves
// repeats of a whole request (retries, identical prompts), and the Go heap
// grows to about twice what is live, so a larger default mostly costs RSS.
const DefaultTokenizeCacheBytes = 32 << 20

// A result of at least cacheFromSecondIDs ids enters the cache only when
// its request comes a second time. Most requests are never repeated (a
// chat's next turn is a new request), and a long one kept on its first
// sighting costs 8 bytes an id until evicted: unique 8k-token chats filled
// the 32 MiB budget with answers that never hit, pushing out those that
// did, and the collector's headroom doubled what they held. A repeated
// long prompt pays for one more call, on its second sighting; shorter
// results are cheap to keep and are kept at once. The record of first
// sightings holds at most maxSeenRequests keys, 8 bytes each.
const (
	cacheFromSecondIDs = 512
	maxSeenRequests    = 1 << 16
)

// TokenizeCacheEntryOverhead is what one cache entry costs besides its
// token ids (the entry, its list element and map slot), counted against
// [TokenizerOptions.CacheMaxBytes] so that many tiny results cannot exceed
// the budget either.
const TokenizeCacheEntryOverhead = 128

// ErrTokenizerBusy is returned when MaxConcurrent calls are already in flight.
var ErrTokenizerBusy = errors.New("tokenize: too many concurrent calls")

// TokenizeRequest is one /tokenize request: either Prompt (completion style)
// or Messages (chat style), not both. Nil/empty fields are not sent, so the
// engine's defaults apply (vLLM: add_special_tokens=true for prompts; for
// chat add_generation_prompt=true, continue_final_message=false,
// add_special_tokens=false). Fields that change the rendered prompt (Tools,
// ChatTemplateKwargs, ChatTemplate) must be copied from the client request so
// the tokens equal what the engine hashes.
type TokenizeRequest struct {
	Model                string
	Prompt               json.RawMessage
	Messages             json.RawMessage
	AddGenerationPrompt  *bool
	ContinueFinalMessage *bool
	AddSpecialTokens     *bool
	ChatTemplate         string
	ChatTemplateKwargs   json.RawMessage
	Tools                json.RawMessage
	// Verbatim says the raw fields are each one valid JSON value of the
	// right kind, as openai.ParseRequest leaves them (it validated the
	// whole client body): they are then copied into the /tokenize body
	// as they are, neither validated nor compacted again. Encoding them
	// with encoding/json was 10% of the gateway's CPU on 8k-token
	// prompts. Without it the fields are validated and compacted, and
	// malformed ones are refused before any call.
	Verbatim bool
}

type tokenizeWire struct {
	Model                string          `json:"model,omitempty"`
	Prompt               json.RawMessage `json:"prompt,omitempty"`
	Messages             json.RawMessage `json:"messages,omitempty"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage *bool           `json:"continue_final_message,omitempty"`
	AddSpecialTokens     *bool           `json:"add_special_tokens,omitempty"`
	ChatTemplate         string          `json:"chat_template,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	verbatim             bool            // see TokenizeRequest.Verbatim
}

// validate checks the Prompt/Messages choice (JSON validity is checked when
// the body is encoded, on a cache miss).
func (r TokenizeRequest) validate() error {
	if (len(r.Prompt) > 0) == (len(r.Messages) > 0) {
		return errors.New("tokenize: exactly one of prompt or messages must be set")
	}
	return nil
}

// wire returns the fields actually sent: chat-only fields are dropped for
// prompts (the completion-style endpoint does not take them).
func (r TokenizeRequest) wire() tokenizeWire {
	w := tokenizeWire{Model: r.Model, AddSpecialTokens: r.AddSpecialTokens, verbatim: r.Verbatim}
	if len(r.Prompt) > 0 {
		w.Prompt = r.Prompt
		return w
	}
	w.Messages = r.Messages
	w.AddGenerationPrompt = r.AddGenerationPrompt
	w.ContinueFinalMessage = r.ContinueFinalMessage
	w.ChatTemplate = r.ChatTemplate
	w.ChatTemplateKwargs = r.ChatTemplateKwargs
	w.Tools = r.Tools
	return w
}

// body encodes the request body (fixed field order, unset fields omitted).
// Verbatim raw fields are copied as they are; otherwise encoding/json
// validates and compacts them.
func (w tokenizeWire) body() ([]byte, error) {
	if w.verbatim {
		return w.appendBody(nil), nil
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("tokenize: encode request: %w", err)
	}
	return b, nil
}

// sharedBody is body in a form the call can hand back when done: a pooled
// buffer for a verbatim body that is long or goes out through the
// synchronous client, which copies it into its own write buffer
// (tokenize_reqbody.go). The caller releases it.
func (w *tokenizeWire) sharedBody(synchronous bool) (*sharedBody, error) {
	if w.verbatim && (synchronous || w.bodySize() >= minPooledRequest) {
		return newSharedBody(w.appendBody), nil
	}
	if w.verbatim {
		return plainBody(w.appendBody(nil)), nil
	}
	b, err := w.body()
	if err != nil {
		return nil, err
	}
	return plainBody(b), nil
}

// key hashes exactly the fields that are sent, each tagged and
// length-prefixed, byte for byte: identical requests share a key whatever
// the URL, and building it costs no JSON work on the cache-hit path. (JSON
// whitespace is therefore significant: a differently formatted but
// equivalent request is a miss, never a wrong hit.)
func (t *Tokenizer) key(w *tokenizeWire) cacheKey {
	var k cacheKey
	for i := range k {
		var h maphash.Hash
		h.SetSeed(t.seeds[i])
		var n [binary.MaxVarintLen64 + 1]byte
		length := func(tag byte, size int) {
			n[0] = tag
			h.Write(binary.AppendUvarint(n[:1], uint64(size)))
		}
		w.eachField(wireFields{
			raw: func(_ string, tag byte, b []byte) {
				length(tag, len(b))
				h.Write(b)
			},
			str: func(_ string, tag byte, s string) {
				length(tag, len(s))
				h.WriteString(s)
			},
			flag: func(_ string, tag byte, b *bool) {
				v := byte(0)
				if b != nil {
					v = 1
					if *b {
						v = 2
					}
				}
				h.Write([]byte{tag, v})
			},
		})
		k[i] = h.Sum64()
	}
	return k
}

// cacheKey is a 128-bit keyed hash of the request's fields. The per-process
// random seeds make collisions impossible to craft from outside.
type cacheKey [2]uint64

type cacheEntry struct {
	key    cacheKey
	tokens []uint64
	// derived is a value computed from tokens under the tag whose hash
	// is derivedTag (the fleet's block keys), kept so that a hit costs a
	// lookup; see TokenizeDerived. Its cost is counted with the entry's.
	// The tag is kept as a fixed-size hash, not as the string: it holds
	// client input (the fleet's includes cache_salt, as long as the body
	// limit allows), which would otherwise be held uncounted by
	// CacheMaxBytes.
	derivedTag tagHash
	derived    []uint64
}

// tagHash is a 128-bit keyed hash of a TokenizeDerived tag, as cacheKey is
// of a request.
type tagHash [2]uint64

// tagHash hashes a TokenizeDerived tag with the cache's seeds.
func (t *Tokenizer) tagHash(tag string) tagHash {
	return tagHash{maphash.String(t.seeds[0], tag), maphash.String(t.seeds[1], tag)}
}

// cost is what the entry counts against CacheMaxBytes.
func (ce *cacheEntry) cost() int64 { return entryCost(ce.tokens) + int64(cap(ce.derived))*8 }

// target is where a /tokenize call goes, and where its ids are decoded.
type target struct {
	url string
	h   http.Header
	// into is the caller's buffer for the ids, or nil for a slice of
	// their own. The leader of a call decodes there, and its caller
	// owns the result unless it had to be shared (see lead).
	into *[]uint64
}

// call is one in-flight /tokenize call that identical requests share.
type call struct {
	done      chan struct{}
	tokens    []uint64
	err       error
	followers int // callers waiting for this one's result (t.mu)
	// retry: the leader's own context ended the call, so followers whose
	// contexts are still live should try again rather than inherit that.
	retry bool
}

// Tokenizer is a concurrency-limited /tokenize client with a bounded LRU
// cache keyed by the request's fields (independent of the URL: all
// replicas of a model tokenize alike, so repeated system prompts and
// multi-turn conversations hit it whichever replica served them). Identical
// concurrent requests share one call. Safe for concurrent use.
type Tokenizer struct {
	o         TokenizerOptions
	client    *http.Client
	h1        *h1client.Client // the default client's calls to http:// engines; nil with Options.Client
	ownClient bool
	closed    atomic.Bool // Close was called: calls close their connection when done
	sem       chan struct{}
	seeds     [2]maphash.Seed

	mu     sync.Mutex
	lru    list.List // of *cacheEntry, front = most recent
	items  map[cacheKey]*list.Element
	ntoks  int   // token ids held by the cache
	nbytes int64 // their cost against CacheMaxBytes
	flight map[cacheKey]*call

	hits, misses, errs, shared, rejected atomic.Uint64
	inflight                             atomic.Int64
	derivations                          atomic.Uint64 // derive calls of TokenizeDerived

	// resume keeps recent answers' ids so that an answer sharing their
	// first bytes is decoded from where it differs (tokenize_resume.go);
	// nil when the cache is off, which keeps nothing of the prompts.
	resume *tokenResume
	// seen records the requests whose long results were not kept, so
	// that they are kept when they come again (cacheFromSecondIDs); nil
	// when the cache is off.
	seen *sighting.Seen
}

// NewTokenizer returns a Tokenizer; it starts no goroutines.
func NewTokenizer(o TokenizerOptions) *Tokenizer {
	if o.Timeout <= 0 {
		o.Timeout = 500 * time.Millisecond
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 64
	}
	if o.CacheEntries == 0 {
		o.CacheEntries = 4096
	}
	if o.CacheMaxBytes <= 0 {
		o.CacheMaxBytes = DefaultTokenizeCacheBytes
	}
	if o.MaxResponseBytes <= 0 {
		o.MaxResponseBytes = 16 << 20
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = DefaultMaxTokenizeTokens
	}
	t := &Tokenizer{
		o:      o,
		client: o.Client,
		sem:    make(chan struct{}, o.MaxConcurrent),
		seeds:  [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		items:  make(map[cacheKey]*list.Element),
		flight: make(map[cacheKey]*call),
	}
	if o.CacheEntries >= 0 {
		t.resume = newTokenResume()
		t.seen = sighting.NewSeen(maxSeenRequests)
	}
	if t.client == nil {
		t.ownClient = true
		t.h1, t.client = newTokenizeClients(o)
	}
	return t
}

// newTokenizeClients are the default clients of a Tokenizer with options
// o: one for http:// engines, one for https:// ones.
//
// Calls to http:// engines, all of them in practice, are made on the
// caller's goroutine (remotetok/internal/h1client): net/http's Transport handed each
// call between the caller and the two goroutines of its connection, some
// 15–25 µs of CPU per call. Its idle connections hold no goroutine, only a
// socket and a 4 KiB read buffer. Both clients dial, keep alive and bound
// their idle connections alike.
//
// In the Transport, serving https:// engines, each idle keep-alive
// connection holds two goroutines (its read and write loops) until
// IdleConnTimeout or Close, and a tokenizeWriteBuffer (with its read
// buffer and goroutines, some 84 KiB), so idle connections are capped in
// all, not only per engine. Calls go to the least busy engine, so they
// spread over the fleet: on the overhead bench's 4 engines 75 connections
// stayed idle, and on 64 engines up to 32 each (2048, 170 MiB) could have.
// The cap, twice the calls that can be in flight at once, leaves room for
// a call to find a connection to whichever engine it picks.
func newTokenizeClients(o TokenizerOptions) (*h1client.Client, *http.Client) {
	const dialTimeout, keepAlive, idleTimeout = 3 * time.Second, 30 * time.Second, 90 * time.Second
	maxIdle, maxIdlePerHost := 2*o.MaxConcurrent, min(o.MaxConcurrent, 32)
	h1, err := h1client.New(h1client.Options{
		DialTimeout:    dialTimeout,
		KeepAlive:      keepAlive,
		IdleTimeout:    idleTimeout,
		MaxIdle:        maxIdle,
		MaxIdlePerHost: maxIdlePerHost,
		Header:         http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json"}},
	})
	if err != nil {
		panic("remotetok: the tokenize client's fixed headers: " + err.Error()) // constants: a programming error
	}
	return h1, &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: keepAlive}).DialContext,
		MaxIdleConns:        maxIdle,
		MaxIdleConnsPerHost: maxIdlePerHost,
		IdleConnTimeout:     idleTimeout,
		WriteBufferSize:     tokenizeWriteBuffer,
	}}
}

// tokenizeWriteBuffer is the default client's write buffer per
// connection. A request whose headers and body fit (a chat of up to some
// 15k tokens) leaves in one write; with the transport's 4 KiB default it
// took two, the body's through a 32 KiB copy buffer allocated per call.
// Longer bodies (pooled, see tokenize_reqbody.go) are written as before.
const tokenizeWriteBuffer = minPooledRequest

// Close releases the default client's connections: the idle ones at once,
// those of calls in flight as each call ends. The Tokenizer stays usable,
// but from then on every call's connection is closed after it (a closed
// Tokenizer is being dropped: a replaced config, a destroyed fleet).
// A caller-supplied Client is left alone.
func (t *Tokenizer) Close() {
	if t.ownClient {
		t.closed.Store(true)
		t.client.CloseIdleConnections()
		t.h1.Close()
	}
}

// TokenizerStats are cumulative counters (InFlight, Entries, CachedTokens
// and CachedBytes are current values).
type TokenizerStats struct {
	Hits, Misses, Errors uint64 // cache hits; calls made; calls failed
	Shared               uint64 // requests that joined an identical in-flight call
	Rejected             uint64 // requests refused with ErrTokenizerBusy
	Derived              uint64 // values TokenizeDerived computed (not found in the cache)
	InFlight             int64  // calls in flight
	Entries              int    // cached entries
	CachedTokens         int    // token ids held by the cache
	CachedBytes          int64  // their cost against CacheMaxBytes
}

// Stats returns the tokenizer's counters.
func (t *Tokenizer) Stats() TokenizerStats {
	t.mu.Lock()
	n, toks, size := len(t.items), t.ntoks, t.nbytes
	t.mu.Unlock()
	return TokenizerStats{
		Hits: t.hits.Load(), Misses: t.misses.Load(), Errors: t.errs.Load(),
		Shared: t.shared.Load(), Rejected: t.rejected.Load(), Derived: t.derivations.Load(), InFlight: t.inflight.Load(),
		Entries: n, CachedTokens: toks, CachedBytes: size,
	}
}

// Tokenize returns the engine's token ids for req by POSTing to url (an
// engine's /tokenize) with the extra headers h. cached reports a cache hit.
// The returned slice may be shared with the cache and other callers: it
// must not be modified.
func (t *Tokenizer) Tokenize(ctx context.Context, url string, h http.Header, req TokenizeRequest) (tokens []uint64, cached bool, err error) {
	tokens, _, cached, _, err = t.tokenize(ctx, target{url: url, h: h}, req)
	return tokens, cached, err
}

// TokenizeFresh is Tokenize without the cache: the engine answers, within
// the same bound on concurrent calls, and the answer is not kept. A local
// tokenizer's drift check wants the engine's ids of now, for a prompt no
// other request is likely to send: answered from the cache it could
// compare with a stale answer, and kept it would fill the cache with
// sampled prompts.
func (t *Tokenizer) TokenizeFresh(ctx context.Context, url string, h http.Header, req TokenizeRequest) ([]uint64, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	w := req.wire()
	body, err := w.sharedBody(t.synchronous(url))
	if err != nil {
		return nil, err
	}
	defer body.release()
	select {
	case t.sem <- struct{}{}:
	default:
		t.rejected.Add(1)
		return nil, ErrTokenizerBusy
	}
	defer func() { <-t.sem }()
	return t.call(ctx, target{url: url, h: h}, body)
}

// call makes one /tokenize call, counted in the stats; the caller holds a
// slot of t.sem.
func (t *Tokenizer) call(ctx context.Context, tg target, body *sharedBody) ([]uint64, error) {
	t.misses.Add(1)
	t.inflight.Add(1)
	toks, err := t.fetch(ctx, tg, body)
	t.inflight.Add(-1)
	if t.closed.Load() {
		// Close ran while this call held its connection, which has
		// just gone back to the idle pool: close it (fetch returned
		// after putting it there, so this sees it).
		t.client.CloseIdleConnections()
	}
	if err != nil {
		t.errs.Add(1)
	}
	return toks, err
}

// tokenize is Tokenize that also returns the request's cache key, and
// whether the ids are the caller's own, in tg.into (see lead).
func (t *Tokenizer) tokenize(ctx context.Context, tg target, req TokenizeRequest) (tokens []uint64, key cacheKey, cached, owned bool, err error) {
	if err := req.validate(); err != nil {
		return nil, key, false, false, err
	}
	w := req.wire()
	key = t.key(&w)
	tokens, cached, owned, err = t.lookupOrCall(ctx, key, tg, &w)
	return tokens, key, cached, owned, err
}

// lookupOrCall answers key from the cache, or joins the identical call in
// flight, or makes the call.
func (t *Tokenizer) lookupOrCall(ctx context.Context, key cacheKey, tg target, w *tokenizeWire) (toks []uint64, cached, owned bool, err error) {
	for {
		t.mu.Lock()
		if el, ok := t.items[key]; ok {
			t.lru.MoveToFront(el)
			toks := el.Value.(*cacheEntry).tokens
			t.mu.Unlock()
			t.hits.Add(1)
			return toks, true, false, nil
		}
		if c, ok := t.flight[key]; ok {
			c.followers++
			t.mu.Unlock()
			t.shared.Add(1)
			select {
			case <-c.done:
			case <-ctx.Done():
				return nil, false, false, fmt.Errorf("tokenize: %w", ctx.Err())
			}
			if c.retry {
				if ctx.Err() == nil {
					continue
				}
				return nil, false, false, fmt.Errorf("tokenize: %w", ctx.Err())
			}
			return c.tokens, false, false, c.err
		}
		select {
		case t.sem <- struct{}{}:
		default:
			t.mu.Unlock()
			t.rejected.Add(1)
			return nil, false, false, ErrTokenizerBusy
		}
		c := &call{done: make(chan struct{})}
		t.flight[key] = c
		t.mu.Unlock()
		toks, owned, err := t.lead(ctx, key, c, tg, w)
		return toks, false, owned, err
	}
}

// lead performs the shared call for key and publishes its result. With
// tg.into the ids are decoded into the caller's buffer, and owned reports
// that they stayed there, the caller's alone: not when the cache keeps
// them or other callers joined the call, which then get a copy of their
// own, so that the caller may reuse its buffer once done.
func (t *Tokenizer) lead(ctx context.Context, key cacheKey, c *call, tg target, w *tokenizeWire) (toks []uint64, owned bool, err error) {
	if body, err := w.sharedBody(t.synchronous(tg.url)); err != nil {
		c.err = err
		t.errs.Add(1)
	} else {
		c.tokens, c.err = t.call(ctx, tg, body)
		body.release()
	}
	<-t.sem
	if c.err != nil {
		c.retry = ctx.Err() != nil
	}
	owned = c.err == nil && tg.into != nil
	keep := c.err == nil && t.cacheable(c.tokens) && t.sightedBefore(key, c.tokens)
	if keep && (owned || cap(c.tokens) > len(c.tokens)) {
		// The cache's own copy, exact: spare capacity (up to a quarter
		// when the decoder grew the slice) would be held uncounted.
		c.tokens, owned = append(make([]uint64, 0, len(c.tokens)), c.tokens...), false
	}
	t.mu.Lock()
	delete(t.flight, key)
	if keep {
		t.insert(key, c.tokens)
	}
	if owned && c.followers > 0 {
		c.tokens, owned = append([]uint64(nil), c.tokens...), false
	}
	t.mu.Unlock()
	close(c.done)
	return c.tokens, owned, c.err
}

// entryCost is what an entry holding toks counts against CacheMaxBytes:
// its backing array, whole, and the fixed overhead.
func entryCost(toks []uint64) int64 {
	return int64(cap(toks))*8 + TokenizeCacheEntryOverhead
}

// sightedBefore reports whether a result may be kept as to its request's
// sightings: a short one always, a long one when its request came before
// (and records that it came). See cacheFromSecondIDs.
func (t *Tokenizer) sightedBefore(key cacheKey, toks []uint64) bool {
	return len(toks) < cacheFromSecondIDs || t.seen.Again(key[0]^key[1])
}

// cacheable reports whether a result may enter the cache at all.
func (t *Tokenizer) cacheable(toks []uint64) bool {
	return t.o.CacheEntries >= 0 && int64(len(toks))*8+TokenizeCacheEntryOverhead <= t.o.CacheMaxBytes
}

// insert adds an entry and evicts least-recently-used ones until both
// bounds hold again. An entry that cannot fit even in an empty cache is
// not inserted (and evicts nothing). t.mu held.
func (t *Tokenizer) insert(key cacheKey, toks []uint64) {
	cost := entryCost(toks)
	if t.o.CacheEntries < 0 || cost > t.o.CacheMaxBytes {
		return
	}
	if _, ok := t.items[key]; ok {
		return
	}
	t.items[key] = t.lru.PushFront(&cacheEntry{key: key, tokens: toks})
	t.ntoks += len(toks)
	t.nbytes += cost
	t.evictLocked()
}

// evictLocked evicts least-recently-used entries until both bounds hold.
// t.mu held.
func (t *Tokenizer) evictLocked() {
	for len(t.items) > t.o.CacheEntries || t.nbytes > t.o.CacheMaxBytes {
		el := t.lru.Back()
		ce := el.Value.(*cacheEntry)
		t.lru.Remove(el)
		delete(t.items, ce.key)
		t.ntoks -= len(ce.tokens)
		t.nbytes -= ce.cost()
	}
}

func (t *Tokenizer) fetch(ctx context.Context, tg target, body *sharedBody) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, t.o.Timeout)
	defer cancel()
	url, h := tg.url, tg.h
	if t.synchronous(url) {
		// The call is over when Post returns: nothing reads the body
		// after, so the caller may release it.
		var toks []uint64
		var aerr error // the answer's own error, already worded
		err := t.h1.Post(ctx, url, h, body.b, func(r *h1client.Response) error {
			toks, aerr = t.answer(r.StatusCode, r.ContentLength, r.Body, tg.into)
			return aerr
		})
		switch {
		case aerr != nil:
			return nil, aerr
		case err != nil:
			return nil, fmt.Errorf("tokenize: %w", err)
		}
		return toks, nil
	}
	req, err := body.request(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("tokenize: request: %w", err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	// /tokenize changes nothing, so the transport may retry it on a new
	// connection when a pooled one turns out dead before any response (an
	// engine that restarted, or closed it idle). A nil key marks the
	// request idempotent without sending the header.
	req.Header["Idempotency-Key"] = nil
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	defer resp.Body.Close()
	return t.answer(resp.StatusCode, resp.ContentLength, resp.Body, tg.into)
}

// synchronous reports whether a call to url is made by the h1client,
// whose calls are over when they return.
func (t *Tokenizer) synchronous(url string) bool {
	return t.h1 != nil && h1client.Supports(url)
}

// answer reads and decodes a /tokenize response: its status, declared
// length (-1 when unknown) and body; the ids go into *into when into is
// not nil.
func (t *Tokenizer) answer(status int, length int64, body io.Reader, into *[]uint64) ([]uint64, error) {
	if status != http.StatusOK {
		return nil, fmt.Errorf("tokenize: HTTP %d: %s", status, httpbody.Snippet(body))
	}
	bp := responseBufs.Get().(*[]byte)
	buf := *bp
	if length > 0 && length <= t.o.MaxResponseBytes {
		// Room for the whole answer and the read that sees its end, so
		// the buffer does not grow by copying; but no more than a pooled
		// buffer may hold, as Content-Length is only the engine's word
		// (one lying up to MaxResponseBytes would otherwise have it
		// allocated in full before a byte came): larger answers grow as
		// they arrive.
		if want := min(length+bytes.MinRead, maxPooledResponse); int64(cap(buf)) < want {
			buf = make([]byte, 0, want)
		}
	}
	raw, err := httpbody.ReadLimited(body, t.o.MaxResponseBytes, buf)
	var toks []uint64
	if err != nil {
		err = fmt.Errorf("tokenize: %w", err)
	} else {
		toks, err = decodeTokenizeInto(raw, t.o.MaxTokens, t.resume, into)
	}
	// The ids are in their own slice: nothing aliases raw any more.
	if cap(raw) <= maxPooledResponse {
		*bp = raw[:0]
		responseBufs.Put(bp)
	}
	return toks, err
}

// responseBufs are read buffers for /tokenize answers, reused: the answer
// is garbage once decoded, and reading a large one into a fresh growing
// buffer cost a copy per doubling on every call.
var responseBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledResponse bounds the buffers kept in responseBufs (4 MiB: an
// answer of some 600k ids).
const maxPooledResponse = 4 << 20

// skipJSONSpace returns the index of the first non-whitespace byte of b at
// or after i.
func skipJSONSpace(b []byte, i int) int { return jsonlex.SkipSpace(b, i) }
