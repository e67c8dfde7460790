package fleetsim

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// TraceBlockTokens is the block size of the Mooncake traces' hash_ids:
// each id stands for 512 prompt tokens.
const TraceBlockTokens = 512

// TraceRequest is one request of a Mooncake-format trace (one JSON line:
// timestamp, input_length, output_length, hash_ids). Requests whose
// leading ids agree share those leading 512-token blocks of their prompts.
type TraceRequest struct {
	// Timestamp is the arrival in milliseconds from the trace's start.
	Timestamp    int64    `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// TraceLimits bound what ReadTrace accepts, so that a corrupt or hostile
// file ends in an error rather than exhausting memory. Zero fields take
// their defaults.
type TraceLimits struct {
	// MaxRequests is the most lines read. Default: 1,000,000.
	MaxRequests int
	// MaxLineBytes bounds one line. Default: 4 MiB.
	MaxLineBytes int
	// MaxInputTokens bounds a request's prompt. Default: 1,048,576.
	MaxInputTokens int
	// MaxOutputTokens bounds a request's output. Default: 131,072.
	MaxOutputTokens int
	// MaxBytes bounds the (decompressed) file. Default: 1 GiB.
	MaxBytes int64
}

func (l TraceLimits) withDefaults() TraceLimits {
	if l.MaxRequests <= 0 {
		l.MaxRequests = 1_000_000
	}
	if l.MaxLineBytes <= 0 {
		l.MaxLineBytes = 4 << 20
	}
	if l.MaxInputTokens <= 0 {
		l.MaxInputTokens = 1 << 20
	}
	if l.MaxOutputTokens <= 0 {
		l.MaxOutputTokens = 1 << 17
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = 1 << 30
	}
	return l
}

// ReadTraceFile reads a Mooncake-format trace from path, gunzipping it
// when its name ends in ".gz".
func ReadTraceFile(path string, lim TraceLimits) ([]TraceRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	reqs, err := ReadTrace(r, lim)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return reqs, nil
}

// ReadTrace reads a Mooncake-format trace: one JSON object per line,
// blank lines skipped, arrivals in non-decreasing timestamp order. A line
// that breaks the format or the limits is an error naming the line.
func ReadTrace(r io.Reader, lim TraceLimits) ([]TraceRequest, error) {
	lim = lim.withDefaults()
	lr := &io.LimitedReader{R: r, N: lim.MaxBytes + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, min(64<<10, lim.MaxLineBytes)), lim.MaxLineBytes)
	var out []TraceRequest
	line := 0
	for sc.Scan() {
		line++
		if lr.N <= 0 { // the scanner read past the limit: this line may be cut
			return nil, fmt.Errorf("larger than %d bytes", lim.MaxBytes)
		}
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(out) == lim.MaxRequests {
			return nil, fmt.Errorf("line %d: more than %d requests", line, lim.MaxRequests)
		}
		req, err := parseTraceLine(b, lim)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if n := len(out); n > 0 && req.Timestamp < out[n-1].Timestamp {
			return nil, fmt.Errorf("line %d: timestamp %d before the previous line's %d (a trace is in arrival order)", line, req.Timestamp, out[n-1].Timestamp)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than %d bytes", line+1, lim.MaxLineBytes)
		}
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if lr.N <= 0 {
		return nil, fmt.Errorf("larger than %d bytes", lim.MaxBytes)
	}
	if len(out) == 0 {
		return nil, errors.New("no requests")
	}
	return out, nil
}

// parseTraceLine decodes and checks one line: lengths within the limits,
// and as many hash ids as the prompt has 512-token blocks (the last one
// may be partial).
func parseTraceLine(b []byte, lim TraceLimits) (TraceRequest, error) {
	var req TraceRequest
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("not a trace record: %w", err)
	}
	if dec.More() {
		return req, errors.New("trailing data after the record")
	}
	switch {
	case req.Timestamp < 0:
		return req, fmt.Errorf("negative timestamp %d", req.Timestamp)
	case req.InputLength <= 0 || req.InputLength > lim.MaxInputTokens:
		return req, fmt.Errorf("input_length %d outside 1..%d", req.InputLength, lim.MaxInputTokens)
	case req.OutputLength <= 0 || req.OutputLength > lim.MaxOutputTokens:
		return req, fmt.Errorf("output_length %d outside 1..%d", req.OutputLength, lim.MaxOutputTokens)
	}
	if want := (req.InputLength + TraceBlockTokens - 1) / TraceBlockTokens; len(req.HashIDs) != want {
		return req, fmt.Errorf("%d hash_ids for input_length %d, want %d (one per %d-token block)", len(req.HashIDs), req.InputLength, want, TraceBlockTokens)
	}
	return req, nil
}

// TraceCeiling is what an infinite prefix cache shared by the whole fleet
// would hit on a trace: a request's leading blocks that some earlier
// request already had.
type TraceCeiling struct {
	Requests int
	// Blocks counts every request's blocks; HitBlocks the leading blocks
	// seen before. BlockRate is HitBlocks ÷ Blocks, the ceiling.
	Blocks, HitBlocks int64
	BlockRate         float64
	// Tokens and HitTokens are the same in prompt tokens (a hit last
	// block counts only the tokens the prompt has); TokenRate is the
	// ceiling of a token-weighted hit rate such as the engines' cached ÷
	// prompt tokens.
	Tokens, HitTokens int64
	TokenRate         float64
	// DistinctBlocks counts the distinct ids.
	DistinctBlocks int
	// Seconds spans the first to the last arrival.
	Seconds float64
}

// Ceiling computes the trace's infinite-cache hit ceiling.
func Ceiling(reqs []TraceRequest) TraceCeiling {
	c := PooledCeiling(reqs, math.MaxInt)
	if n := len(reqs); n > 0 {
		c.Seconds = float64(reqs[n-1].Timestamp-reqs[0].Timestamp) / 1000
	}
	return c
}

// PooledCeiling is the hit ceiling of one LRU cache of capacity blocks
// of 512 tokens — a whole fleet's KV cache pooled, as if every engine
// held every prefix any engine held — on the trace: a request hits its
// leading blocks the cache holds, then all its blocks become the most
// recently used (the least recently used leave). LRU is vLLM's eviction
// order and a router only chooses which engine's LRU a prompt goes
// through, so this is about what routing can approach at that total
// size; not a strict bound, since engines' separate LRU caches are not
// one (OptimalCeiling is a bound on any eviction order). The working set
// of running requests, which takes room from the cache on real engines,
// is left out. With an unbounded capacity it is the infinite-cache
// ceiling (Ceiling).
func PooledCeiling(reqs []TraceRequest, capacity int) TraceCeiling {
	c := TraceCeiling{Requests: len(reqs)}
	lru := newBlockLRU(capacity)
	seen := make(map[uint64]struct{})
	for _, r := range reqs {
		leading := true
		for i, h := range r.HashIDs {
			leading = leading && lru.has(h)
			c.add(r.blockTokens(i), leading)
		}
		for _, h := range r.HashIDs {
			lru.use(h)
			seen[h] = struct{}{}
		}
	}
	c.setRates()
	c.DistinctBlocks = len(seen)
	return c
}

// blockTokens is how many of r's prompt tokens its i-th block holds: a
// whole block's but for a partial last one.
func (r TraceRequest) blockTokens(i int) int64 {
	return int64(min(TraceBlockTokens, r.InputLength-i*TraceBlockTokens))
}

// add counts one block of n tokens, found in the cache or not.
func (c *TraceCeiling) add(n int64, hit bool) {
	c.Blocks++
	c.Tokens += n
	if hit {
		c.HitBlocks++
		c.HitTokens += n
	}
}

// setRates sets BlockRate and TokenRate from the counts.
func (c *TraceCeiling) setRates() {
	if c.Blocks > 0 {
		c.BlockRate = float64(c.HitBlocks) / float64(c.Blocks)
		c.TokenRate = float64(c.HitTokens) / float64(c.Tokens)
	}
}

// OptimalCeiling bounds what any cache of capacity blocks of 512 tokens
// finds on the trace, whatever decides what it keeps: it runs Belady's
// MIN over every request's blocks in order (a block is kept only while
// its next use comes sooner than some kept block's; the one used
// furthest ahead leaves, or is never stored), which finds the most
// blocks any eviction order finds, and counts every block found, leading
// or not, so the prefix rule only lowers it. Set beside PooledCeiling it
// shows what LRU, vLLM's eviction order, costs at that size. Its tokens
// count each found block's own tokens: a bound in blocks, a close figure
// in tokens. DistinctBlocks and Seconds are left to Ceiling.
func OptimalCeiling(reqs []TraceRequest, capacity int) TraceCeiling {
	c := TraceCeiling{Requests: len(reqs)}
	var seq []uint64
	var size []int64
	for _, r := range reqs {
		for i, h := range r.HashIDs {
			seq = append(seq, h)
			size = append(size, r.blockTokens(i))
		}
	}
	next := nextUses(seq)
	kept := make(map[uint64]int) // block → the index of its next use
	var furthest useHeap
	for i, h := range seq {
		_, found := kept[h]
		c.add(size[i], found)
		if next[i] == noNextUse {
			delete(kept, h)
			continue
		}
		kept[h] = next[i]
		heap.Push(&furthest, blockUse{at: next[i], h: h})
		for len(kept) > max(capacity, 0) {
			u := heap.Pop(&furthest).(blockUse)
			if at, ok := kept[u.h]; ok && at == u.at { // else a stale entry
				delete(kept, u.h)
			}
		}
	}
	c.setRates()
	return c
}

// noNextUse marks a block that is not used again.
const noNextUse = math.MaxInt

// nextUses is, for each position of seq, where its block is used next.
func nextUses(seq []uint64) []int {
	next := make([]int, len(seq))
	last := make(map[uint64]int)
	for i := len(seq) - 1; i >= 0; i-- {
		next[i] = noNextUse
		if j, ok := last[seq[i]]; ok {
			next[i] = j
		}
		last[seq[i]] = i
	}
	return next
}

// blockUse is a kept block and the position of its next use.
type blockUse struct {
	at int
	h  uint64
}

// useHeap orders kept blocks by next use, the furthest first; Len,
// Less, Swap, Push and Pop implement heap.Interface.
type useHeap []blockUse

func (u useHeap) Len() int           { return len(u) }
func (u useHeap) Less(i, j int) bool { return u[i].at > u[j].at }
func (u useHeap) Swap(i, j int)      { u[i], u[j] = u[j], u[i] }
func (u *useHeap) Push(x any)        { *u = append(*u, x.(blockUse)) }
func (u *useHeap) Pop() any {
	old := *u
	x := old[len(old)-1]
	*u = old[:len(old)-1]
	return x
}
