package fleetsim

import (
	"runtime"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/kvindex"
)

// Issue 13's gateways-N scenario: Params.Gateways independent gateways,
// active-active in front of one fleet of engines, as several Caddy
// instances behind one load balancer. Each is a whole gateway core of its
// own; what they share is only the engines, which every gateway scrapes and
// subscribes to.

// gateway is one gateway's core: its fleet (registry accounting,
// approximate tree, KV index with a mirror and a feed per engine), its
// admission gate, and the requests that gate admitted, to dispatch in order.
type gateway struct {
	idx   int
	f     *fleet.Fleet
	feeds []*kvindex.Feed // per engine; nil without KV events
	gate  *admission.Gate
	ready []*desReq
	rr    int // its round_robin's counter: each Caddy keeps its own
}

// precise reports whether the gateways route on KV events: lb_policy llm
// with mirrors and feeds, not Approximate.
func (p Params) precise() bool { return p.Policy == PolicyLLM && !p.Approximate }

// gateways is Params.Gateways with 0 read as one gateway.
func (p Params) gateways() int { return max(p.Gateways, 1) }

// newGateway builds gateway idx over s's engines: a fleet whose config
// lists every engine with its max_inflight, scraped by the simulation's
// clock instead of pollers, and, for precise llm routing, a mirror and a
// feed per engine.
func (s *fleetSim) newGateway(idx int) (*gateway, error) {
	p := s.p
	g := &gateway{idx: idx}
	g.f = fleet.New(zap.NewNop(), fleet.Options{ManualScrape: true, Now: s.clock,
		Index: kvindex.IndexConfig{MaxEngines: max(p.Engines, 64), MaxBlocksPerEngine: 4 * p.KVBlocks}})
	// llm_admission's gate with its default aging, on the simulation's
	// clock. Not the fleet's own (Fleet.Gate): its kicker goroutine would
	// run the gate's tries beside the simulation's loop.
	g.gate = admission.NewGateClock(admission.Config{QueueSize: p.QueueSize}, s.clock)
	cfg := fleet.Config{PollInterval: time.Hour, IdleTTL: time.Hour}
	if p.SpeculativeTTL != 0 {
		ttl := time.Duration(max(p.SpeculativeTTL, 0) * float64(time.Second))
		cfg.SpeculativeTTL = &ttl
	}
	for _, e := range s.engines {
		cfg.Engines = append(cfg.Engines, &fleet.EngineConfig{Dial: e.name, MaxInflight: p.MaxInflight})
	}
	if err := cfg.Validate(); err != nil {
		g.f.Close()
		return nil, err
	}
	g.f.Start(g.f.NewGeneration(cfg, zap.NewNop()))
	if !p.precise() {
		return g, nil
	}
	for _, e := range s.engines {
		m, err := g.f.Index().AddEngine(e.name, kvindex.MirrorConfig{Capacity: p.KVBlocks})
		if err != nil {
			g.f.Close()
			return nil, err
		}
		feed := kvindex.NewFeed(m, nil, kvindex.FeedConfig{})
		feed.Connected()
		g.feeds = append(g.feeds, feed)
	}
	return g, nil
}

// gatewayFor is the gateway arrival i (from 0, bypassing ones included)
// reaches: i mod Params.Gateways, the round robin of a load balancer in
// front of the gateways. It draws nothing, so the workload is that of a
// run with one gateway; a burst's members land on different gateways,
// as a burst of clients behind such a balancer would.
func (s *fleetSim) gatewayFor(i int) *gateway {
	return s.gws[i%len(s.gws)]
}

// closeGateways stops every gateway's fleet still open.
func (s *fleetSim) closeGateways() {
	for _, g := range s.gws {
		if g.f != nil {
			g.f.Close()
			g.f = nil
		}
	}
}

// measureIndex fills the index figures, then drops the fleets: the heap
// gateway 0's fleet frees is one gateway's memory for this fleet.
//
// IndexBlocks and MirrorRestarts are gateway 0's: every gateway mirrors
// every engine from the same batches, so each holds the same, and one
// gateway's figures are what a Caddy instance holds. MirrorProblems sums
// every gateway's, since a problem in any mirror is one.
func (s *fleetSim) measureIndex() {
	if s.p.Policy != PolicyLLM {
		return
	}
	for _, g := range s.gws {
		for _, st := range g.f.Index().Stats() {
			s.res.MirrorProblems += st.Unchainable + st.Malformed + st.DecodeErrors
			if g.idx == 0 {
				s.res.IndexBlocks += st.Blocks
				s.res.IndexCPUBlocks += st.TierBlocks[kvindex.TierCPU]
				s.res.TierUnknown += st.TierUnknown
				s.res.MirrorRestarts += st.Resyncs["restart"]
			}
		}
	}
	s.engines, s.groups, s.q = nil, nil, nil
	first := s.gws[0]
	for _, g := range s.gws {
		g.ready = nil
		if g != first {
			g.f.Close()
			g.f, g.feeds = nil, nil
		}
	}
	runtime.GC()
	var m1, m2 runtime.MemStats
	runtime.ReadMemStats(&m1)
	first.f.Close()
	first.f, first.feeds = nil, nil
	runtime.GC()
	runtime.ReadMemStats(&m2)
	s.res.IndexBytes = int64(m1.HeapAlloc) - int64(m2.HeapAlloc)
}
