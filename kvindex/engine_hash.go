package kvindex

import (
	"errors"
	"fmt"
	"hash/fnv"
)

// The engine hash algorithms the gateway can reproduce, by the names the
// app's hash_algo takes.
const (
	// HashSHA256CBOR is vLLM's --prefix-caching-hash-algo sha256_cbor,
	// seeded by PYTHONHASHSEED (see Hasher).
	HashSHA256CBOR = "sha256_cbor"
	// HashLLMDFNV64aCBOR is llm-d-kv-cache's TokenProcessor, the hashing
	// of llm-d-inference-sim's KV events: FNV-64a over the canonical CBOR
	// of [parent, tokens, extra], chained from a root that hashes the
	// seed and the request's model name.
	HashLLMDFNV64aCBOR = "llmd_fnv64a_cbor"
)

// EngineHash says how the engines compute their own block hashes, when the
// gateway can compute the same ones. The index keys blocks by its own hash
// of the tokens, chained from an event's parent; an event whose parent it
// never saw (the gateway started after the engine stored that prefix)
// cannot be chained. With the engines' hashing known, the index keeps such
// blocks by the engine's hashes and recognises them in a prompt whose
// blocks hash to them: a vLLM engine that stores a block computed its whole
// prefix, and the block's hash names that prefix. The zero value means the
// hashes cannot be reproduced.
type EngineHash struct {
	// Algo is HashSHA256CBOR or HashLLMDFNV64aCBOR; "" turns it off.
	Algo string
	// Seed is the engines' PYTHONHASHSEED (vLLM), or llm-d's hash seed;
	// the empty string is a valid seed.
	Seed string
}

// Enabled reports whether the engines' hashes can be computed here.
func (h EngineHash) Enabled() bool { return h.Algo != "" }

// Validate reports an unknown algorithm.
func (h EngineHash) Validate() error {
	switch h.Algo {
	case "", HashSHA256CBOR, HashLLMDFNV64aCBOR:
		return nil
	}
	return fmt.Errorf("kvindex: unknown engine hash algorithm %q (want %q or %q)", h.Algo, HashSHA256CBOR, HashLLMDFNV64aCBOR)
}

// HashedPrompt is a text prompt as an engine hashes it.
type HashedPrompt struct {
	Tokens    []uint64
	BlockSize int
	// Model is the request's model as the engine names it: llm-d's root
	// hash includes it (vLLM's does not). llm-d-inference-sim hashes its
	// first served name whatever alias a request used.
	Model string
	// LoRAName and CacheSalt are the extra keys vLLM hashes (see
	// RequestBlockExtraKeys).
	LoRAName, CacheSalt string
	// MM are the prompt's multimodal items (see KeySpec.BlockExtraKeys).
	// vLLM hashes them; they are not reproduced for llm-d's hashing.
	MM []MMItem
}

// BlockHashes appends to dst the event form (as DecodeBatch reports it) of
// the engine's hash of every full block of p. Tokens above 2^32-1 cannot
// be hashed the llm-d way, which takes uint32 ids.
func (h EngineHash) BlockHashes(dst []uint64, p HashedPrompt) ([]uint64, error) {
	if p.BlockSize <= 0 {
		return dst, errBlockSize
	}
	switch h.Algo {
	case HashSHA256CBOR:
		return h.vllmHashes(dst, p)
	case HashLLMDFNV64aCBOR:
		return h.llmdHashes(dst, p)
	}
	return dst, fmt.Errorf("kvindex: no engine hash algorithm configured")
}

func (h EngineHash) vllmHashes(dst []uint64, p HashedPrompt) ([]uint64, error) {
	hs, err := NewHasher(h.Seed, p.BlockSize)
	if err != nil {
		return dst, err
	}
	spec := KeySpec{BlockSize: p.BlockSize, LoRAName: p.LoRAName, CacheSalt: p.CacheSalt, MM: p.MM}
	if err := spec.Validate(); err != nil {
		return dst, err
	}
	parent := hs.Root()
	n := len(p.Tokens) / p.BlockSize
	for i := 0; i < n; i++ {
		extra := spec.BlockExtraKeys(i)
		d, err := hs.Block(parent, p.Tokens[i*p.BlockSize:(i+1)*p.BlockSize], extra)
		if err != nil {
			return dst, fmt.Errorf("block %d: %w", i, err)
		}
		dst = append(dst, d.Uint64())
		parent = d
	}
	return dst, nil
}

// llmdHashes follows llm-d-kv-cache v0.9.0's chunkedTokenDatabase: the
// root is hash(fnv64a(seed), nil, model) and block i's hash is
// hash(block i-1's, tokens_i, nil) for a text prompt, where hash is
// FNV-64a of the canonical CBOR array [parent, tokens|null, extra|null].
// Its extra features are multimodal hashes only: LoRA adapters are in the
// model name, and it hashes no cache salt.
func (h EngineHash) llmdHashes(dst []uint64, p HashedPrompt) ([]uint64, error) {
	if len(p.MM) > 0 {
		return dst, errors.New("kvindex: llm-d's multimodal block hashes are not reproduced")
	}
	var e cborEncoder
	seed := fnv.New64a()
	seed.Write([]byte(h.Seed))
	parent := llmdBlock(&e, seed.Sum64(), nil, p.Model, true)
	n := len(p.Tokens) / p.BlockSize
	for i := 0; i < n; i++ {
		block := p.Tokens[i*p.BlockSize : (i+1)*p.BlockSize]
		for _, t := range block {
			if t > 1<<32-1 {
				return dst, fmt.Errorf("block %d: token id %d does not fit llm-d's uint32 ids", i, t)
			}
		}
		parent = llmdBlock(&e, parent, block, "", false)
		dst = append(dst, parent)
	}
	return dst, nil
}

// llmdBlock is llm-d's hash of one CBOR array [parent, tokens, extra]:
// tokens nil encode as null (a nil Go slice under fxamacker/cbor's
// defaults), extra as the text model when withModel, else null.
func llmdBlock(e *cborEncoder, parent uint64, tokens []uint64, model string, withModel bool) uint64 {
	e.buf = e.buf[:0]
	e.head(majorArray, 3)
	e.head(majorUint, parent)
	if tokens == nil {
		e.null()
	} else {
		e.head(majorArray, uint64(len(tokens)))
		for _, t := range tokens {
			e.head(majorUint, t)
		}
	}
	if withModel {
		e.text(model)
	} else {
		e.null()
	}
	f := fnv.New64a()
	f.Write(e.buf)
	return f.Sum64()
}
