package fleet

import (
	"slices"
	"unsafe"

	"github.com/llmgw/caddy-llmgw/internal/bytescan"
	"github.com/llmgw/caddy-llmgw/internal/sighting"
	"github.com/llmgw/caddy-llmgw/kvindex"
)

// A block key is a hash chained over every token before the block's end,
// so a prompt's keys are hashed in order, all of them, for every request:
// 512 blocks for an 8k-token prompt, 8192 for 128k (about 0.2 ms). Prompts
// that share their first blocks (a system prompt, a document with a new
// question after it, a conversation's history) share those blocks' keys,
// so the fleet keeps recent prompts' ids and keys: a prompt whose first
// block matches a kept one's takes the keys of the whole blocks the two
// share, found by comparing ids, and hashes only the blocks after them.
// Exact by construction: equal ids under the same block size, adapter and
// salt hash to equal keys.

// keyKeep is the set of kept prompts, one per first block key (which names
// the block size, adapter and salt too: they are in its hash or its
// length; the entry also records them, so a hash collision costs nothing
// but a miss). A prompt is kept from its first block's second sighting,
// so that traffic sharing no prefix costs a record a prompt, not a copy of
// its ids. It is safe for concurrent use.
type keyKeep struct {
	minBlocks int // shorter prompts are hashed whole and not kept
	kept      *sighting.Keep[*keptKeys]
}

// maxSeenPrompts bounds the first keys recorded as offered once (8 bytes
// and a map slot each).
const maxSeenPrompts = 1 << 16

// keptKeys is one kept prompt; never changed once made.
type keptKeys struct {
	blockSize  int
	lora, salt string
	tokens     []uint64 // a copy of its ids in whole blocks
	keys       []uint64 // its block keys (shared with decisions: nobody modifies them)
}

// Production settings: prompts of 32 blocks and more (512 tokens at 16),
// 8 MiB kept at most (four 128k-token prompts, sixty 8k ones).
const (
	keyKeepMinBlocks = 32
	keyKeepBudget    = 8 << 20
)

func newKeyKeep() *keyKeep {
	return &keyKeep{minBlocks: keyKeepMinBlocks, kept: sighting.NewKeep[*keptKeys](keyKeepBudget, maxSeenPrompts)}
}

func (e *keptKeys) cost() int {
	return 8*len(e.keys) + 8*len(e.tokens) + len(e.lora) + len(e.salt) + 96
}

// blockKeys are the prompt's block keys at blockSize for an adapter and
// salt, in a slice of exactly their number (nil when they cannot be had):
// the keys of the blocks it shares with a kept prompt copied, the rest
// hashed. A kept prompt keeps a copy of tokens: callers' ids are in
// buffers reused once a decision is made. The returned keys must not be
// modified.
func (k *keyKeep) blockKeys(tokens []uint64, blockSize int, lora, salt string) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	n := len(tokens) / blockSize
	spec := kvindex.KeySpec{BlockSize: blockSize, LoRAName: lora, CacheSalt: salt}
	keys, err := kvindex.RequestKeys(make([]uint64, 0, n), tokens[:min(len(tokens), blockSize)], spec)
	if err != nil {
		return nil
	}
	if n < k.minBlocks {
		if keys, err = kvindex.ContinueRequestKeys(keys, tokens, spec); err != nil {
			return nil
		}
		return keys
	}
	reused := 0
	if e, ok := k.kept.Get(keys[0]); ok && e.blockSize == blockSize && e.lora == lora && e.salt == salt {
		// keys[0] equals e.keys[0]: the first block's ids are the
		// same (but for a hash collision, which the comparison finds).
		if shared := min(sharedIDs(e.tokens, tokens)/blockSize, len(e.keys)); shared > 1 {
			keys, reused = append(keys[:0], e.keys[:shared]...), shared
		}
	}
	if keys, err = kvindex.ContinueRequestKeys(keys, tokens, spec); err != nil {
		return nil
	}
	if 4*(n-reused) >= n {
		// Mostly new to the kept prompt it would replace: keep it.
		k.keep(&keptKeys{blockSize: blockSize, lora: lora, salt: salt, tokens: tokens[:n*blockSize], keys: keys})
	}
	return keys
}

// keep offers e under its first key, with a copy of its ids.
func (k *keyKeep) keep(e *keptKeys) {
	k.kept.Offer(e.keys[0], e.cost(), func() *keptKeys {
		e.tokens = slices.Clone(e.tokens)
		return e
	})
}

// sharedIDs is how many leading ids a and b have in common, compared as
// memory (bytescan.CommonPrefix): their common bytes, counted in whole
// ids, are the ids before the first that differs.
func sharedIDs(a, b []uint64) int {
	asBytes := func(ids []uint64) []byte {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 8*len(ids)) // read only
	}
	return bytescan.CommonPrefix(asBytes(a), asBytes(b)) / 8
}
