package kvindex

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// IndexConfig bounds an Index.
type IndexConfig struct {
	// MaxEngines is the most engines the index tracks at once (default
	// 256). Engines are bit positions in 64-bit words, one word per 64.
	MaxEngines int
	// MaxBlocksPerEngine is the hard cap on blocks mirrored per engine,
	// whatever SetCapacity says (default 1<<20, about 100 MB per engine at
	// the worst). Beyond it the oldest blocks are evicted.
	MaxBlocksPerEngine int
	// MaxPredicted and MaxPredictedPerEngine bound the speculative
	// entries (see Predict), in blocks: in all (default 131072) and per
	// engine (default 32768, four 128Ki-token prompts; never more than
	// the total). Beyond them the oldest are dropped.
	MaxPredicted, MaxPredictedPerEngine int
	// Now is the clock of the speculative entries' TTL; default time.Now.
	Now func() time.Time
}

const (
	defaultMaxEngines = 256
	defaultMaxBlocks  = 1 << 20
)

// Index is the cross-engine prefix index: for every gateway block key, the
// set of engines holding that block, fed by one Mirror per engine. It is
// safe for concurrent use: queries share a read lock, and each engine's
// writer takes the write lock once per event batch.
type Index struct {
	cfg IndexConfig

	mu    sync.RWMutex
	byID  map[string]*Mirror
	slots []*Mirror // by slot; nil is free
	// banks[b] maps a key to the bitset of slots 64b..64b+63 holding it.
	banks []*keyTable
	// tierBanks[t-1][b] is banks for offload tier t: the slots whose
	// tier t holds a block under the key (see lowerTier).
	tierBanks [lowerTiers][]*keyTable
	// live[b] has the bits of slots whose claims queries may use; a slot
	// is hidden while its mirror is being cleared.
	live []uint64

	// loras holds the LoRA adapter names seen in BlockStored events, at
	// most maxLoRANames; see IsLoRA.
	loras map[string]struct{}

	// spec holds the speculative entries; see Predict.
	spec *predictions

	// orphaned is how many orphan blocks the mirrors keep, so that Match
	// computes engine hashes only while some do (see orphans.go).
	orphaned atomic.Int64

	// keysPool recycles Match's key buffers, 64 KiB for a 128Ki-token
	// prompt.
	keysPool sync.Pool

	// betweenSteps, when set (by tests), runs when a mirror's writer
	// pauses between steps of an event (see Mirror.pauseLocked), with
	// the index's lock released.
	betweenSteps func()
}

// maxLoRANames bounds the adapter names the index remembers: an engine
// serves a handful of adapters, and an event stream must not grow the set
// without bound.
const maxLoRANames = 1024

// NewIndex returns an empty Index.
func NewIndex(cfg IndexConfig) *Index {
	if cfg.MaxEngines <= 0 {
		cfg.MaxEngines = defaultMaxEngines
	}
	if cfg.MaxBlocksPerEngine <= 0 {
		cfg.MaxBlocksPerEngine = defaultMaxBlocks
	}
	nb := (cfg.MaxEngines + 63) / 64
	ix := &Index{
		cfg:   cfg,
		byID:  make(map[string]*Mirror),
		slots: make([]*Mirror, cfg.MaxEngines),
		banks: make([]*keyTable, nb),
		live:  make([]uint64, nb),
	}
	ix.spec = newPredictions(cfg, nb)
	for i := range ix.banks {
		ix.banks[i] = new(keyTable)
	}
	for t := range ix.tierBanks {
		ix.tierBanks[t] = make([]*keyTable, nb)
		for i := range ix.tierBanks[t] {
			ix.tierBanks[t][i] = new(keyTable)
		}
	}
	return ix
}

// MirrorConfig configures one engine's mirror.
type MirrorConfig struct {
	// Capacity is the engine's number of GPU blocks (num_gpu_blocks from
	// vllm:cache_config_info) when known; 0 means unknown. See
	// Mirror.SetCapacity.
	Capacity int
	// Verify configures hash verification.
	Verify VerifyConfig
	// Hash is how the engine computes its block hashes, when the gateway
	// can too: blocks whose parent the mirror never saw are then kept and
	// recognised in prompts (see orphans.go). Zero: they are skipped.
	Hash EngineHash
	// Rank, when HasRank is set, is the data-parallel rank whose events
	// this mirror follows: vLLM publishes each rank on its own port, and
	// every batch names its rank (`data_parallel_rank`). A batch naming
	// another rank is counted (MirrorStats.WrongRank) and not applied —
	// the subscription reaches another rank's publisher, and its blocks
	// are not this rank's. Batches without a rank are applied.
	Rank    int
	HasRank bool
}

// Errors returned by AddEngine.
var (
	ErrEngineExists = errors.New("kvindex: engine already in index")
	ErrIndexFull    = errors.New("kvindex: index has no free engine slot")
)

// AddEngine registers an engine, identified by id (its dial address), and
// returns its empty Mirror. Feed the mirror with NewFeed.
func (ix *Index) AddEngine(id string, cfg MirrorConfig) (*Mirror, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if _, ok := ix.byID[id]; ok {
		return nil, fmt.Errorf("%w: %q", ErrEngineExists, id)
	}
	slot := slices.Index(ix.slots, nil)
	if slot < 0 {
		return nil, fmt.Errorf("%w (%d engines)", ErrIndexFull, len(ix.slots))
	}
	// A slot is handed on empty: nothing predicted for an engine that
	// held it before may count for this one.
	ix.spec.dropSlot(slot)
	m := newMirror(ix, id, slot, cfg)
	ix.slots[slot] = m
	ix.byID[id] = m
	ix.live[m.bank] |= m.bit
	return m, nil
}

// IsLoRA reports whether name is a LoRA adapter some engine has stored
// blocks for. vLLM hashes a LoRA request's blocks with the adapter's name
// (the request's "model") as an extra key, so such a request must be
// matched with Query.LoRAName set, and a request for the base model
// without. Names are learnt from BlockStored events (their lora_name field,
// vLLM #27577) and kept for the index's life; until an engine has stored a
// block under an adapter, requests for it match as the base model would.
func (ix *Index) IsLoRA(name string) bool {
	if name == "" {
		return false
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	_, ok := ix.loras[name]
	return ok
}

// noteLoRALocked remembers an adapter name. ix.mu held for writing.
func (ix *Index) noteLoRALocked(name string) {
	if name == "" || len(ix.loras) >= maxLoRANames {
		return
	}
	if _, ok := ix.loras[name]; ok {
		return
	}
	if ix.loras == nil {
		ix.loras = make(map[string]struct{})
	}
	ix.loras[name] = struct{}{}
}

// Mirror returns the mirror of engine id, or nil.
func (ix *Index) Mirror(id string) *Mirror {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.byID[id]
}

// RemoveEngine drops engine id and all its blocks from the index. A Feed
// still attached to its mirror keeps running but changes nothing. It reports
// whether the engine was present.
func (ix *Index) RemoveEngine(id string) bool {
	m := ix.Mirror(id)
	if m == nil {
		return false
	}
	m.wmu.Lock()
	defer m.wmu.Unlock()
	if m.removed.Load() {
		return false
	}
	m.clear("removed")
	ix.free(m)
	return true
}

// free takes removed mirror m out of the index and frees its slot. clear
// dropped m's predictions, but a Predict between clear and free still
// found m live and may have added some: they are dropped here, under the
// lock that frees the slot, so no engine that takes the slot next
// inherits them. Callers hold m.wmu.
func (ix *Index) free(m *Mirror) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	m.removed.Store(true)
	ix.spec.dropSlot(m.slot)
	ix.slots[m.slot] = nil
	ix.live[m.bank] &^= m.bit
	delete(ix.byID, m.id)
}

// Stats returns every engine's statistics, sorted by engine id.
func (ix *Index) Stats() []MirrorStats {
	ix.mu.RLock()
	ms := make([]*Mirror, 0, len(ix.byID))
	for _, m := range ix.byID {
		ms = append(ms, m)
	}
	ix.mu.RUnlock()
	out := make([]MirrorStats, len(ms))
	for i, m := range ms {
		out[i] = m.Stats()
	}
	slices.SortFunc(out, func(a, b MirrorStats) int { return strings.Compare(a.Engine, b.Engine) })
	return out
}

// EngineMatch is how much of a prompt one engine holds.
type EngineMatch struct {
	Engine string
	// Blocks is the number of leading full blocks the engine holds.
	Blocks int
	// BlockSize is the engine's block size in tokens; Tokens is
	// Blocks*BlockSize, comparable across engines of different block
	// sizes.
	BlockSize int
	Tokens    int
	// Predicted is how many of Blocks lie past the engine's own leading
	// run (see Predict): 0 when its events account for them all. Past
	// that run a block may be predicted or, after a predicted one, the
	// engine's own; either way only a prediction makes it count, so all
	// of them are counted here.
	Predicted int
	// CPUBlocks is how many blocks past Blocks the engine holds in its CPU
	// offload tier, in a row; StorageBlocks how many past those in its
	// storage tier. An engine holding the prompt's first blocks only in a
	// lower tier is listed with Blocks 0.
	CPUBlocks, StorageBlocks int
}

// MatchKeys returns, for every engine of the given block size that holds at
// least the first block, how many leading blocks of keys it holds: a block
// an engine lacks ends its count even if later ones are present, since vLLM
// only reuses a cached prefix. keys come from Keys with the same block size
// and group. The result is sorted by Tokens, longest first, then engine id.
// Cost: one lookup per block per 64 engines, stopping at the first block no
// remaining engine holds.
func (ix *Index) MatchKeys(blockSize, group int, keys []uint64) []EngineMatch {
	ix.spec.expire()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.matchLocked(blockSize, group, keys, nil)
}

func (ix *Index) matchLocked(blockSize, group int, keys []uint64, out []EngineMatch) []EngineMatch {
	var activeBuf, predBuf [4]uint64
	active, found := ix.activeLocked(blockSize, group, activeBuf[:0])
	if !found || len(keys) == 0 {
		return out
	}
	var pred []uint64
	if ix.spec.any() {
		// Engines with predictions take the slower walk that consults
		// them; the others keep the fast one. (The caller expired the
		// entries due, before taking the index's lock.)
		ix.spec.mu.RLock()
		defer ix.spec.mu.RUnlock()
		pred = ix.spec.split(active, predBuf[:0])
	}
	if pred == nil {
		out = ix.walkLocked(blockSize, keys, active, out)
	} else {
		out = ix.spec.walkLocked(ix, active, pred, blockSize, keys, out)
	}
	sortMatches(out)
	return out
}

// activeLocked appends to active, by bank, the live engines of the given
// block size (as their mirror knows it, else as they were predicted at),
// and reports whether there is one.
func (ix *Index) activeLocked(blockSize, group int, active []uint64) ([]uint64, bool) {
	for range ix.banks {
		active = append(active, 0)
	}
	var found bool
	for slot, m := range ix.slots {
		if m == nil {
			continue
		}
		bs := m.groupBlockSize(group)
		if bs == 0 {
			bs = int(ix.spec.size[slot].Load())
		}
		b, bit := slot/64, uint64(1)<<(slot%64)
		if bs == blockSize && ix.live[b]&bit != 0 {
			active[b] |= bit
			found = true
		}
	}
	return active, found
}

// walkLocked appends the leading-block runs of the engines in active.
func (ix *Index) walkLocked(blockSize int, keys []uint64, active []uint64, out []EngineMatch) []EngineMatch {
	emit := func(b int, lost uint64, n int) { out = ix.emitRun(b, lost, n, blockSize, out) }
	// Keys are looked up a chunk at a time, the lookups of a chunk being
	// independent of each other, so the CPU overlaps their cache misses;
	// then the chunk's results are walked in order. At most one chunk
	// beyond the last match is looked up.
	const chunk = 16
	var got [chunk]uint64
	for start := 0; start < len(keys); start += chunk {
		ck := keys[start:min(start+chunk, len(keys))]
		left := false
		for b, a := range active {
			if a == 0 {
				continue
			}
			ix.banks[b].getMany(ck, got[:len(ck)])
			for j := range ck {
				if have := got[j] & a; have != a {
					emit(b, a&^have, start+j)
					if a = have; a == 0 {
						break
					}
				}
			}
			active[b] = a
			left = left || a != 0
		}
		if !left {
			break
		}
	}
	for b, a := range active {
		emit(b, a, len(keys))
	}
	return out
}

// emitRun appends the engines of bank b in lost, whose run ended at n
// blocks (none when n is 0).
func (ix *Index) emitRun(b int, lost uint64, n, blockSize int, out []EngineMatch) []EngineMatch {
	if n == 0 {
		return out
	}
	for ; lost != 0; lost &= lost - 1 {
		i := bits.TrailingZeros64(lost)
		out = append(out, EngineMatch{Engine: ix.slots[b*64+i].id, Blocks: n, BlockSize: blockSize, Tokens: n * blockSize})
	}
	return out
}

func sortMatches(out []EngineMatch) {
	slices.SortFunc(out, func(a, b EngineMatch) int {
		if a.Tokens != b.Tokens {
			return b.Tokens - a.Tokens
		}
		return strings.Compare(a.Engine, b.Engine)
	})
}

// Query is a prompt to match against the index with Match.
type Query struct {
	Tokens []uint64
	// Group is the key space to match (see keySpace): 0, the default,
	// matches each engine's full-attention group, whatever its index —
	// group 0 for engines whose events name no spec kind (vLLM before
	// #40984). Another value n matches group n of engines whose events
	// name no kind; a sliding-window or Mamba group is never matched.
	Group int
	// LoRAName and CacheSalt are the request's adapter and cache_salt,
	// which vLLM hashes as extra keys: blocks stored under another
	// adapter or salt do not match.
	LoRAName  string
	CacheSalt string
	// Model is the request's model, which some engines' own hashes
	// include (EngineHash, HashedPrompt.Model).
	Model string
	// MM are the prompt's multimodal items (KeySpec.MM), hashed into the
	// blocks they cover at every block size; none for a text prompt (or
	// one whose items are not known: its match then stops at the first).
	MM []MMItem
	// Keys, when not nil, are the prompt's block keys at KeysBlockSize
	// (RequestKeys with the same group, adapter and salt), which Match
	// then uses instead of hashing the prompt again at that size.
	Keys          []uint64
	KeysBlockSize int
}

// Match keys q's tokens at every block size the engines use and returns
// each engine's leading matched blocks, as MatchKeys. Blocks an engine
// announced with a parent the index never saw are recognised first, when
// the engine's hashing is known (see orphans.go): Match then takes them
// into the engine's mirror. Multimodal prompts need their items (MM).
func (ix *Index) Match(q Query) ([]EngineMatch, error) {
	ix.spec.expire()
	ix.mu.RLock()
	var sizesBuf [4]int
	sizes := sizesBuf[:0]
	for _, m := range ix.slots {
		if m == nil {
			continue
		}
		bs := m.groupBlockSize(q.Group)
		if bs == 0 {
			bs = int(ix.spec.size[m.slot].Load())
		}
		if bs > 0 && !slices.Contains(sizes, bs) {
			sizes = append(sizes, bs)
		}
	}
	ix.mu.RUnlock()
	var out []EngineMatch
	kp, _ := ix.keysPool.Get().(*[]uint64)
	if kp == nil {
		kp = new([]uint64)
	}
	defer ix.keysPool.Put(kp)
	for _, bs := range sizes {
		if q.Keys != nil && bs == q.KeysBlockSize {
			ix.recognize(q, bs, q.Keys)
			ix.mu.RLock()
			from := len(out)
			out = ix.matchLocked(bs, q.Group, q.Keys, out)
			out = ix.offloadedLocked(keysAt{bs, q.Group, q.Keys}, out, from)
			ix.mu.RUnlock()
			continue
		}
		keys, err := RequestKeys((*kp)[:0], q.Tokens, KeySpec{BlockSize: bs, Group: q.Group, LoRAName: q.LoRAName, CacheSalt: q.CacheSalt, MM: q.MM})
		*kp = keys
		if err != nil {
			return nil, fmt.Errorf("kvindex: match: %w", err)
		}
		ix.recognize(q, bs, keys)
		ix.mu.RLock()
		from := len(out)
		out = ix.matchLocked(bs, q.Group, keys, out)
		out = ix.offloadedLocked(keysAt{bs, q.Group, keys}, out, from)
		ix.mu.RUnlock()
	}
	sortMatches(out)
	return out, nil
}
