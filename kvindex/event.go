package kvindex

import "fmt"

// EventKind is the type of one vLLM KV-cache event.
type EventKind uint8

// The event kinds vLLM publishes. Other tags are counted in Batch.Unknown and
// skipped.
const (
	EventBlockStored EventKind = iota + 1
	EventBlockRemoved
	EventAllBlocksCleared
)

// String returns vLLM's tag for the kind.
func (k EventKind) String() string {
	switch k {
	case EventBlockStored:
		return "BlockStored"
	case EventBlockRemoved:
		return "BlockRemoved"
	case EventAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one decoded KV-cache event, in the same shape whichever wire
// encoding (positional array or map) and vLLM version produced it. Fields an
// event kind or version does not carry are left at their zero value.
type Event struct {
	Kind EventKind
	// BlockHashes are the engine's block hashes in event form: ints as
	// their two's-complement uint64, bytes via ExternalHash.
	BlockHashes []uint64
	// Parent is parent_block_hash; HasParent is false when it was nil or
	// 0 (the first new block is block 0 of its request).
	Parent    uint64
	HasParent bool
	TokenIDs  []uint64
	BlockSize int
	// LoRAID is the deprecated integer adapter id; HasLoRAID is false when
	// nil.
	LoRAID    int64
	HasLoRAID bool
	// Medium is the storage tier ("GPU", "CPU", "cpu"...); empty when nil
	// or absent, which older releases mean as GPU.
	Medium   string
	LoRAName string
	// ExtraKeys holds one entry per block hash: nil for a block without
	// extra keys, else the tuple's values (string, []byte, int64, uint64,
	// float64, bool, nil or nested []any). Nil when the field is absent.
	ExtraKeys [][]any
	// GroupIdx is the KV-cache group (group_idx, vLLM #37688); SpecKind
	// and SlidingWindow its layers' attention kind ("full_attention",
	// "sliding_window", "mamba"...) and window (vLLM #40984). Hybrid
	// models publish one group per kind; see Mirror for what counts.
	GroupIdx      int
	SpecKind      string
	SlidingWindow int
	// Locality is where the block's storage lies relative to the
	// publishing engine: "LOCAL", "REMOTE", or empty when unspecified
	// (vLLM #48281, map-encoded events only). See Mirror.
	Locality string
}

// Batch is one decoded EventBatch: one ZMQ message's payload.
type Batch struct {
	TS     float64
	Events []Event
	// DPRank is data_parallel_rank; HasDPRank is false when it was nil or
	// absent (v0.9.0's two-element batch).
	DPRank    int
	HasDPRank bool
	// Unknown counts events with an unknown tag or shape, skipped.
	Unknown int
}
