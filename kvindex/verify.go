package kvindex

import (
	"fmt"
	"sync"
	"time"
)

// VerifyConfig turns on checking an engine's block hashes against vLLM's
// sha256_cbor computed here. The index never needs the engine's hashes to
// be reproducible (it keys blocks by its own hash of the tokens), but a
// mismatch shows the gateway's view of the engine is wrong: another
// PYTHONHASHSEED (or none, so random), another hash algorithm, or another
// block size than configured. Those settings matter wherever the gateway
// computes vLLM hashes itself.
type VerifyConfig struct {
	// Sample checks one in Sample eligible events (1 checks all); 0
	// disables verification.
	Sample int
	// Seed is the engine's PYTHONHASHSEED; the empty string is a valid
	// seed.
	Seed string
	// BlockSize, when not 0, is the block size the engine is configured
	// with (cache_config_info); an event announcing another counts as a
	// mismatch.
	BlockSize int
}

// VerifyStats reports hash verification.
type VerifyStats struct {
	Enabled bool
	// Checked events, of which Verified matched and Mismatched did not;
	// Skipped were eligible but unverifiable (extra keys of a type vLLM
	// cannot hash, or a LoRA event from before extra_keys were published).
	Checked, Verified, Mismatched, Skipped uint64
	LastMismatch                           string
	LastMismatchAt                         time.Time
}

// verifyBlocks is how many leading blocks of an event are recomputed: the
// first already depends on the seed and block size.
const verifyBlocks = 4

// verifier checks a sample of root-anchored BlockStored events: only those
// can be recomputed from their own tokens, since chaining needs the parent's
// full 32-byte digest, which events do not carry. Hybrid-model groups whose
// block hash concatenates sub-block digests are not verifiable and must not
// be configured with verification.
type verifier struct {
	mu       sync.Mutex
	cfg      VerifyConfig
	hashers  map[int]*Hasher
	eligible uint64
	st       VerifyStats
	now      func() time.Time
}

func (v *verifier) setConfig(cfg VerifyConfig) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.cfg = cfg
	v.hashers = nil
	v.eligible = 0
	v.st = VerifyStats{Enabled: cfg.Sample > 0}
}

func (v *verifier) stats() VerifyStats {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.st
}

// check verifies ev if it is eligible and sampled.
func (v *verifier) check(ev *Event) {
	if ev.Kind != EventBlockStored || ev.HasParent || ev.GroupIdx != 0 || !isGPU(ev.Medium) {
		return
	}
	n, bs := len(ev.BlockHashes), ev.BlockSize
	if n == 0 || bs <= 0 || len(ev.TokenIDs) != n*bs {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cfg.Sample <= 0 {
		return
	}
	v.eligible++
	if (v.eligible-1)%uint64(v.cfg.Sample) != 0 {
		return
	}
	if ev.ExtraKeys == nil && ev.LoRAName != "" {
		v.st.Skipped++
		return
	}
	v.st.Checked++
	if v.cfg.BlockSize > 0 && v.cfg.BlockSize != bs {
		v.mismatch(fmt.Sprintf("event block_size %d, configured %d", bs, v.cfg.BlockSize))
		return
	}
	h := v.hashers[bs]
	if h == nil {
		var err error
		if h, err = NewHasher(v.cfg.Seed, bs); err != nil {
			v.st.Checked--
			v.st.Skipped++
			return
		}
		if v.hashers == nil {
			v.hashers = make(map[int]*Hasher)
		}
		v.hashers[bs] = h
	}
	parent := h.Root()
	for i := 0; i < n && i < verifyBlocks; i++ {
		var extra []any
		if i < len(ev.ExtraKeys) {
			extra = ev.ExtraKeys[i]
		}
		d, err := h.Block(parent, ev.TokenIDs[i*bs:(i+1)*bs], extra)
		if err != nil {
			v.st.Checked--
			v.st.Skipped++
			return
		}
		if got := d.Uint64(); got != ev.BlockHashes[i] {
			v.mismatch(fmt.Sprintf("block %d: engine hash %#016x, sha256_cbor with seed %q and block size %d gives %#016x",
				i, ev.BlockHashes[i], v.cfg.Seed, bs, got))
			return
		}
		parent = d
	}
	v.st.Verified++
}

func (v *verifier) mismatch(detail string) {
	v.st.Mismatched++
	v.st.LastMismatch = detail
	v.st.LastMismatchAt = v.now()
}
