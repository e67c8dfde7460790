package fleetsim

import (
	"context"
	"slices"
	"testing"

	"github.com/llmgw/caddy-llmgw/kvindex"
)

// TestBatchEncoderCPUTier: the CPU tier's events decode as the
// OffloadingConnector's: medium CPU, the engine hash from the digest's
// last 8 bytes, no parent, no tokens, block size 0.
func TestBatchEncoderCPUTier(t *testing.T) {
	evs := []desEvent{
		{cpu: true, stored: true, hashes: []uint64{1<<63 + 5}},
		{cpu: true, hashes: []uint64{7}},
	}
	b, err := kvindex.DecodeBatch(newBatchEncoder().encode(2, evs, 16))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 2 || b.Unknown != 0 {
		t.Fatalf("batch %+v", b)
	}
	for i, want := range evs {
		got := b.Events[i]
		kind := kvindex.EventBlockRemoved
		if want.stored {
			kind = kvindex.EventBlockStored
		}
		if got.Kind != kind || got.Medium != "CPU" || !slices.Equal(got.BlockHashes, want.hashes) || got.HasParent ||
			len(got.TokenIDs) != 0 || got.BlockSize != 0 || got.GroupIdx != 0 {
			t.Errorf("event %d: %+v, want %+v", i, got, want)
		}
	}
}

// tierParams is pressureParams with a CPU tier half each engine's GPU
// cache.
func tierParams(policy string) Params {
	p := pressureParams(policy)
	p.Groups, p.KVBlocks = 32, 256
	p.CPUBlocks = p.KVBlocks / 2
	return p
}

// TestCPUTierEventsReachIndex: under KV pressure the engines offload
// evicted blocks to their CPU tiers and load prefixes back from them, and
// the gateway's mirrors, fed the token-less CPU events, end holding
// exactly the blocks the tiers hold, with no event they could not apply.
func TestCPUTierEventsReachIndex(t *testing.T) {
	r := mustRun(t, tierParams(PolicyLLM))
	t.Logf("offloaded %d blocks, tiers hold %d, index %d; CPU hits %d tokens, GPU hits %d of %d prompt tokens",
		r.Offloaded, r.CPUTierBlocks, r.IndexCPUBlocks, r.CPUCachedTokens, r.CachedTokens, r.PromptTokens)
	if r.Offloaded == 0 || r.CPUCachedTokens == 0 {
		t.Fatalf("no block offloaded (%d) or loaded back (%d tokens) under KV pressure", r.Offloaded, r.CPUCachedTokens)
	}
	if r.IndexCPUBlocks != r.CPUTierBlocks || r.TierUnknown != 0 || r.MirrorProblems != 0 {
		t.Errorf("the mirrors hold %d CPU blocks, the engines %d; %d CPU blocks unknown, %d problems",
			r.IndexCPUBlocks, r.CPUTierBlocks, r.TierUnknown, r.MirrorProblems)
	}
	if r.CachedTokens+r.CPUCachedTokens > r.PromptTokens {
		t.Errorf("%d GPU and %d CPU hits of %d prompt tokens", r.CachedTokens, r.CPUCachedTokens, r.PromptTokens)
	}
}

// TestCPUTierOffChangesNothing: without a tier nothing is offloaded or
// credited, and a tier that never receives a block (caches that hold
// everything) leaves a run exactly as it was.
func TestCPUTierOffChangesNothing(t *testing.T) {
	p := tierParams(PolicyLLM)
	p.CPUBlocks = 0
	off := mustRun(t, p)
	if off.Offloaded != 0 || off.CPUCachedTokens != 0 || off.IndexCPUBlocks != 0 || off.CPUTierBlocks != 0 {
		t.Fatalf("without a tier: %d offloaded, %d CPU hits, %d CPU blocks indexed", off.Offloaded, off.CPUCachedTokens, off.IndexCPUBlocks)
	}
	p.KVBlocks = 4096 // every group fits every engine: nothing is evicted
	roomy := mustRun(t, p)
	p.CPUBlocks = 64
	idle := mustRun(t, p)
	if idle.Offloaded != 0 {
		t.Fatalf("%d blocks offloaded from caches that hold everything", idle.Offloaded)
	}
	if !slices.Equal(idle.TTFT, roomy.TTFT) || idle.CachedTokens != roomy.CachedTokens || idle.EventBatches != roomy.EventBatches {
		t.Errorf("an idle tier changed the run: TTFT equal %v, cached %d vs %d, batches %d vs %d",
			slices.Equal(idle.TTFT, roomy.TTFT), idle.CachedTokens, roomy.CachedTokens, idle.EventBatches, roomy.EventBatches)
	}
}

// tierTrace is a prompt of family X (two shared trace blocks and one of
// its own), then fillers of four blocks of their own in pairs arriving
// together (so that each pair occupies both engines), each of which takes
// all of an engine's 129-block GPU cache and so evicts whatever it cached
// (into its CPU tier), then X's prefix again with a new last block.
// Arrivals are 10 s apart: each ends before the next.
func tierTrace(pairs int) []TraceRequest {
	x := func(at int64, own uint64) TraceRequest {
		ids := []uint64{7000, 7001, 900_000 + own}
		return TraceRequest{Timestamp: at, InputLength: len(ids) * TraceBlockTokens, OutputLength: 8, HashIDs: ids}
	}
	out := []TraceRequest{x(0, 0)}
	for j := 0; j < 2*pairs; j++ {
		f := uint64(j+1) * 10
		ids := []uint64{f, f + 1, f + 2, f + 3}
		out = append(out, TraceRequest{Timestamp: int64(1+j/2) * 10_000, InputLength: len(ids) * TraceBlockTokens, OutputLength: 8, HashIDs: ids})
	}
	return append(out, x(int64(pairs+1)*10_000, 1))
}

// tierDecisions runs tierTrace on two engines with a CPU tier and cost
// configuration cost, and returns the engine each request went to and,
// for the last request, every candidate as Route scored it.
func tierDecisions(t *testing.T, cost func(*Params)) (Result, []string, []kvindexScored) {
	t.Helper()
	const pairs = 2
	fillers := 2 * pairs
	p := traceParams(PolicyLLM, tierTrace(pairs), 2)
	p.KVBlocks, p.CPUBlocks, p.Requests = 129, 1024, fillers+2
	// Routed by Fleet.Route: admission's placement (Fleet.Place) does not
	// credit offload tiers. Speculative entries are off, so that the
	// Route asked after the decision's Commit sees what the decision saw.
	p.Unplaced, p.SpeculativeTTL = true, -1
	cost(&p)
	var chosen []string
	var last []kvindexScored
	p.Decided = func(d Decided) error {
		chosen = append(chosen, d.Chosen)
		if len(chosen) == fillers+2 {
			q := d.Query
			q.Explain = true
			for _, s := range d.Fleet.Route(context.Background(), q).Decision.Scored {
				last = append(last, kvindexScored{dial: s.Dial, gpu: s.MatchedBlocks, cpu: s.CPUBlocks})
			}
			last = append(last, kvindexScored{dial: "prefill", gpu: int(d.Decision.Prefill)})
		}
		return nil
	}
	r := mustRun(t, p)
	return r, chosen, last
}

// kvindexScored is one candidate of the last decision in tierDecisions;
// a final entry named "prefill" carries the decision's uncached prompt
// tokens in gpu.
type kvindexScored struct {
	dial     string
	gpu, cpu int
}

// TestCPUTierCredited: a prefix the GPU evicted to its CPU tier is found
// there, the engine holding it is credited for it and gets the request,
// which loads the prefix instead of computing it; without tier credits
// the same decision counts no cached token.
func TestCPUTierCredited(t *testing.T) {
	r, chosen, last := tierDecisions(t, func(*Params) {})
	first := chosen[0]
	if !slices.Contains(chosen[1:len(chosen)-1], first) {
		t.Fatalf("no filler went to %s (%v): X's prefix was never evicted there", first, chosen)
	}
	prefixBlocks := 2 * TraceBlockTokens / 16
	t.Logf("decisions %v; last: %+v", chosen, last)
	for _, s := range last[:len(last)-1] {
		switch {
		case s.dial == first && (s.gpu != 0 || s.cpu != prefixBlocks):
			t.Errorf("%s holds X's prefix in %d GPU and %d CPU blocks, want 0 and %d", s.dial, s.gpu, s.cpu, prefixBlocks)
		case s.dial != first && s.gpu+s.cpu != 0:
			t.Errorf("%s holds %d GPU and %d CPU blocks of X's prefix, never having served it", s.dial, s.gpu, s.cpu)
		}
	}
	if chosen[len(chosen)-1] != first {
		t.Errorf("X again went to %s, not to %s, which holds its prefix on CPU", chosen[len(chosen)-1], first)
	}
	prompt := 3 * TraceBlockTokens
	if uncached := last[len(last)-1].gpu; uncached >= prompt {
		t.Errorf("the decision counted %d of %d prompt tokens uncached: the CPU tier was not credited", uncached, prompt)
	}
	if r.CPUCachedTokens != int64(2*TraceBlockTokens) {
		t.Errorf("%d tokens loaded from CPU, want X's prefix, %d", r.CPUCachedTokens, 2*TraceBlockTokens)
	}

	_, _, gpuOnly := tierDecisions(t, func(p *Params) { p.Cost.CPUTierWeight, p.Cost.StorageTierWeight = -1, -1 })
	if uncached := gpuOnly[len(gpuOnly)-1].gpu; uncached != prompt {
		t.Errorf("GPU-only matching counted %d of %d prompt tokens uncached, want all", uncached, prompt)
	}
}
