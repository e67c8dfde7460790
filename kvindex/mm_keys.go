package kvindex

import (
	"errors"
	"fmt"
)

// Multimodal extra keys, as vLLM derives them. Checked against
// _gen_mm_extra_hash_keys and generate_block_hash_extra_keys in
// vllm/v1/core/kv_cache_utils.py as of late 2026 (after #36708: the
// version that also hashes prompt embeds and takes hash_block_size from
// prefix_match_unit; the code index it was read from records no commit),
// against the older one at bbf906a (bare identifiers, no offsets), and
// against vllm_golden.json's negative-offset case, generated from vLLM's
// own functions:
//
//   - a prompt's multimodal items are its placeholder spans (offset and
//     length in the prompt's token ids, sorted by offset), each with an
//     identifier: the client's uuid for the item, or vLLM's hash of the
//     item's data (for an image given as bytes, ImageBytesID);
//   - block [start, end) gets the tuple (identifier, offset-start) of every
//     item with offset < end and start < offset+length: an item that began
//     in an earlier block gets a negative offset, and one that ended
//     exactly at start is not the block's;
//   - the block's extra keys are the LoRA name, then those tuples in
//     order, then the cache salt on block 0 only (prompt embeds, which the
//     gateway does not key, come last).

// MMItem is one multimodal item of a prompt as the engine places it.
type MMItem struct {
	// ID is the item's identifier: the uuid the client gave the content
	// part, or the engine's hash of its data.
	ID string
	// Offset and Length are the span of the item's placeholder tokens in
	// the prompt's token ids.
	Offset, Length int
}

var errMMItems = errors.New("kvindex: multimodal items must have an identifier, a positive length and sorted, disjoint spans")

// validateMM reports items vLLM would not produce: the block rule above
// assumes sorted, disjoint spans.
func validateMM(items []MMItem) error {
	end := 0
	for i, it := range items {
		if it.ID == "" || it.Offset < end || it.Length <= 0 {
			return fmt.Errorf("%w: item %d %+v", errMMItems, i, it)
		}
		end = it.Offset + it.Length
	}
	return nil
}

// BlockExtraKeys returns the extra keys vLLM hashes into block i of a
// prompt keyed by s (nil when it has none). s.MM must be valid (see
// Validate).
func (s KeySpec) BlockExtraKeys(i int) []any {
	if len(s.MM) == 0 {
		first, rest := RequestBlockExtraKeys(s.LoRAName, s.CacheSalt)
		if i == 0 {
			return first
		}
		return rest
	}
	start, end := i*s.BlockSize, (i+1)*s.BlockSize
	var out []any
	if s.LoRAName != "" {
		out = append(out, s.LoRAName)
	}
	for _, it := range s.MM {
		if it.Offset >= end {
			break
		}
		if start < it.Offset+it.Length {
			out = append(out, []any{it.ID, int64(it.Offset - start)})
		}
	}
	if i == 0 && s.CacheSalt != "" {
		out = append(out, s.CacheSalt)
	}
	return out
}

// Validate reports a block size that is not positive and multimodal items
// that are not sorted, disjoint spans with identifiers.
func (s KeySpec) Validate() error {
	if s.BlockSize <= 0 {
		return errBlockSize
	}
	return validateMM(s.MM)
}

// ExtraKeys returns the extra keys of each of nBlocks blocks of a prompt
// keyed by s (nil when no block has any), for Keys and Hasher.BlockHashes.
func (s KeySpec) ExtraKeys(nBlocks int) ([][]any, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if nBlocks <= 0 || (len(s.MM) == 0 && s.LoRAName == "" && s.CacheSalt == "") {
		return nil, nil
	}
	out := make([][]any, nBlocks)
	for i := range out {
		out[i] = s.BlockExtraKeys(i)
	}
	return out, nil
}

// MMBlocks is how many whole blocks of blockSize come before the first
// block an item of items covers: the blocks whose keys do not depend on
// the items. It is the number of blocks of a prompt with tokens tokens
// when items is empty.
func MMBlocks(items []MMItem, blockSize, tokens int) int {
	if blockSize <= 0 {
		return 0
	}
	if len(items) == 0 {
		return tokens / blockSize
	}
	return min(items[0].Offset/blockSize, tokens/blockSize)
}
