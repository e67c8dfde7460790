package tokenizer

import "sync"

// scratch holds the buffers one Encode call works in. Buffers come from
// scratchPool, so steady-state encoding allocates only the output.
type scratch struct {
	sections []section // added-token split of the raw text
	subs     []section // added-token split of a normalized section
	spans    []span
	pieces   []string
	free     [][]string // spare piece lists for nested pre-tokenizers
	syms     []symbol
	ranks    []uint64
	next     []int32
	prev     []int32
	heap     []mergeCandidate
	ids      []int32
	buf      []byte
	// hashes, checkpoints and fences serve the prefix cache.
	hashes      []uint64
	checkpoints []checkpoint
	fences      []fencePos
}

// scratchPool is the package's only shared mutable state: a pool of scratch
// buffers. Entries that grew past maxPooledBytes are dropped rather than
// returned, so one huge prompt does not pin its buffers for ever.
var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

const maxPooledBytes = 4 << 20

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

func putScratch(sc *scratch) {
	size := cap(sc.pieces)*16 + cap(sc.syms)*12 + cap(sc.heap)*20 + cap(sc.buf) + cap(sc.ids)*4
	if size > maxPooledBytes {
		return
	}
	scratchPool.Put(sc)
}

// takePieces returns an empty piece list, reusing a spare one.
func (sc *scratch) takePieces() []string {
	if n := len(sc.free); n > 0 {
		p := sc.free[n-1]
		sc.free = sc.free[:n-1]
		return p[:0]
	}
	return nil
}

// givePieces hands a piece list back for reuse. It clears the strings so
// that a pooled scratch does not keep old text alive.
func (sc *scratch) givePieces(p []string) {
	clear(p)
	sc.free = append(sc.free, p[:0])
}
