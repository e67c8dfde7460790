package fleet

import (
	"context"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/routing"
)

// groupStored is a 12-element BlockStored (vLLM #40984) of the whole
// 16-token blocks of toks in KV-cache group g of spec kind kind ("" for
// none).
func groupStored(toks []uint64, g int, kind string) []any {
	n := len(toks) / 16
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = 0xab000000 + uint64(i)
	}
	var k any
	if kind != "" {
		k = kind
	}
	return []any{"BlockStored", hashes, nil, toks[:16*n], 16, nil, "GPU", nil, nil, g, k, nil}
}

// feedEvents applies one batch of events to dial's mirror.
func feedEvents(t *testing.T, f *Fleet, dial string, events ...any) {
	t.Helper()
	b, err := msgpack.Marshal([]any{1.0, events, 0})
	if err != nil {
		t.Fatal(err)
	}
	feed := kvindex.NewFeed(f.index.Mirror(dial), nil, kvindex.FeedConfig{})
	t.Cleanup(feed.Close)
	feed.Connected()
	feed.Message(nil, 0, b)
}

// TestRouteHybridFullAttentionGroup: routing credits a hybrid engine with
// the prefix its full-attention group holds (group 1 here), not the longer
// one its sliding-window group 0 holds, so a plain engine holding more of
// the prompt in its only group wins the request.
func TestRouteHybridFullAttentionGroup(t *testing.T) {
	f, _, dials := specFleet(t, 2)
	for _, d := range dials {
		scrapeSleep(f, d, 0)
	}
	hybrid, plain := dials[0], dials[1]
	toks := tokens(5, 1024, 0)
	feedEvents(t, f, hybrid, groupStored(toks[:1024], 0, "sliding_window"), groupStored(toks[:64], 1, "full_attention"))
	feedEvents(t, f, plain, groupStored(toks[:512], 0, ""))
	if m := f.index.Mirror(hybrid); m.BlockSize() != 16 || m.Stats().Blocks != 68 {
		t.Fatalf("hybrid mirror: block size %d, %d blocks; want 16, 68", m.BlockSize(), m.Stats().Blocks)
	}
	req := chatRequest(t, nil, "a prompt both engines have seen part of")
	d := f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: DefaultSettings(), Tokens: toks, Explain: true})
	if d.Index < 0 || dials[d.Index] != plain || d.Outcome != routing.Hit {
		t.Fatalf("picked %d, outcome %v, matches %v; want a hit on %s", d.Index, d.Outcome, d.match.precise, plain)
	}
	if got := d.match.precise; got[hybrid] != 4 || got[plain] != 32 {
		t.Fatalf("precise matches %v, want %s: 4 (its full-attention group), %s: 32", got, hybrid, plain)
	}
}

// TestReportRemoteBlocks: /llm/engines's kv report counts events of blocks
// in storage remote to the engine (locality REMOTE) as unapplied, and the
// engine is not credited with them.
func TestReportRemoteBlocks(t *testing.T) {
	f, _, dials := specFleet(t, 1)
	toks := tokens(6, 64, 0)
	ev := map[string]any{"type": "BlockStored", "block_hashes": []uint64{1, 2, 3, 4}, "parent_block_hash": nil,
		"token_ids": toks[:64], "block_size": 16, "lora_id": nil, "medium": "STORAGE", "lora_name": nil,
		"locality": "REMOTE", "ownership": "shared"}
	feedEvents(t, f, dials[0], ev)
	var kv KVReport
	kv.fillMirror(f.index.Mirror(dials[0]).Stats())
	if kv.Unapplied["remote"] != 1 || kv.TierBlocks["storage"] != 0 || kv.Blocks != 0 {
		t.Fatalf("unapplied %v, tier blocks %v, blocks %d", kv.Unapplied, kv.TierBlocks, kv.Blocks)
	}
}
