package main

import (
	"container/heap"
	"context"
	"fmt"
	"hash/fnv"
	"log"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/routing"
)

// The fleet simulation runs the gateway's own routing code — routing.Pick
// fed by a real kvindex.Index whose mirrors receive vLLM KV-event batches
// through kvindex.Feed — against a discrete-event model of N engines, to
// see how hit rate, TTFT and the gateway's CPU and memory behave at fleet
// sizes one machine cannot run as processes. The engine model follows
// vllmsim's scheduler (and so vLLM's): prefix-cache hits at admission,
// whole-prompt block reservation, chunked prefill under a token budget,
// one token per decoding sequence per step, LRU eviction of freed cached
// blocks, recompute preemption. Only the engines and the clock are
// modelled; the decision is the gateway's.

// FleetParams configure the section.
type FleetParams struct {
	Sizes    []int        `json:"sizes"`
	Requests int          `json:"requests"`
	Workload WorkloadSpec `json:"workload"` // Groups is set per size
	// GroupsPerEngine scales the number of prefix groups with the fleet.
	GroupsPerEngine int         `json:"groups_per_engine"`
	Model           EngineModel `json:"model"`
	Rho             float64     `json:"rho"`

	PollInterval float64 `json:"poll_interval_seconds"`
	KVLimit      float64 `json:"admission_kv_limit"`
	// InflightX is max_inflight as a multiple of max_num_seqs (0 = 1).
	InflightX float64        `json:"inflight_x,omitempty"`
	MaxPark   float64        `json:"max_park_seconds"`
	QueueSize int            `json:"queue_size"`
	Variants  []FleetVariant `json:"variants"`
	Seed      uint64         `json:"seed"`
}

// FleetVariant is one routing configuration at one load.
type FleetVariant struct {
	Name string `json:"name"`
	// Policy: "llm" (routing.Pick on the KV index), "least_loaded"
	// (routing.LeastLoaded) or "round_robin".
	Policy string `json:"policy"`
	// Load is the arrival rate as a multiple of the fleet's capacity
	// without cache hits.
	Load float64 `json:"load"`
	// InflightX is max_inflight (admission and the policy's saturation
	// rule) as a multiple of max_num_seqs; 0 means 1.
	InflightX float64 `json:"inflight_x,omitempty"`
}

// FleetRun is one (size, variant) result. Times are simulated seconds,
// except the gateway's CPU figures, which are host time.
type FleetRun struct {
	Engines   int     `json:"engines"`
	Variant   string  `json:"variant"`
	Policy    string  `json:"policy"`
	Load      float64 `json:"load"`
	InflightX float64 `json:"inflight_x,omitempty"`
	Groups    int     `json:"groups"`
	KVBlocks  int     `json:"kv_blocks"`
	Rate      float64 `json:"rate"`
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`
	Rejected  int     `json:"rejected"`
	HitRate   float64 `json:"hit_rate"`
	TTFT      Pcts    `json:"ttft"`
	E2E       Pcts    `json:"e2e"`
	// Park is the time requests waited in the gateway's admission queue,
	// Queue the time they then waited in the engine's queue before it
	// admitted them (at their last admission, after any preemption).
	Park  Pcts `json:"park"`
	Queue Pcts `json:"queue"`
	// IdleWhenRefused is the mean number of sequence slots that were
	// actually free in the fleet when the admission gate (reading gauges
	// up to a poll interval old) refused a request.
	IdleWhenRefused float64 `json:"idle_when_refused"`
	Refusals        int     `json:"refusals"`
	OutputTPS       float64 `json:"output_tps"`
	SimSeconds      float64 `json:"sim_seconds"`
	Preemptions     int     `json:"preemptions"`
	// Gateway cost (llm policy): host nanoseconds per routing decision
	// (keys + index match + Pick), host microseconds of event decoding and
	// mirror updates per request, index heap and blocks mirrored.
	DecisionNs     Pcts           `json:"decision_ns"`
	EventUsPerReq  float64        `json:"event_us_per_request"`
	EventBatches   int            `json:"event_batches"`
	IndexBytes     int64          `json:"index_bytes"`
	IndexBlocks    int            `json:"index_blocks"`
	Outcomes       map[string]int `json:"outcomes,omitempty"`
	WallSeconds    float64        `json:"wall_seconds"`
	MirrorProblems uint64         `json:"mirror_problems"` // unchainable + malformed + decode errors: should be 0
}

// FleetResult is the section's output.
type FleetResult struct {
	Params FleetParams `json:"params"`
	Runs   []FleetRun  `json:"runs"`
}

func runFleet(ctx context.Context, p FleetParams) (*FleetResult, error) {
	res := &FleetResult{Params: p}
	for _, n := range p.Sizes {
		for _, v := range p.Variants {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			r, err := simulateFleet(ctx, p, n, v)
			if err != nil {
				return res, fmt.Errorf("fleet %d/%s: %w", n, v.Name, err)
			}
			log.Printf("fleet %4d engines %-18s rate %6.1f: done %d rej %d hit %.3f park p90 %.2fs queue p90 %.2fs ttft p50 %.2fs p90 %.2fs p99 %.2fs tok/s %.0f decision %.1fµs (p99 %.1fµs) events %.1fµs/req index %.1f MiB %d blocks wall %.1fs",
				n, v.Name, r.Rate, r.Completed, r.Rejected, r.HitRate, r.Park.P90, r.Queue.P90, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, r.OutputTPS,
				r.DecisionNs.Mean/1000, r.DecisionNs.P99/1000, r.EventUsPerReq, float64(r.IndexBytes)/(1<<20), r.IndexBlocks, r.WallSeconds)
			res.Runs = append(res.Runs, r)
		}
	}
	return res, nil
}

// Event kinds of the discrete-event loop.
const (
	evArrival = iota
	evStepEnd
	evScrape
)

type simEvent struct {
	t    float64
	seq  uint64 // FIFO among equal times
	kind int
	eng  int
}

// eventQueue is the simulation's clock: a min-heap of events by time.
type eventQueue []simEvent

// Len, Less, Swap, Push and Pop implement heap.Interface.
func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].t != q[j].t {
		return q[i].t < q[j].t
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// fleetSim is one run's state.
type fleetSim struct {
	p       FleetParams
	v       FleetVariant
	policy  string
	bs      int
	now     float64
	q       eventQueue
	qseq    uint64
	engines []*desEngine
	rng     *rand.Rand
	groups  []desGroup
	nextID  int
	arrived int

	// The gateway.
	ix      *kvindex.Index
	feeds   []*kvindex.Feed
	byName  map[string]int
	enc     *batchEncoder
	cfg     routing.Config
	cands   []routing.Candidate
	keys    []uint64
	parked  []*desReq
	rr      int
	eventNs time.Duration
	batches int

	// Results.
	ttft, e2e, decision []float64
	park, queue         []float64
	refusals            int
	refusedIdle         int
	prompt, cached      int64
	output              int64
	completed, rejected int
	outcomes            map[string]int
}

// desGroup is a prefix group: its system prompt's tokens and block hashes.
type desGroup struct {
	tokens []uint64
	hashes []uint64
}

// desReq is one request in the model.
type desReq struct {
	id, group int
	qseed     uint64
	tokens    []uint64 // prompt, then generated tokens
	hashes    []uint64 // engine hashes of the full blocks of tokens known so far
	promptLen int
	maxTokens int
	gen       int
	target    int // tokens to prefill at this admission
	computed  int // tokens whose KV is computed
	stored    int // leading blocks cached (hits or stored)
	chunk     int
	blocks    []*desBlock
	prefill   bool
	cachedTok int
	arrival   float64
	first     float64
	dispatchT float64
	admitT    float64
	eng       *desEngine
}

func (s *fleetSim) push(t float64, kind, eng int) {
	s.qseq++
	heap.Push(&s.q, simEvent{t: t, seq: s.qseq, kind: kind, eng: eng})
}

func simulateFleet(ctx context.Context, p FleetParams, n int, v FleetVariant) (FleetRun, error) {
	policy := v.Policy
	w := p.Workload
	w.Groups = p.GroupsPerEngine * n
	blocks, _ := p.Model.KVBlocks(w, n, p.Rho)
	capMiss := float64(n) * p.Model.Capacity(w.SystemTokens+w.QuestionTokens, 0, w.OutputTokens)
	run := FleetRun{Engines: n, Variant: v.Name, Policy: policy, Load: v.Load, InflightX: v.InflightX, Groups: w.Groups, KVBlocks: blocks,
		Rate: v.Load * capMiss, Requests: p.Requests}
	s := &fleetSim{
		p: p, v: v, policy: policy, bs: p.Model.BlockSize,
		rng:      rand.New(rand.NewPCG(p.Seed, uint64(n))),
		outcomes: map[string]int{},
	}
	s.cfg.SetDefaults()
	for i := 0; i < n; i++ {
		s.engines = append(s.engines, newDESEngine(i, blocks))
	}
	// System prompts: random token ids, so groups share nothing.
	grng := rand.New(rand.NewPCG(p.Seed, 0x67726f7570))
	for g := 0; g < w.Groups; g++ {
		toks := make([]uint64, w.SystemTokens)
		for i := range toks {
			toks[i] = grng.Uint64N(150000)
		}
		s.groups = append(s.groups, desGroup{tokens: toks, hashes: chainHashes(nil, 0, toks, s.bs)})
	}
	if policy == "llm" {
		runtime.GC()
		s.ix = kvindex.NewIndex(kvindex.IndexConfig{MaxEngines: max(n, 64), MaxBlocksPerEngine: 4 * blocks})
		s.byName = map[string]int{}
		s.enc = newBatchEncoder()
		for i, e := range s.engines {
			m, err := s.ix.AddEngine(e.name, kvindex.MirrorConfig{Capacity: blocks})
			if err != nil {
				return run, err
			}
			f := kvindex.NewFeed(m, nil, kvindex.FeedConfig{})
			f.Connected()
			s.feeds = append(s.feeds, f)
			s.byName[e.name] = i
		}
	}
	s.cands = make([]routing.Candidate, n)
	for i, e := range s.engines {
		s.cands[i].Dial = e.name
	}

	start := time.Now()
	s.push(0, evArrival, -1)
	s.push(p.PollInterval, evScrape, -1)
	for s.q.Len() > 0 {
		if s.arrived%4096 == 0 && ctx.Err() != nil {
			return run, ctx.Err()
		}
		ev := heap.Pop(&s.q).(simEvent)
		s.now = ev.t
		switch ev.kind {
		case evArrival:
			s.arrive(w)
			if s.arrived < p.Requests {
				s.push(s.now+s.rng.ExpFloat64()/run.Rate, evArrival, -1)
			}
		case evStepEnd:
			s.stepEnd(s.engines[ev.eng])
		case evScrape:
			s.scrape()
			if s.completed+s.rejected < p.Requests {
				s.push(s.now+p.PollInterval, evScrape, -1)
			}
		}
	}
	run.WallSeconds = time.Since(start).Seconds()
	run.SimSeconds = s.now
	run.Completed, run.Rejected = s.completed, s.rejected
	if s.prompt > 0 {
		run.HitRate = float64(s.cached) / float64(s.prompt)
	}
	run.TTFT, run.E2E = percentiles(s.ttft), percentiles(s.e2e)
	run.Park, run.Queue = percentiles(s.park), percentiles(s.queue)
	run.Refusals = s.refusals
	if s.refusals > 0 {
		run.IdleWhenRefused = float64(s.refusedIdle) / float64(s.refusals)
	}
	if s.now > 0 {
		run.OutputTPS = float64(s.output) / s.now
	}
	for _, e := range s.engines {
		run.Preemptions += e.preemptions
	}
	if policy == "llm" {
		run.DecisionNs = percentiles(s.decision)
		run.EventUsPerReq = float64(s.eventNs.Microseconds()) / float64(max(1, s.completed))
		run.EventBatches = s.batches
		run.Outcomes = s.outcomes
		for _, st := range s.ix.Stats() {
			run.IndexBlocks += st.Blocks
			run.MirrorProblems += st.Unchainable + st.Malformed + st.DecodeErrors
		}
		// The index's heap: what the collector frees once it is dropped.
		s.engines, s.groups, s.q, s.parked = nil, nil, nil, nil
		runtime.GC()
		var m1, m2 runtime.MemStats
		runtime.ReadMemStats(&m1)
		s.ix, s.feeds = nil, nil
		runtime.GC()
		runtime.ReadMemStats(&m2)
		run.IndexBytes = int64(m1.HeapAlloc) - int64(m2.HeapAlloc)
	}
	return run, nil
}

// arrive creates the next request and sends it, or parks it while no
// engine has room (the llm_admission gate: running + waiting − finished +
// dispatched below max_inflight and KV usage below the limit).
func (s *fleetSim) arrive(w WorkloadSpec) {
	s.arrived++
	r := &desReq{id: s.nextID, group: s.rng.IntN(len(s.groups)), qseed: s.rng.Uint64(), arrival: s.now,
		maxTokens: w.OutputTokens, promptLen: w.SystemTokens + w.QuestionTokens}
	s.nextID++
	if len(s.parked) > 0 || !s.roomy() {
		if len(s.parked) >= s.p.QueueSize {
			s.rejected++
			return
		}
		s.parked = append(s.parked, r)
		return
	}
	s.dispatch(r)
}

// roomy reports whether some engine has admission headroom.
func (s *fleetSim) roomy() bool {
	for _, e := range s.engines {
		if e.free(s.maxInflight(), s.p.KVLimit) > 0 {
			return true
		}
	}
	// The gate refused: count the sequence slots actually free then (the
	// gauges it reads are up to a poll interval old).
	for _, e := range s.engines {
		s.refusedIdle += max(0, s.p.Model.MaxNumSeqs-len(e.running)-len(e.waiting))
	}
	s.refusals++
	return false
}

func (s *fleetSim) unpark() {
	for len(s.parked) > 0 {
		r := s.parked[0]
		if s.now-r.arrival > s.p.MaxPark {
			s.parked = s.parked[1:]
			s.rejected++
			continue
		}
		if !s.roomy() {
			return
		}
		s.parked = s.parked[1:]
		s.dispatch(r)
	}
}

// maxInflight is the admission and policy limit per engine: max_num_seqs
// times InflightX.
func (s *fleetSim) maxInflight() int {
	return int(max(1, s.v.InflightX) * float64(s.p.Model.MaxNumSeqs))
}

// materialize builds the request's prompt tokens and block hashes.
func (s *fleetSim) materialize(r *desReq) {
	g := &s.groups[r.group]
	r.tokens = make([]uint64, 0, r.promptLen+r.maxTokens)
	r.tokens = append(r.tokens, g.tokens...)
	qr := rand.New(rand.NewPCG(r.qseed, 1))
	for len(r.tokens) < r.promptLen {
		r.tokens = append(r.tokens, qr.Uint64N(150000))
	}
	r.hashes = append(make([]uint64, 0, (r.promptLen+r.maxTokens)/s.bs+1), g.hashes...)
	r.hashes = chainHashes(r.hashes, len(r.hashes), r.tokens[:r.promptLen], s.bs)
}

// dispatch routes r with the policy under test and hands it to the
// engine.
func (s *fleetSim) dispatch(r *desReq) {
	s.materialize(r)
	var idx int
	switch s.policy {
	case "round_robin":
		idx = s.rr % len(s.engines)
		s.rr++
	case "least_loaded":
		s.fillCandidates(nil)
		idx = routing.LeastLoaded(s.cands)
	case "llm":
		t0 := time.Now()
		idx = s.pickLLM(r)
		s.decision = append(s.decision, float64(time.Since(t0).Nanoseconds()))
	}
	e := s.engines[idx]
	e.dispatched++
	e.inflight++
	r.dispatchT = s.now
	r.eng = e
	e.waiting = append(e.waiting, r)
	if !e.busy {
		s.startStep(e)
	}
}

// pickLLM is the gateway's precise-tier decision, as caddymodule's route
// builds it: keys of the prompt's full blocks, the index's matches, each
// engine's gauges and this gateway's accounting, routing.Pick; LeastLoaded
// when every candidate is excluded.
func (s *fleetSim) pickLLM(r *desReq) int {
	var err error
	s.keys, err = kvindex.Keys(s.keys[:0], r.tokens[:r.promptLen], s.bs, 0, nil)
	if err != nil {
		panic(err) // token ids from the model are always valid
	}
	matches := s.ix.MatchKeys(s.bs, 0, s.keys)
	s.fillCandidates(matches)
	d := routing.Pick(routing.Request{
		PromptTokens: r.promptLen, BlockSize: s.bs, TotalBlocks: len(s.keys), Key: spreadKey(r.tokens[:s.bs]),
	}, s.cands, s.cfg, false)
	s.outcomes[d.Tier.String()+"/"+d.Outcome.String()]++
	if d.Index < 0 {
		return routing.LeastLoaded(s.cands)
	}
	return d.Index
}

func (s *fleetSim) fillCandidates(matches []kvindex.EngineMatch) {
	for i, e := range s.engines {
		c := &s.cands[i]
		c.Tier, c.MatchedBlocks = routing.Precise, 0
		c.Running, c.Waiting = e.estimated()
		c.KVUsage = e.snapKV
		c.Inflight, c.Dispatched = int64(e.inflight), int64(e.dispatched)
		c.MaxInflight, c.LoadKnown = s.maxInflight(), true
	}
	for _, m := range matches {
		if i, ok := s.byName[m.Engine]; ok {
			s.cands[i].MatchedBlocks = m.Blocks
		}
	}
}

// spreadKey is caddymodule's tie-break key: FNV-1a of the first block's
// token ids.
func spreadKey(first []uint64) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, t := range first {
		for i := range b {
			b[i] = byte(t >> (8 * i))
		}
		h.Write(b[:])
	}
	return h.Sum64()
}

// scrape is the gauge poller: every engine's running, waiting and KV
// usage as of now; what was dispatched before is now in the gauges.
func (s *fleetSim) scrape() {
	for _, e := range s.engines {
		e.snapRunning, e.snapWaiting = float64(len(e.running)), float64(len(e.waiting))
		e.snapKV = float64(e.used) / float64(e.capacity)
		e.dispatched, e.finished = 0, 0
		e.scrapeT = s.now
	}
	s.unpark()
}

// startStep schedules an engine's next step, or leaves it idle.
func (s *fleetSim) startStep(e *desEngine) {
	m := s.p.Model
	budget := m.MaxBatchedTokens
	prefill := 0
	scheduled := 0
	for i := 0; i < len(e.running); i++ {
		r := e.running[i]
		if r.prefill {
			r.chunk = min(r.target-r.computed, budget)
			budget -= r.chunk
			prefill += r.chunk
			scheduled++
			continue
		}
		// Decoding: the KV of one more token.
		ok := true
		for len(r.blocks) < blocksFor(r.computed+1, s.bs) {
			if e.allocate(r) {
				continue
			}
			victim := e.running[len(e.running)-1]
			s.preempt(e, victim)
			if victim == r {
				ok = false
				break
			}
		}
		if !ok {
			break // r was the last running request
		}
		r.chunk = 1
		budget--
		scheduled++
	}
	for len(e.waiting) > 0 && len(e.running) < m.MaxNumSeqs && budget > 0 {
		r := e.waiting[0]
		if !s.admit(e, r) {
			break
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		r.chunk = min(r.target-r.computed, budget)
		budget -= r.chunk
		prefill += r.chunk
		scheduled++
	}
	if scheduled == 0 {
		e.busy = false
		return
	}
	e.busy = true
	dur := m.DecodeStepSeconds + float64(prefill)/m.PrefillTokensPerSec
	s.push(s.now+dur, evStepEnd, e.idx)
}

// admit reserves the blocks r's prompt needs after its prefix-cache hits,
// if they are free or evictable.
func (s *fleetSim) admit(e *desEngine, r *desReq) bool {
	r.target = len(r.tokens)
	hits := 0
	limit := (r.target - 1) / s.bs // the last token is always computed
	hitsInLRU := 0
	for hits < limit && hits < len(r.hashes) {
		b, ok := e.cache[r.hashes[hits]]
		if !ok {
			break
		}
		if b.ref == 0 {
			hitsInLRU++
		}
		hits++
	}
	need := blocksFor(r.target, s.bs) - hits
	if need > e.freeRaw+e.lruLen-hitsInLRU {
		return false
	}
	r.blocks = r.blocks[:0]
	for i := 0; i < hits; i++ {
		b := e.cache[r.hashes[i]]
		e.ref(b)
		r.blocks = append(r.blocks, b)
	}
	for i := 0; i < need; i++ {
		e.allocate(r)
	}
	r.computed, r.stored = hits*s.bs, hits
	if r.gen == 0 {
		r.cachedTok = hits * s.bs
	}
	r.prefill = true
	r.admitT = s.now
	return true
}

// preempt frees a running request's blocks and puts it back at the head
// of the queue (vLLM's recompute preemption).
func (s *fleetSim) preempt(e *desEngine, r *desReq) {
	e.preemptions++
	e.release(r)
	r.computed, r.stored, r.prefill = 0, 0, false
	for i, x := range e.running {
		if x == r {
			e.running = append(e.running[:i], e.running[i+1:]...)
			break
		}
	}
	e.waiting = append([]*desReq{r}, e.waiting...)
}

// stepEnd applies a step's outputs: prefill progress, one token per
// decoding request, newly full blocks cached (BlockStored), finished
// requests freed; then publishes the step's events to the gateway.
func (s *fleetSim) stepEnd(e *desEngine) {
	keep := e.running[:0]
	var done []*desReq
	for _, r := range e.running {
		if r.chunk == 0 {
			keep = append(keep, r)
			continue
		}
		r.computed += r.chunk
		r.chunk = 0
		s.storeBlocks(e, r)
		if r.prefill && r.computed < r.target {
			keep = append(keep, r)
			continue
		}
		r.prefill = false
		// A token is sampled.
		r.gen++
		if r.gen == 1 {
			r.first = s.now
		}
		r.tokens = append(r.tokens, outputTok(r.id, r.gen))
		if r.gen >= r.maxTokens {
			done = append(done, r)
			continue
		}
		keep = append(keep, r)
	}
	e.running = keep
	for _, r := range done {
		s.finish(e, r)
	}
	s.publish(e)
	s.startStep(e)
	if len(done) > 0 {
		s.unpark()
	}
}

// storeBlocks caches r's blocks that became full, as one BlockStored
// event chained to the block before them.
func (s *fleetSim) storeBlocks(e *desEngine, r *desReq) {
	full := r.computed / s.bs
	if full <= r.stored {
		return
	}
	if len(r.hashes) < full {
		r.hashes = chainHashes(r.hashes, len(r.hashes), r.tokens[:full*s.bs], s.bs)
	}
	first := -1
	for i := r.stored; i < full; i++ {
		b := r.blocks[i]
		h := r.hashes[i]
		if _, dup := e.cache[h]; dup || b.hashed {
			// Another request cached this block first: this copy stays
			// private and is freed without an event.
			if first >= 0 {
				e.stored(r, first, i, s.bs)
				first = -1
			}
			continue
		}
		b.hash, b.hashed = h, true
		e.cache[h] = b
		if first < 0 {
			first = i
		}
	}
	if first >= 0 {
		e.stored(r, first, full, s.bs)
	}
	r.stored = full
}

func (s *fleetSim) finish(e *desEngine, r *desReq) {
	e.release(r)
	e.inflight--
	if r.dispatchT >= e.scrapeT {
		if e.dispatched > 0 {
			e.dispatched--
		}
	} else {
		e.finished++ // the last scrape counted it
	}
	s.completed++
	s.prompt += int64(r.promptLen)
	s.cached += int64(r.cachedTok)
	s.output += int64(r.gen)
	s.ttft = append(s.ttft, r.first-r.arrival)
	s.park = append(s.park, r.dispatchT-r.arrival)
	s.queue = append(s.queue, r.admitT-r.dispatchT)
	s.e2e = append(s.e2e, s.now-r.arrival)
	r.tokens, r.hashes, r.blocks = nil, nil, nil
}

// publish encodes the step's events as a vLLM batch and feeds it to the
// engine's mirror, timing the gateway's share.
func (s *fleetSim) publish(e *desEngine) {
	if len(e.events) == 0 {
		return
	}
	if s.ix != nil {
		payload := s.enc.encode(s.now, e.events, s.bs)
		t0 := time.Now()
		s.feeds[e.idx].Message(nil, e.seq, payload)
		s.eventNs += time.Since(t0)
		s.batches++
		e.seq++
	}
	e.events = e.events[:0]
}

func blocksFor(tokens, bs int) int { return (tokens + bs - 1) / bs }

// chainHashes appends to dst the engine hashes of tokens' full blocks from
// block `from` on, chaining from dst's last hash.
func chainHashes(dst []uint64, from int, tokens []uint64, bs int) []uint64 {
	var parent uint64 = 0x243f6a8885a308d3
	if from > 0 {
		parent = dst[from-1]
	}
	for i := from; (i+1)*bs <= len(tokens); i++ {
		h := parent ^ 0x9e3779b97f4a7c15
		for _, t := range tokens[i*bs : (i+1)*bs] {
			h = (h ^ t) * 0x100000001b3
			h ^= h >> 29
		}
		dst = append(dst, h)
		parent = h
	}
	return dst
}

// outputTok is the k-th generated token of request id.
func outputTok(id, k int) uint64 {
	x := uint64(id)<<20 ^ uint64(k) ^ 0x5bd1e995
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x % 150000
}
