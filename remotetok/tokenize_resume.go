package remotetok

import (
	"bytes"
	"hash/maphash"
	"math"
	"sort"

	"github.com/llmgw/caddy-llmgw/internal/bytescan"
	"github.com/llmgw/caddy-llmgw/internal/sighting"
)

// Prompts that share a long prefix (a system prompt, a document with a new
// question after it, a conversation's history) get /tokenize answers that
// share the same leading bytes: the same ids, written the same way.
// Decoding those ids again costs about 12 ns an id (1.6 ms for a
// 128k-token prompt), where comparing their bytes with an earlier answer's
// costs well under 1 ns. tokenResume keeps the token arrays of recent
// answers, so that the decoder copies the ids of the bytes a new answer
// shares with a kept one and decodes only the rest.
//
// Exactness: a kept array was decoded whole, in an answer that was valid,
// and offs[j] is where its id number j*stride starts. If a new array's
// first offs[j] bytes equal the kept array's, they hold the same j*stride
// ids, each followed by its comma: the same bytes decode the same way. The
// decoder goes on from offs[j] exactly as it would have after reading them,
// so what it accepts, rejects and returns is unchanged
// (FuzzTokenizeResume checks that).

// tokenResume is the set of kept arrays, one per hash of an array's first
// keyBytes bytes: answers whose first ids agree share an entry, the last
// one kept standing for them. An array is kept from its key's second
// sighting, so that answers sharing no prefix cost a record each, not a
// copy of their bytes. It is safe for concurrent use.
type tokenResume struct {
	seed maphash.Seed
	// minBytes: shorter arrays are neither kept nor looked up (they
	// decode in a few microseconds). keyBytes: how much of an array keys
	// its entry (≤ minBytes). stride: ids between two offsets.
	minBytes, keyBytes, stride int
	kept                       *sighting.Keep[*resumeEntry]
}

// maxSeenArrays bounds the keys recorded as offered once.
const maxSeenArrays = 1 << 16

// resumeEntry is one kept array. It is never changed once made: a newer
// array replaces the entry whole.
type resumeEntry struct {
	raw  []byte   // the array, '[' to ']', a copy of the answer's bytes
	ids  []uint64 // its ids, a copy: the decoder's result may be in a buffer its caller reuses
	offs []int32  // offs[j]: where id j*stride starts in raw
}

// Production settings: arrays of 4 KiB and more (about 600 ids), keyed by
// their first 512 bytes (about 75 ids), an offset every 256 ids, and
// 8 MiB at most kept (four 128k-token answers; a hundred 8k ones).
const (
	resumeMinBytes = 4 << 10
	resumeKeyBytes = 512
	resumeStride   = 256
	resumeBudget   = 8 << 20
)

func newTokenResume() *tokenResume {
	return &tokenResume{seed: maphash.MakeSeed(), minBytes: resumeMinBytes, keyBytes: resumeKeyBytes,
		stride: resumeStride, kept: sighting.NewKeep[*resumeEntry](resumeBudget, maxSeenArrays)}
}

// lookup returns the ids that the array starting arr (at its '[', running
// to the end of the answer) shares with a kept one, as a whole number of
// strides, and where the first id after them starts in arr. offs are the
// kept offsets up to it, which the decoder's own record of arr takes over.
// No ids: nothing to resume from.
func (r *tokenResume) lookup(arr []byte) (ids []uint64, offs []int32, at int) {
	if len(arr) < r.minBytes {
		return nil, nil, 0
	}
	h := maphash.Bytes(r.seed, arr[:r.keyBytes])
	e, ok := r.kept.Get(h)
	if !ok {
		return nil, nil, 0
	}
	same := bytescan.CommonPrefix(e.raw, arr)
	// The last offset within the shared bytes; offs[0] (id 0) resumes
	// nothing.
	j := sort.Search(len(e.offs), func(j int) bool { return int(e.offs[j]) > same }) - 1
	if j <= 0 || j*r.stride > len(e.ids) {
		return nil, nil, 0
	}
	return e.ids[:j*r.stride], e.offs[:j], int(e.offs[j])
}

// keep offers the array arr, decoded into ids with offsets offs, for
// later lookups; fresh is how many of the ids were decoded rather than
// resumed. An array is kept when most of it was new to the entry it
// would replace (one that resumed all but its last quarter adds little,
// and copying it would cost a third of what resuming saved), and only
// once its key was offered before.
func (r *tokenResume) keep(arr []byte, ids []uint64, offs []int32, fresh int) {
	if len(arr) < r.minBytes || len(arr) > math.MaxInt32 || 4*fresh < len(ids) {
		return // short, beyond what the offsets hold, or mostly resumed
	}
	h := maphash.Bytes(r.seed, arr[:r.keyBytes])
	r.kept.Offer(h, len(arr)+8*len(ids)+4*len(offs)+64, func() *resumeEntry {
		return &resumeEntry{raw: bytes.Clone(arr), ids: append([]uint64(nil), ids...), offs: append([]int32(nil), offs...)}
	})
}
