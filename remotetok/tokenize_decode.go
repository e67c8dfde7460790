package remotetok

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/llmgw/caddy-llmgw/internal/jsonlex"
)

// The /tokenize answer is decoded by a scanner made for its shape, vLLM's
//
//	{"count": N, "max_model_len": M, "tokens": [id, ...], "token_strs": null}
//
// rather than by encoding/json, which spent over a third of the gateway's
// CPU on 8k-token prompts (BENCHMARKS.md section 4) building a RawMessage
// of the ids and scanning them twice more. But for the bound on the ids
// (below), it accepts and rejects exactly what the encoding/json decoding
// it replaces did (FuzzTokenizeResponseDecoder
// checks that against the old code, FuzzParseTokenizeResponse against an
// independent oracle): the whole input must be valid JSON, nested no deeper
// than encoding/json's 10,000 levels; it must be an object; keys match
// case-insensitively (Unicode folding, as encoding/json) and the last of
// duplicate keys wins, except that a count or max_model_len of the wrong
// type rejects wherever it stands; tokens is required, an array of integers
// in [0, 2^64) written without fraction, exponent or sign; count, unless
// null, must equal their number. Other keys may hold any JSON. The one
// departure is deliberate: an answer of more ids than the caller's bound
// ([TokenizerOptions.MaxTokens]) is refused, which encoding/json decoded
// however large (the fuzz tests compare under the default bound of 2Mi
// ids, which takes 4 MiB of input to pass, far beyond their inputs).

// maxJSONDepth is encoding/json's nesting limit, kept so that the decoder
// rejects what encoding/json rejected.
const maxJSONDepth = 10000

// DefaultMaxTokenizeTokens is the default [TokenizerOptions.MaxTokens]:
// 2Mi token ids (16 MiB decoded), twice the longest context window of
// the models served today and more than the default 16 MiB response can
// hold of realistic ids.
const DefaultMaxTokenizeTokens = 2 << 20

// tokenScratch holds reusable buffers of ids: TokenizeDerived decodes
// into one (its caller hands it back), and other calls decode answers
// whose count does not come before their tokens there, then copy the ids
// once into a slice of their exact size (the result outlives the call, in
// the cache). vLLM sends count first, so that path is the exception.
var tokenScratch = sync.Pool{New: func() any { return new([]uint64) }}

// maxPooledTokens bounds the scratch buffers kept in tokenScratch (2 MiB).
const maxPooledTokens = 256 << 10

// tokenizeDecoder is the state of one decode. pending is an error about a
// tokens value, which a later tokens key supersedes; typeErr one about
// count or max_model_len, which stays.
type tokenizeDecoder struct {
	b          []byte
	i          int
	maxTokens  int
	tokens     []uint64
	haveTokens bool
	count      int64
	haveCount  bool
	pending    error
	typeErr    error

	// With res, the ids an earlier answer shares are copied, not decoded
	// (tokenize_resume.go): offs records where every res.stride-th id of
	// the array being read starts, fresh how many ids were decoded, and
	// arr, the last tokens array read whole (which a valid answer's ids
	// come from).
	res   *tokenResume
	offs  []int32
	fresh int
	arr   []byte

	// into, when set, is the caller's buffer: the ids are decoded there
	// (it is grown as needed and left holding them) instead of into a
	// slice of their own. See Tokenizer.lead.
	into *[]uint64
}

// decodeTokenizeResponse decodes a /tokenize answer of at most maxTokens
// ids. The result is never nil and does not alias raw.
func decodeTokenizeResponse(raw []byte, maxTokens int) ([]uint64, error) {
	return decodeTokenizeResume(raw, maxTokens, nil)
}

// decodeTokenizeResume is decodeTokenizeResponse resuming from the arrays
// res keeps, and offering it this answer's; res nil keeps none. The
// result is the same either way.
func decodeTokenizeResume(raw []byte, maxTokens int, res *tokenResume) ([]uint64, error) {
	return decodeTokenizeInto(raw, maxTokens, res, nil)
}

// decodeTokenizeInto is decodeTokenizeResume writing the ids into *into,
// when into is not nil: the result then aliases it.
func decodeTokenizeInto(raw []byte, maxTokens int, res *tokenResume, into *[]uint64) ([]uint64, error) {
	d := tokenizeDecoder{b: raw, maxTokens: maxTokens, res: res, into: into}
	toks, err := d.answer()
	if err == nil && res != nil && d.arr != nil {
		res.keep(d.arr, toks, d.offs, d.fresh)
	}
	return toks, err
}

// answer decodes the whole answer.
func (d *tokenizeDecoder) answer() ([]uint64, error) {
	d.ws()
	if err := d.top(); err != nil {
		return nil, err
	}
	if d.ws(); d.i < len(d.b) {
		return nil, d.syntax("after top-level value")
	}
	switch {
	case d.typeErr != nil:
		return nil, d.typeErr
	case !d.haveTokens:
		return nil, errors.New("tokenize: response has no tokens")
	case d.pending != nil:
		return nil, d.pending
	case d.haveCount && d.count != int64(len(d.tokens)):
		return nil, fmt.Errorf("tokenize: response count %d != %d tokens", d.count, len(d.tokens))
	}
	return d.tokens, nil
}

// top reads the top-level value: an object, or null (which has no tokens,
// as encoding/json leaves the struct empty); anything else is refused
// once it is known to be valid JSON.
func (d *tokenizeDecoder) top() error {
	switch d.peek() {
	case '{':
		return d.object()
	case 'n':
		return d.literal()
	}
	if err := d.skip(0); err != nil {
		return err
	}
	return errors.New("tokenize: decode response: not a JSON object")
}

// object reads the top-level object's members.
func (d *tokenizeDecoder) object() error {
	d.i++
	if d.ws(); d.peek() == '}' {
		d.i++
		return nil
	}
	for {
		k, i, err := jsonlex.Key(d.b, d.i)
		if d.i = i; err != nil {
			return d.lexErr(err)
		}
		d.ws()
		if err := d.member(d.keyName(k)); err != nil {
			return err
		}
		d.ws()
		switch d.peek() {
		case ',':
			d.i++
			d.ws()
		case '}':
			d.i++
			return nil
		default:
			return d.syntax("after object key:value pair")
		}
	}
}

// Which of the answer's fields a key names.
const (
	keyOther = iota
	keyTokens
	keyCount
	keyMaxModelLen
)

// keyName classifies the key k, folded as encoding/json matches keys to
// struct fields.
func (d *tokenizeDecoder) keyName(k jsonlex.String) int {
	name := d.b[k.Start:k.End]
	if k.Escaped {
		name = jsonlex.AppendString(nil, d.b, k)
	}
	switch {
	case bytes.EqualFold(name, []byte("tokens")):
		return keyTokens
	case bytes.EqualFold(name, []byte("count")):
		return keyCount
	case bytes.EqualFold(name, []byte("max_model_len")):
		return keyMaxModelLen
	}
	return keyOther
}

// member reads one member's value, the cursor on its first byte.
func (d *tokenizeDecoder) member(key int) error {
	switch key {
	case keyTokens:
		return d.tokenList()
	case keyCount, keyMaxModelLen:
		v, ok, err := d.int64OrNull()
		if err != nil {
			return err
		}
		if !ok && d.typeErr == nil {
			name := "count"
			if key == keyMaxModelLen {
				name = "max_model_len"
			}
			d.typeErr = fmt.Errorf("tokenize: decode response: %s is not an integer", name)
		}
		if key == keyCount {
			d.count, d.haveCount = v.n, ok && !v.null
		}
		return nil
	}
	return d.skip(1)
}

// nullableInt is a decoded integer, or null.
type nullableInt struct {
	n    int64
	null bool
}

// int64OrNull reads a value that should be null or an integer fitting an
// int64 (what encoding/json decodes into an int); ok false when it is
// valid JSON of another kind or range.
func (d *tokenizeDecoder) int64OrNull() (v nullableInt, ok bool, err error) {
	start := d.i
	if d.peek() == 'n' {
		return nullableInt{null: true}, true, d.literal()
	}
	if err := d.skip(1); err != nil {
		return v, false, err
	}
	n, ok := jsonlex.ParseInt64(d.b[start:d.i])
	return nullableInt{n: n}, ok, nil
}

// tokenList reads a tokens value. One that is not an array of plain
// non-negative integers is still validated as JSON, and noted in pending:
// a later tokens key replaces it, as the last of duplicate keys wins.
func (d *tokenizeDecoder) tokenList() error {
	start := d.i
	d.haveTokens, d.tokens, d.pending = true, nil, nil
	var scratch *[]uint64
	switch {
	case d.into != nil:
		d.tokens = d.intoBuffer(d.b[d.i:])
	case d.peek() == '[':
		d.tokens, scratch = d.buffer(d.b[d.i:])
	}
	toks, reason, fatal := d.ids(d.tokens)
	if d.into != nil {
		*d.into = toks[:0] // keep the array, grown or not, for the caller
	}
	if scratch != nil {
		if reason == nil {
			// The result outlives the call (in the cache): its own
			// slice, of exactly its size.
			d.tokens = append(make([]uint64, 0, len(toks)), toks...)
		}
		*scratch = toks
		recycleTokens(scratch)
	} else {
		d.tokens = toks
	}
	if reason == nil {
		return nil
	}
	d.tokens = nil
	if fatal {
		return reason
	}
	d.i = start
	if err := d.skip(1); err != nil {
		return err
	}
	d.pending = reason
	return nil
}

// ids appends to out the ids of an array of token ids, on the fast path.
// On anything else it gives the reason, with the cursor anywhere:
// tokenList re-reads the value as generic JSON. fatal marks a reason no
// later key can undo (too many ids for the bound).
func (d *tokenizeDecoder) ids(out []uint64) (toks []uint64, reason error, fatal bool) {
	b := d.b
	d.arr, d.offs, d.fresh = nil, d.offs[:0], 0 // set again once this array is read whole
	switch d.peek() {
	case '[':
	case 'n':
		return out, errors.New("tokenize: response has no tokens"), false
	default:
		return out, errors.New("tokenize: decode response: tokens is not an array"), false
	}
	arr := d.i
	i := skipJSONSpace(b, d.i+1)
	if i < len(b) && b[i] == ']' {
		d.i = i + 1
		return out, nil, false
	}
	if d.res != nil {
		if ids, offs, at := d.res.lookup(b[arr:]); len(ids) > 0 && len(out)+len(ids) <= d.maxTokens {
			// at is where the kept array's next id starts, after any
			// space past its comma; this one may have more space there.
			out, d.offs, i = append(out, ids...), append(d.offs, offs...), skipJSONSpace(b, arr+at)
		}
	}
	resumed := len(out)
	for {
		if len(out) >= d.maxTokens {
			return out, fmt.Errorf("tokenize: response has more than %d tokens", d.maxTokens), true
		}
		if d.res != nil && len(out)%d.res.stride == 0 {
			d.offs = append(d.offs, int32(i-arr))
		}
		start := i
		v, end := jsonlex.UintDigits(b, i) // inlined, as is UintFits
		if i = end; !jsonlex.UintFits(b, start, end) {
			if err := d.idSlow(&v, start, end, len(out)); err != nil {
				return out, err, false
			}
		}
		if i < len(b) && b[i] != ',' && b[i] != ']' {
			i = skipJSONSpace(b, i)
		}
		if i >= len(b) || (b[i] != ',' && b[i] != ']') {
			return out, fmt.Errorf("tokenize: decode response: token %d is not a non-negative integer", len(out)), false
		}
		out = append(out, v)
		if b[i] == ']' {
			d.i = i + 1
			d.arr, d.fresh = b[arr:d.i], len(out)-resumed
			return out, nil, false
		}
		if i++; i < len(b) && (b[i] < '0' || b[i] > '9') {
			i = skipJSONSpace(b, i)
		}
	}
}

// idSlow reads the id b[start:end] that is none, or of 20 digits or
// more, or has a leading zero, with jsonlex.Uint; n is its index, for
// the error.
func (d *tokenizeDecoder) idSlow(v *uint64, start, end, n int) error {
	var ok bool
	if *v, _, ok = jsonlex.Uint(d.b, start); ok {
		return nil
	}
	if end == start || d.b[start] == '0' {
		return fmt.Errorf("tokenize: decode response: token %d is not a non-negative integer", n)
	}
	return fmt.Errorf("tokenize: decode response: token %d overflows uint64", n)
}

// buffer is where the ids of the array arr starts are decoded: a slice of
// exactly count's size when a plausible count came first (vLLM sends it
// first, so the one allocation is the result itself), else a pooled
// scratch buffer, returned with the pointer to give back.
//
// Plausible is at most maxTokens and at most what the array's bytes can
// hold: "[" and "]" and, for each id, a digit and a comma but the last,
// so n ids take 2n+1 bytes at least. The array ends at or after the
// first ']' (an array of ids holds none, any other array falls back on
// the scratch buffer at worst), so a count that could only be honoured
// by bytes after it, padding in another key, is not believed. The
// allocation is then at most four times the array's bytes, what an
// honest answer of one-digit ids costs, and at most 8*maxTokens. Finding
// the ']' is one memchr over bytes the decoder reads next anyway.
func (d *tokenizeDecoder) buffer(arr []byte) ([]uint64, *[]uint64) {
	if d.plausibleCount(arr) {
		return make([]uint64, 0, d.count), nil
	}
	p := tokenScratch.Get().(*[]uint64)
	return (*p)[:0], p
}

// plausibleCount reports whether the answer's count came before the
// array arr starts and is plausible for it (see buffer).
func (d *tokenizeDecoder) plausibleCount(arr []byte) bool {
	if !d.haveCount || d.count < 0 || d.count > int64(d.maxTokens) {
		return false
	}
	end := bytes.IndexByte(arr, ']')
	return end >= 0 && d.count <= int64(end/2)
}

// intoBuffer is the caller's buffer, emptied, with room for a plausible
// count (as buffer judges it) so that decoding does not grow it by copies.
func (d *tokenizeDecoder) intoBuffer(arr []byte) []uint64 {
	buf := (*d.into)[:0]
	if d.count > int64(cap(buf)) && d.plausibleCount(arr) {
		buf = make([]uint64, 0, d.count)
	}
	return buf
}

func (d *tokenizeDecoder) ws() { d.i = skipJSONSpace(d.b, d.i) }

// peek is the byte at the cursor, 0 at the end.
func (d *tokenizeDecoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// syntax is a malformed-JSON error at the cursor.
func (d *tokenizeDecoder) syntax(context string) error {
	if d.i >= len(d.b) {
		return errors.New("tokenize: decode response: unexpected end of JSON input")
	}
	return fmt.Errorf("tokenize: decode response: invalid character %q %s (at byte %d)", d.b[d.i], context, d.i)
}

// skip validates and steps over one value, depth containers being open
// around it, nested no deeper than encoding/json's limit.
func (d *tokenizeDecoder) skip(depth int) (err error) {
	if d.i, err = jsonlex.Skip(d.b, d.i, depth, maxJSONDepth); err != nil {
		return d.lexErr(err)
	}
	return nil
}

// lexErr is the lexer's error about malformed JSON, in this decoder's
// words.
func (d *tokenizeDecoder) lexErr(err error) error {
	var e *jsonlex.Error
	if errors.As(err, &e) {
		return fmt.Errorf("tokenize: decode response: %s (at byte %d)", e.Msg, e.Off)
	}
	return err
}

// literal steps over the true, false or null at the cursor.
func (d *tokenizeDecoder) literal() (err error) {
	if d.i, err = jsonlex.Literal(d.b, d.i); err != nil {
		return d.lexErr(err)
	}
	return nil
}
