package fleetsim

import (
	"fmt"
	"math"
)

// Replaying a production trace (Params.Trace): every request of the trace
// arrives at its timestamp ÷ TraceSpeedup, with its prompt and output
// lengths at full token counts. Its prompt is made of the trace's
// 512-token blocks, each hash id standing for 512 tokens drawn from that
// id alone, so prompts whose leading ids agree share those leading tokens
// exactly, and the engines' and the gateway's own block hashing (on the
// model's block size) finds the shared prefix as it would on real text.

// forTrace checks a trace run's parameters and derives the synthetic
// workload's fields from the trace, so that the rest of Run needs no
// special case: one group (unused), Requests the trace's length, and a
// nominal rate (the arrivals come from the timestamps).
func (p Params) forTrace() (Params, error) {
	if len(p.Trace) == 0 {
		return p, fmt.Errorf("fleetsim: empty trace")
	}
	if p.TraceSpeedup == 0 {
		p.TraceSpeedup = 1
	}
	if p.TraceSpeedup < 0 || math.IsInf(p.TraceSpeedup, 0) || math.IsNaN(p.TraceSpeedup) {
		return p, fmt.Errorf("fleetsim: trace speedup %v must be positive", p.TraceSpeedup)
	}
	if p.BurstSize > 1 || p.LongEvery > 0 || p.Warm {
		return p, fmt.Errorf("fleetsim: a trace replay has no bursts, long prompts or warm-up")
	}
	if p.Model.BlockSize <= 0 {
		return p, fmt.Errorf("fleetsim: block size must be positive")
	}
	for i, r := range p.Trace {
		// An engine admits a request only when its whole prompt fits its
		// KV cache; one that never fits would wait for ever.
		if need := blocksFor(r.InputLength+r.OutputLength, p.Model.BlockSize); need > p.KVBlocks {
			return p, fmt.Errorf("fleetsim: trace request %d needs %d KV blocks, more than an engine's %d", i, need, p.KVBlocks)
		}
	}
	p.Groups, p.SystemTokens, p.QuestionTokens, p.OutputTokens = 1, 0, 1, 1
	p.Requests, p.Rate = len(p.Trace), 1
	return p, nil
}

// traceAt is the replay time of trace request i, in simulated seconds
// from the start of traffic (0 without a trace).
func (s *fleetSim) traceAt(i int) float64 {
	if s.p.Trace == nil {
		return 0
	}
	return float64(s.p.Trace[i].Timestamp-s.p.Trace[0].Timestamp) / 1000 / s.p.TraceSpeedup
}

// arriveTrace creates the next request of the trace, passes it to
// admission, and schedules the one after it.
func (s *fleetSim) arriveTrace() error {
	i := s.arrived
	tr := &s.p.Trace[i]
	s.arrived++
	r := &desReq{id: s.nextID, burst: -1, arrival: s.now, maxTokens: tr.OutputLength, promptLen: tr.InputLength}
	s.nextID++
	s.materializeTrace(r, tr)
	if s.arrived < len(s.p.Trace) {
		// Arrivals are scheduled from the trace's start (traffic starts at
		// 0: a replay has no warm-up), so that rounding never accumulates.
		s.push(s.traceAt(s.arrived), evArrival, -1)
	}
	return s.enter(r)
}

// materializeTrace builds a trace request's prompt tokens from its hash
// ids and their block hashes.
func (s *fleetSim) materializeTrace(r *desReq, tr *TraceRequest) {
	r.tokens = make([]uint64, 0, r.promptLen+r.maxTokens)
	for _, id := range tr.HashIDs {
		n := min(TraceBlockTokens, r.promptLen-len(r.tokens))
		r.tokens = AppendTraceBlock(r.tokens, s.p.Seed, id, n)
	}
	r.hashes = chainHashes(make([]uint64, 0, (r.promptLen+r.maxTokens)/s.bs+1), 0, r.tokens, s.bs)
	if s.p.Approximate {
		r.text = promptText(r.tokens)
	}
}

// AppendTraceBlock appends the first n tokens (n ≤ 512) of the block a
// trace's hash id stands for: token ids below 150,000 that depend only on
// seed, id and the position, so that equal ids give equal tokens.
func AppendTraceBlock(dst []uint64, seed, id uint64, n int) []uint64 {
	x := seed*0x9e3779b97f4a7c15 ^ id*0xbf58476d1ce4e5b9
	for range n {
		// splitmix64
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		dst = append(dst, z%150000)
	}
	return dst
}
