// Package fleetsim drives the gateway's own core — a real fleet.Fleet:
// admission's TryReserve, Route's candidate gathering and routing.Pick,
// the Pick's Commit, the Attempt's Dispatch and the registry's accounting, a real kvindex.Index fed
// vLLM KV-event batches through kvindex.Feed — against a discrete-event
// model of N engines, to see how hit rate, TTFT and the gateway's CPU and
// memory behave at fleet sizes one machine cannot run as processes.
//
// The engine model follows vllmsim's scheduler (and so vLLM's):
// prefix-cache hits at admission, whole-prompt block reservation, chunked
// prefill under a token budget, one token per decoding sequence per step,
// LRU eviction of freed cached blocks, recompute preemption. Only the
// engines, the clock, the clients and Caddy's own least_conn and
// round_robin are modelled; every decision of the gateway is its own code.
package fleetsim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Model is one simulated engine's scheduler.
type Model struct {
	MaxNumSeqs          int
	BlockSize           int
	PrefillTokensPerSec float64
	DecodeStepSeconds   float64
	MaxBatchedTokens    int
}

// Policies the simulation routes with.
const (
	PolicyLLM        = "llm"         // lb_policy llm: the fleet's Route
	PolicyLeastConn  = "least_conn"  // Caddy's least_conn: fewest in flight, random among ties
	PolicyRoundRobin = "round_robin" // Caddy's round_robin
)

// Params are one run.
type Params struct {
	Engines  int
	KVBlocks int // per engine
	// CPUBlocks > 0 gives every engine a CPU offload tier of that many
	// blocks (see cputier.go): blocks its GPU evicts are kept there, least
	// recently used first out, announced with the OffloadingConnector's
	// token-less CPU events, and a prompt's prefix continues from the
	// GPU's cached blocks into them. 0: no tier.
	CPUBlocks int
	// CPULoadTokensPerSec is the rate an engine loads blocks back from its
	// CPU tier, in tokens per second; a step lasts that much longer for the
	// blocks its new requests load. 0: DefaultCPULoadSpeedup × the prefill
	// rate.
	CPULoadTokensPerSec float64
	Model               Model
	// The workload: Groups prefix groups of SystemTokens shared tokens;
	// each request adds QuestionTokens of its own and generates
	// OutputTokens.
	Groups                                     int
	SystemTokens, QuestionTokens, OutputTokens int
	Requests                                   int
	Rate                                       float64 // arrivals per simulated second (Poisson)
	// LongEvery > 0 makes every LongEvery-th request a long prompt of
	// LongTokens (its group's system prompt, then tokens of its own), to
	// see what long prefills do to everyone else; their TTFTs go to
	// Result.LongTTFT instead of TTFT.
	LongEvery, LongTokens int
	// BurstSize > 1 makes arrivals bursts: BurstSize requests of one group
	// spread evenly over BurstWindow seconds, bursts arriving as a Poisson
	// process at Rate ÷ BurstSize, each burst the next group in turn (so
	// with as many groups as bursts, every burst brings a new prefix).
	BurstSize   int
	BurstWindow float64
	Policy      string
	// MaxInflight is every engine's max_inflight in the llm app: the
	// admission limit and the policy's saturation rule.
	MaxInflight  int
	KVLimit      float64 // llm_admission's kv_limit
	PollInterval float64 // seconds between scrapes
	MaxPark      float64 // seconds a request may park
	QueueSize    int     // parked requests at most
	LongPrefill  int     // llm_admission's long_prefill (0: its default; negative: off)
	// SpeculativeTTL is the llm app's speculative_ttl in seconds (0: its
	// default; negative: off).
	SpeculativeTTL float64
	// Unplaced routes every lb_policy llm request with Fleet.Route, after
	// admission counted room as for the other policies (Fleet.TryReserve),
	// instead of placing it (Fleet.Place, Placement.Reserve). The product
	// places a request whenever llm_admission gates a pool routed by
	// lb_policy llm; this isolates the policy's own cost, which credits
	// offload tiers, from the placement's, which does not (yet).
	Unplaced bool
	// Approximate runs lb_policy llm as for engines without KV events: the
	// index has no mirror of them, so Route falls back to the approximate
	// tree of what this gateway routed, keyed on the prompt's text (each
	// request then carries its tokens rendered as a text prompt).
	Approximate bool
	// BypassShare (0..1) of the arrivals do not pass the gateway: their
	// callers send them straight to an engine of their own choosing
	// (uniformly at random), skipping admission and routing. The gateway
	// sees them only in the engines' gauges and KV events.
	BypassShare float64
	// Warm sends, before any user request, one request of every group
	// straight to a random engine, as other clients would have; user
	// traffic starts when the last of them completes.
	Warm bool
	// RestartEvery > 0 restarts the engines one at a time, in turn, every
	// RestartEvery seconds once user traffic starts (see restart).
	RestartEvery float64
	// Gateways > 1 puts that many independent gateways, active-active, in
	// front of the one fleet of engines, as several Caddy instances behind
	// a load balancer (0 or 1: one gateway). Each has its own fleet
	// (registry accounting, approximate tree, and a KV index whose mirrors
	// are fed every engine's event batches), its own admission gate
	// allowing MaxInflight per engine of its own, and its own scrapes of
	// the engines' gauges, which are global as vLLM's /metrics are.
	// Arrival i goes to gateway i mod Gateways (see gatewayFor); a request
	// is placed, admitted, routed and ended on its gateway only. Result's
	// figures sum over the gateways, except the index's (measureIndex).
	Gateways int
	// Cost is lb_policy llm's cost configuration; zero fields take their
	// defaults.
	Cost routing.Config
	// Trace, when set, replaces the synthetic workload (Groups, the token
	// counts, Requests, Rate, bursts and long prompts) with a production
	// trace's requests, replayed in order at their timestamps divided by
	// TraceSpeedup (see replay.go).
	Trace        []TraceRequest
	TraceSpeedup float64 // time compression of Trace; 0 means 1
	Seed         uint64
	// Decided, if set, sees every llm decision before the request is
	// dispatched, so a test can ask the gateway's policy the same question.
	// An error ends the run.
	Decided func(Decided) error
}

// Decided is one llm routing decision as the simulation made it.
type Decided struct {
	Fleet       *fleet.Fleet // the deciding gateway's
	Gateway     int          // its index (Params.Gateways)
	Query       fleet.Query  // Query.Tokens holds the prompt
	Reservation *upstreams.Reservation
	Decision    fleet.Decision
	// Placement is admission's placement of the request (nil for none);
	// when it reserved on a known engine, the request goes there.
	Placement *fleet.Placement
	// Chosen is the engine the request goes to: the placement's engine,
	// else Decision's pick, or least_conn's when Route had none.
	Chosen string
}

// Result is one run's outcome. Times are simulated seconds, except the
// gateway's CPU figures, which are host time. Every request is completed,
// rejected or failed.
type Result struct {
	Completed, Rejected int
	// Failed counts requests an engine restart lost (Params.RestartEvery):
	// they are not retried, and count in no other figure.
	Failed int
	// Restarts counts engine restarts.
	Restarts int
	// Bypassed counts the completed requests that went straight to an
	// engine (Params.BypassShare); BypassPromptTokens and
	// BypassCachedTokens are their part of PromptTokens and CachedTokens.
	Bypassed                               int
	BypassPromptTokens, BypassCachedTokens int64
	// Warmed counts the warm-up's requests (Params.Warm), which count in
	// no other figure.
	Warmed int
	// Refusals counts admission refusals, every gateway's; RefusedIdle
	// sums the sequence slots actually free in the fleet at those moments
	// (the gauges the gate reads are up to a poll interval old).
	Refusals, RefusedIdle int
	PromptTokens          int64
	CachedTokens          int64
	// CPUCachedTokens are the prompt tokens completed requests loaded from
	// their engine's CPU tier (Params.CPUBlocks) rather than computed; they
	// are not in CachedTokens, the GPU's prefix-cache hits, as vLLM counts
	// a connector's hits apart (vllm:external_prefix_cache_hits).
	CPUCachedTokens int64
	// Offloaded counts the blocks engines' GPUs evicted into their CPU
	// tiers; CPUTierBlocks is what those tiers held at the end.
	Offloaded, CPUTierBlocks int
	OutputTokens             int64
	// Per completed request: time to first token, end to end, parked in
	// admission, and queued in the engine before its last admission.
	TTFT, E2E, Park, Queue []float64
	LongTTFT               []float64 // of the long prompts (Params.LongEvery)
	// Predicted and Observed pair, per completed request the llm policy
	// routed with a prediction, the routing decision's predicted time to
	// first token and the one observed from dispatch.
	Predicted, Observed []float64
	// BurstEngines is, per burst, how many engines its requests went to;
	// BurstPromptTokens and BurstCachedTokens sum the prompts and cache
	// hits of every burst's requests after its first.
	BurstEngines                         []int
	BurstPromptTokens, BurstCachedTokens int64
	SimSeconds                           float64
	Preemptions                          int
	// The gateway (llm): host nanoseconds per Route, host time decoding
	// events and updating mirrors, and what the index holds. DecisionNs,
	// EventTime and EventBatches cover every gateway (each gateway's feed
	// of a batch counts); the index figures are one gateway's (see
	// measureIndex).
	DecisionNs   []float64
	EventTime    time.Duration
	EventBatches int
	Outcomes     map[string]int
	IndexBlocks  int
	// IndexCPUBlocks is the blocks the index holds in the engines' CPU
	// tiers, and TierUnknown the CPU-tier blocks it could not apply (their
	// engine hash unknown to the mirror); gateway 0's, as IndexBlocks.
	IndexCPUBlocks int
	TierUnknown    uint64
	MirrorProblems uint64 // unchainable + malformed + decode errors: should be 0
	// MirrorRestarts counts the mirror resets the feeds made on seeing an
	// engine's sequence start again (Params.RestartEvery).
	MirrorRestarts uint64
	IndexBytes     int64 // heap freed when the fleet is dropped
}

// Event kinds of the discrete-event loop.
const (
	evArrival     = iota
	evBurstMember // one request of a burst: eng is the burst's index, pos its place
	evStepEnd
	evScrape
	evMaxPark
	evRestart // eng is the engine to restart
)

type simEvent struct {
	t    float64
	seq  uint64 // FIFO among equal times
	kind int
	eng  int
	pos  int               // evBurstMember: the request's place in its burst
	w    *admission.Waiter // evMaxPark: the parked request's place at the gate
	gen  int               // evStepEnd: the engine's restarts when the step began
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
	p   Params
	bs  int
	now float64
	// nowNS is now in ns, for clock: the fleet's registry reads its
	// clock from goroutines of its own too (idle collection).
	nowNS   atomic.Int64
	q       eventQueue
	qseq    uint64
	engines []*desEngine
	dials   []string
	rng     *rand.Rand
	groups  []desGroup
	nextID  int
	arrived int

	// The gateways (Params.Gateways), configured alike.
	gws      []*gateway
	settings fleet.Settings
	limits   fleet.Limits
	enc      *batchEncoder
	epoch    time.Time // the fleets' clock reads epoch + now
	res      Result
	// Bursts: requests scheduled so far, and each burst's engines.
	scheduled int
	burstSeen [][]int
	// Scenarios: the callers' own choices (bypass, warm-up engines), kept
	// apart from rng so that they leave the workload as it is; and the
	// warm-up requests still running.
	crng    *rand.Rand
	warming int
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
	long      bool   // a long prompt (Params.LongEvery)
	direct    bool   // sent straight to its engine (Params.BypassShare, Params.Warm)
	warm      bool   // a warm-up request (Params.Warm)
	text      []byte // the prompt as text (Params.Approximate)
	burst     int    // its burst's index (-1: none)
	pos       int    // its place in the burst
	gen       int
	target    int // tokens to prefill at this admission
	computed  int // tokens whose KV is computed
	stored    int // leading blocks cached (hits or stored)
	chunk     int
	blocks    []*desBlock
	prefill   bool
	cachedTok int // GPU prefix-cache hits at its first admission
	cpuTok    int // tokens loaded from the CPU tier at its first admission
	loading   int // tokens to load from the CPU tier in its first step
	arrival   float64
	first     float64
	dispatchT float64
	admitT    float64
	eng       *desEngine
	gw        *gateway               // the gateway it reached (nil: none)
	res       *upstreams.Reservation // the gateway's accounting of it
	place     *fleet.Placement       // admission's placement (llm only)
	attempt   *fleet.Attempt         // its dispatch to eng
	placeNs   float64                // host time of Place
	waiter    *admission.Waiter
}

func (s *fleetSim) push(t float64, kind, eng int) {
	s.qseq++
	heap.Push(&s.q, simEvent{t: t, seq: s.qseq, kind: kind, eng: eng})
}

// clock is the simulated time as the fleet and the gate read it.
func (s *fleetSim) clock() time.Time {
	return s.epoch.Add(time.Duration(s.nowNS.Load()))
}

// Run simulates one run to its end: every request completed or refused.
func Run(ctx context.Context, p Params) (Result, error) {
	if p.Trace != nil {
		var err error
		if p, err = p.forTrace(); err != nil {
			return Result{}, err
		}
	}
	if p.Engines <= 0 || p.Groups <= 0 || p.Rate <= 0 || p.Model.BlockSize <= 0 || p.MaxInflight <= 0 {
		return Result{}, fmt.Errorf("fleetsim: engines, groups, rate, block size and max_inflight must be positive: %+v", p)
	}
	if p.BypassShare < 0 || p.BypassShare > 1 || p.RestartEvery < 0 || p.CPUBlocks < 0 || p.CPULoadTokensPerSec < 0 {
		return Result{}, fmt.Errorf("fleetsim: bypass share must be within 0..1, restart interval, CPU tier and its load rate not negative: %+v", p)
	}
	s, err := newSim(p)
	if err != nil {
		return Result{}, err
	}
	defer s.closeGateways()
	s.scrape() // the pollers' start-up scrape
	s.start()
	s.push(p.PollInterval, evScrape, -1)
	for s.q.Len() > 0 {
		if s.arrived%4096 == 0 && ctx.Err() != nil {
			return s.res, ctx.Err()
		}
		ev := heap.Pop(&s.q).(simEvent)
		s.now = ev.t
		s.nowNS.Store(int64(ev.t * float64(time.Second)))
		if err := s.handle(ev); err != nil {
			return s.res, err
		}
	}
	s.res.SimSeconds = s.now
	for _, e := range s.engines {
		s.res.Preemptions += e.preemptions
		s.res.Offloaded += e.offloaded
		if e.cpu != nil {
			s.res.CPUTierBlocks += e.cpu.len()
		}
	}
	s.measureIndex()
	return s.res, nil
}

// handle applies one event of the loop.
func (s *fleetSim) handle(ev simEvent) error {
	p := s.p
	switch ev.kind {
	case evArrival:
		if p.Trace != nil {
			return s.arriveTrace()
		}
		if p.BurstSize > 1 {
			s.burst()
			return nil
		}
		if err := s.arrive(-1, 0); err != nil {
			return err
		}
		if s.arrived < p.Requests {
			s.push(s.now+s.rng.ExpFloat64()/p.Rate, evArrival, -1)
		}
	case evBurstMember:
		return s.arrive(ev.eng, ev.pos)
	case evStepEnd:
		if e := s.engines[ev.eng]; ev.gen == e.gen {
			return s.stepEnd(e)
		} // else the step was lost to a restart
	case evRestart:
		return s.restartNext(ev.eng)
	case evScrape:
		if err := s.scrape(); err != nil {
			return err
		}
		if s.outstanding() {
			s.push(s.now+p.PollInterval, evScrape, -1)
		}
	case evMaxPark:
		if !ev.w.Leave() {
			s.res.Rejected++ // max_park: 503
		}
	}
	return nil
}

// burst starts the next burst: BurstSize requests of the next group, at
// random moments within BurstWindow (the last burst may be smaller), and
// schedules the burst after it.
func (s *fleetSim) burst() {
	p := s.p
	n := min(p.BurstSize, p.Requests-s.scheduled)
	b := len(s.res.BurstEngines)
	s.res.BurstEngines = append(s.res.BurstEngines, 0)
	s.burstSeen = append(s.burstSeen, nil)
	for i := range n {
		// Spread evenly over the window, in order.
		t := s.now + p.BurstWindow*float64(i)/float64(max(n-1, 1))
		s.qseq++
		heap.Push(&s.q, simEvent{t: t, seq: s.qseq, kind: evBurstMember, eng: b, pos: i})
	}
	s.scheduled += n
	if s.scheduled < p.Requests {
		s.push(s.now+s.rng.ExpFloat64()*float64(p.BurstSize)/p.Rate, evArrival, -1)
	}
}

// newSim builds the engines, the groups' system prompts and the gateways
// (newGateway).
func newSim(p Params) (*fleetSim, error) {
	s := &fleetSim{p: p, bs: p.Model.BlockSize, rng: rand.New(rand.NewPCG(p.Seed, uint64(p.Engines))), epoch: time.Unix(1_000_000, 0),
		crng: rand.New(rand.NewPCG(p.Seed, 0x63616c6c6572))}
	s.res.Outcomes = map[string]int{}
	// System prompts: random token ids, so groups share nothing.
	grng := rand.New(rand.NewPCG(p.Seed, 0x67726f7570))
	for range p.Groups {
		toks := make([]uint64, p.SystemTokens)
		for i := range toks {
			toks[i] = grng.Uint64N(150000)
		}
		s.groups = append(s.groups, desGroup{tokens: toks, hashes: chainHashes(nil, 0, toks, s.bs)})
	}
	for i := range p.Engines {
		e := newDESEngine(i, p.KVBlocks, p.CPUBlocks)
		s.engines, s.dials = append(s.engines, e), append(s.dials, e.name)
	}
	s.settings = fleet.DefaultSettings()
	s.settings.Cost = p.Cost
	s.settings.Cost.SetDefaults()
	s.limits = fleet.Limits{KV: p.KVLimit, LongPrefill: p.LongPrefill}
	if p.precise() {
		s.enc = newBatchEncoder()
	}
	runtime.GC()
	for i := range p.gateways() {
		g, err := s.newGateway(i)
		if err != nil {
			s.closeGateways()
			return nil, err
		}
		s.gws = append(s.gws, g)
	}
	return s, nil
}

// arrive creates the next request and passes it through llm_admission's
// gate: sent at once when admitted, else parked until a Kick admits it or
// MaxPark passes; refused when the queue is full.
//
// burst < 0 picks the request's group at random; otherwise it is request
// pos of that burst, whose group is the burst's index modulo the groups.
func (s *fleetSim) arrive(burst, pos int) error {
	s.arrived++
	p := s.p
	r := &desReq{id: s.nextID, burst: burst, pos: pos, qseed: s.rng.Uint64(), arrival: s.now,
		maxTokens: p.OutputTokens, promptLen: p.SystemTokens + p.QuestionTokens}
	if burst < 0 {
		r.group = s.rng.IntN(len(s.groups))
	} else {
		r.group = burst % len(s.groups)
	}
	s.nextID++
	if p.LongEvery > 0 && s.arrived%p.LongEvery == 0 {
		r.long, r.promptLen = true, max(p.LongTokens, r.promptLen)
	}
	s.materialize(r)
	return s.enter(r)
}

// enter passes a new request through its gateway's admission, or
// straight to an engine when it bypasses the gateway.
func (s *fleetSim) enter(r *desReq) error {
	p := s.p
	gw := s.gatewayFor(s.arrived - 1)
	if s.bypasses() {
		r.direct, r.burst = true, -1 // burst figures are of the gateway's requests
		s.send(r, s.crng.IntN(len(s.engines)))
		return nil
	}
	r.gw = gw
	var err error
	if p.Policy == PolicyLLM && !p.Unplaced {
		// The handler places requests for a pool routed by lb_policy llm.
		t0 := time.Now()
		r.place = gw.f.Place(context.Background(), s.query(r))
		r.placeNs = float64(time.Since(t0).Nanoseconds())
		r.waiter, err = gw.gate.EnterPlaced(admission.Normal, s.tryPlaced(r))
	} else {
		r.waiter, err = gw.gate.Enter(admission.Normal, func() bool { return s.tryPlain(r) })
	}
	switch {
	case errors.Is(err, admission.ErrQueueFull):
		s.res.Rejected++
		return nil
	case err != nil:
		return fmt.Errorf("fleetsim: admission: %w", err)
	}
	select {
	case <-r.waiter.Ready():
	default:
		s.qseq++
		heap.Push(&s.q, simEvent{t: s.now + p.MaxPark, seq: s.qseq, kind: evMaxPark, w: r.waiter})
	}
	return s.dispatchReady()
}

// query is the routing question of a request.
func (s *fleetSim) query(r *desReq) fleet.Query {
	return fleet.Query{Request: &openai.Request{Model: "sim-model", Prompt: r.text}, Dials: s.dials, Settings: s.settings,
		Tokens: r.tokens[:r.promptLen]}
}

// tryPlaced is the handler's try for a placed request: the placement's
// Reserve.
func (s *fleetSim) tryPlaced(r *desReq) admission.PlacedFunc {
	return func(pass admission.Pass) bool {
		res, _, ok := r.place.Reserve(s.dials, s.limits, pass)
		s.tried(r, res, ok, pass == admission.PassAny)
		return ok
	}
}

// tryPlain is the handler's try without a placement: TryReserve.
func (s *fleetSim) tryPlain(r *desReq) bool {
	res, _, ok := r.gw.f.TryReserve(s.dials, s.limits)
	s.tried(r, res, ok, true)
	return ok
}

// tried records a try's outcome: the admitted request queues for
// dispatch; a refusal counts with the sequence slots actually free then
// (the gauges the gate reads are up to a poll interval old).
func (s *fleetSim) tried(r *desReq, res *upstreams.Reservation, ok, counted bool) {
	if ok {
		r.res = res // never nil: the pool is not empty
		r.gw.ready = append(r.gw.ready, r)
		return
	}
	if !counted {
		return
	}
	for _, e := range s.engines {
		s.res.RefusedIdle += max(0, s.p.Model.MaxNumSeqs-len(e.running)-len(e.waiting))
	}
	s.res.Refusals++
}

// dispatchReady sends the requests the gates admitted, each gateway's in
// its admission order.
func (s *fleetSim) dispatchReady() error {
	for _, g := range s.gws {
		for len(g.ready) > 0 {
			r := g.ready[0]
			g.ready = g.ready[1:]
			if err := s.dispatch(r, r.res); err != nil {
				return err
			}
		}
	}
	return nil
}

// unpark is the fleets' kickers: capacity may have freed (a scrape, a
// completion, a restart), so every gate admits what it can. Every gateway
// is kicked, not only the one whose reservation ended: the others see the
// freed engine at their next scrape anyway, and a kick with nothing freed
// admits nothing more (it may count refusals again).
func (s *fleetSim) unpark() error {
	for _, g := range s.gws {
		g.gate.Kick()
	}
	return s.dispatchReady()
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
	if s.p.Approximate {
		r.text = promptText(r.tokens[:r.promptLen])
	}
}

// dispatch routes an admitted request with the policy under test and
// hands it to the engine; the fleet moves its reservation there.
func (s *fleetSim) dispatch(r *desReq, res *upstreams.Reservation) error {
	var idx int
	var a *fleet.Attempt // nil: a policy of Caddy's own chose, not the fleet
	switch s.p.Policy {
	case PolicyRoundRobin:
		idx = r.gw.rr % len(s.engines)
		r.gw.rr++
	case PolicyLeastConn:
		idx = s.leastConn(r.gw)
	default:
		var err error
		if idx, a, err = s.route(r, res); err != nil {
			return err
		}
	}
	e := s.engines[idx]
	if r.burst >= 0 && !slices.Contains(s.burstSeen[r.burst], idx) {
		s.burstSeen[r.burst] = append(s.burstSeen[r.burst], idx)
		s.res.BurstEngines[r.burst]++
	}
	if a == nil {
		a = r.gw.f.Proxied(e.name)
	}
	r.attempt = a
	r.res = a.Dispatch(res)
	s.send(r, idx)
	return nil
}

// send hands r to engine idx's queue.
func (s *fleetSim) send(r *desReq, idx int) {
	e := s.engines[idx]
	r.dispatchT = s.now
	r.eng = e
	e.waiting = append(e.waiting, r)
	if !e.busy {
		s.startStep(e)
	}
}

// route is lb_policy llm on r's gateway: the engine admission placed the
// request on, else the fleet's Route on the prompt's tokens (the admission reservation
// left out of its engine's load), least_conn when every candidate is
// excluded, and the pick committed to record it.
func (s *fleetSim) route(r *desReq, res *upstreams.Reservation) (int, *fleet.Attempt, error) {
	gw := r.gw
	q := s.query(r)
	q.Own = res.Engine().Dial()
	pick, placed := r.place.Pick(s.dials)
	ns := r.placeNs
	if !placed {
		t0 := time.Now()
		pick = gw.f.Route(context.Background(), q)
		ns += float64(time.Since(t0).Nanoseconds())
	}
	s.res.DecisionNs = append(s.res.DecisionNs, ns)
	idx, tier := pick.Index, pick.Tier
	if idx < 0 {
		idx, tier = s.leastConn(gw), routing.LoadOnly
	}
	s.res.Outcomes[tier.String()+"/"+pick.Outcome.String()]++
	a := pick.Commit(s.dials[idx])
	if s.p.Decided != nil {
		err := s.p.Decided(Decided{Fleet: gw.f, Gateway: gw.idx, Query: q, Reservation: res, Decision: pick.Decision, Placement: r.place, Chosen: s.dials[idx]})
		if err != nil {
			return 0, nil, err
		}
	}
	return idx, a, nil
}

// leastConn is Caddy's least_conn on gateway gw: the engine with the
// fewest requests in flight through gw, a random one among ties.
func (s *fleetSim) leastConn(gw *gateway) int {
	best, ties := -1, 0
	var least int64
	for i, d := range s.dials {
		n := gw.f.Registry().Ensure(d).Load().Inflight
		switch {
		case best < 0 || n < least:
			best, least, ties = i, n, 1
		case n == least:
			ties++
			if s.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// scrape is the gauge pollers: every engine's running, waiting and KV
// usage as of now, recorded through every gateway's registry as a poll
// would. The gauges are the engine's, whichever gateway sent its requests,
// so every gateway reads the same.
func (s *fleetSim) scrape() error {
	for _, e := range s.engines {
		gauges := upstreams.Gauges{
			Running:      float64(len(e.running)),
			Waiting:      float64(len(e.waiting)),
			KVUsage:      float64(e.used) / float64(e.capacity),
			BlockSize:    s.bs,
			NumGPUBlocks: e.capacity,
			PromptTokens: e.promptTokens, CachedTokens: e.cachedTokens, PrefillSeconds: e.prefillSeconds,
			PrefillCount: e.prefills,
		}
		for _, g := range s.gws {
			g.f.Registry().Ensure(e.name).StartScrape()(gauges)
		}
	}
	return s.unpark()
}

// finish ends a request: its engine frees its blocks, the gateway's
// reservation ends, and its figures are recorded.
func (s *fleetSim) finish(e *desEngine, r *desReq) {
	e.release(r)
	if r.warm {
		s.warmed(r)
		return
	}
	if r.res != nil { // nil: it bypassed the gateway
		r.res.Done()
	}
	if r.direct {
		s.res.Bypassed++
		s.res.BypassPromptTokens += int64(r.promptLen)
		s.res.BypassCachedTokens += int64(r.cachedTok)
	}
	s.res.Completed++
	s.res.PromptTokens += int64(r.promptLen)
	s.res.CachedTokens += int64(r.cachedTok)
	s.res.CPUCachedTokens += int64(r.cpuTok)
	s.res.OutputTokens += int64(r.gen)
	if r.burst >= 0 && r.pos > 0 {
		s.res.BurstPromptTokens += int64(r.promptLen)
		s.res.BurstCachedTokens += int64(r.cachedTok)
	}
	if r.long {
		s.res.LongTTFT = append(s.res.LongTTFT, r.first-r.arrival)
	} else {
		s.res.TTFT = append(s.res.TTFT, r.first-r.arrival)
	}
	if r.attempt != nil && r.attempt.Predicted > 0 {
		s.res.Predicted = append(s.res.Predicted, r.attempt.Predicted)
		s.res.Observed = append(s.res.Observed, r.first-r.dispatchT)
	}
	s.res.Park = append(s.res.Park, r.dispatchT-r.arrival)
	s.res.Queue = append(s.res.Queue, r.admitT-r.dispatchT)
	s.res.E2E = append(s.res.E2E, s.now-r.arrival)
	r.drop()
}

// publish encodes the step's events as a vLLM batch and feeds it to the
// engine's mirror in every gateway, as each gateway's subscriber receives
// it, timing the gateways' share.
func (s *fleetSim) publish(e *desEngine) {
	if len(e.events) == 0 {
		return
	}
	if s.enc != nil {
		payload := s.enc.encode(s.now, e.events, s.bs)
		for _, g := range s.gws {
			t0 := time.Now()
			g.feeds[e.idx].Message(nil, e.seq, payload)
			s.res.EventTime += time.Since(t0)
			s.res.EventBatches++
		}
		e.seq++
	}
	e.events = e.events[:0]
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
	load := 0 // tokens loaded from the CPU tier before the step computes
	for len(e.waiting) > 0 && len(e.running) < m.MaxNumSeqs && budget > 0 {
		r := e.waiting[0]
		if !s.engineAdmit(e, r) {
			break
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, r)
		r.chunk = min(r.target-r.computed, budget)
		budget -= r.chunk
		prefill += r.chunk
		load += r.loading
		r.loading = 0
		scheduled++
	}
	if scheduled == 0 {
		e.busy = false
		return
	}
	e.busy = true
	dur := m.DecodeStepSeconds + float64(prefill)/m.PrefillTokensPerSec + float64(load)/s.p.cpuLoadRate()
	s.qseq++
	heap.Push(&s.q, simEvent{t: s.now + dur, seq: s.qseq, kind: evStepEnd, eng: e.idx, gen: e.gen})
}

// engineAdmit is the engine scheduler's admission: it reserves the blocks r's prompt needs after its prefix-cache hits,
// if they are free or evictable. Past the GPU's hits the prefix continues
// into the CPU tier: those blocks get GPU blocks too, and are loaded
// (startStep charges the load) instead of computed.
func (s *fleetSim) engineAdmit(e *desEngine, r *desReq) bool {
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
	loaded := e.reserveLoads(r, hits, limit, need)
	r.computed, r.stored = (hits+loaded)*s.bs, hits
	r.loading = loaded * s.bs
	if r.gen == 0 {
		r.cachedTok, r.cpuTok = hits*s.bs, loaded*s.bs
	}
	r.prefill = true
	r.admitT = s.now
	return true
}

// reserveLoads allocates r's need blocks past its hits GPU blocks and
// returns how many of them, from the first, it loads from the CPU tier.
// The tier's blocks it will load are made its most recently used first,
// so that the allocation's offloads evict others; what the tier still
// holds in a row after them is loaded (tier-less engines: none).
func (e *desEngine) reserveLoads(r *desReq, hits, limit, need int) int {
	loads := e.cpuHits(r, hits, limit)
	for _, h := range r.hashes[hits : hits+loads] {
		e.cpu.touch(h)
	}
	for i := 0; i < need; i++ {
		e.allocate(r)
	}
	if loads == 0 {
		return 0
	}
	return e.cpu.run(r.hashes[hits : hits+loads])
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
func (s *fleetSim) stepEnd(e *desEngine) error {
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
			r.res.Prefilled() // the gateway sees the stream's first token
			e.promptTokens += float64(r.promptLen)
			e.cachedTokens += float64(r.cachedTok)
			e.prefillSeconds += s.now - r.admitT
			e.prefills++
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
		return s.unpark()
	}
	return nil
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
