package fleet

import (
	"context"
	"testing"

	"github.com/llmgw/caddy-llmgw/routing"
)

// TestRouteCreditsOffloadedTiers: a prompt an engine announced only in its
// CPU tier (a self-describing offload event, with token ids) reaches the
// routing cost through the fleet: /llm/explain shows the blocks, the
// request goes there as a hit, admission's placement makes that engine
// its holder, and with the tier credited nothing it is a miss without a
// holder.
func TestRouteCreditsOffloadedTiers(t *testing.T) {
	f, _, dials := specFleet(t, 3)
	for _, d := range dials {
		scrapeSleep(f, d, 0) // awake, idle, block size 16
	}
	req := chatRequest(t, nil, "a prompt kept in one engine's CPU tier")
	toks := tokens(7, 1024, 0)
	holder := dials[1]
	storeBlocksIn(t, f, holder, toks[:512], "CPU")

	route := func(s Settings) *Pick {
		return f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s, Tokens: toks, Explain: true})
	}
	d := route(DefaultSettings())
	if dials[d.Index] != holder || d.Outcome != routing.Hit {
		t.Fatalf("picked %s (%v), want a hit on the CPU holder %s: %+v", dials[d.Index], d.Outcome, holder, d.Scored)
	}
	for _, sc := range d.Scored {
		want := 0
		if sc.Dial == holder {
			want = 32
		}
		if sc.MatchedBlocks != 0 || sc.CPUBlocks != want || sc.StorageBlocks != 0 {
			t.Fatalf("%s: %d GPU, %d CPU, %d storage blocks; want 0, %d, 0", sc.Dial, sc.MatchedBlocks, sc.CPUBlocks, sc.StorageBlocks, want)
		}
	}

	// Admission's placement weighs the tier as routing does: the CPU
	// holder is the request's holder, its 32 blocks credited at 0.75.
	q := Query{Request: req, Dials: dials, Settings: DefaultSettings(), Tokens: toks}
	if p := f.Place(context.Background(), q); p == nil || p.Holder != holder || p.Cached != 32*16*3/4 {
		t.Fatalf("placement: %+v, want holder %s with %d tokens cached", p, holder, 32*16*3/4)
	}

	off := DefaultSettings()
	off.Cost.CPUTierWeight = -1
	if d := route(off); d.Outcome == routing.Hit {
		t.Fatalf("a hit with the CPU tier credited nothing: %+v", d.Decision)
	}
	q.Settings = off
	if p := f.Place(context.Background(), q); p == nil || p.Holder != "" {
		t.Fatalf("placement with the CPU tier credited nothing: %+v, want no holder", p)
	}
}
