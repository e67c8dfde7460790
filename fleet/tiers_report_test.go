package fleet

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/llmgw/caddy-llmgw/kvindex"
)

// TestReportTierBlocks: /llm/engines's kv report shows an engine's offload tiers as
// its events fill them: a CPU copy of a block it stored on GPU, announced
// the OffloadingConnector's way (raw digest, no tokens), and one of a
// block it never announced, counted as unapplied.
func TestReportTierBlocks(t *testing.T) {
	f, _, dials := specFleet(t, 1)
	dial := dials[0]
	storeBlocks(t, f, dial, tokens(4, 64, 0)) // hashes 0xfeed0000...
	digest := func(h uint64) []byte {
		b := make([]byte, 32)
		for i := range 8 {
			b[31-i] = byte(h >> (8 * i))
		}
		return b
	}
	ev := []any{"BlockStored", []any{digest(0xfeed0000), digest(0xfeed0001), digest(0xbad)}, nil, []any{}, 0, nil, "CPU", nil}
	b, err := msgpack.Marshal([]any{2.0, []any{ev}, 0})
	if err != nil {
		t.Fatal(err)
	}
	feed := kvindex.NewFeed(f.index.Mirror(dial), nil, kvindex.FeedConfig{})
	t.Cleanup(feed.Close)
	feed.Message(nil, 1, b)
	var kv KVReport
	kv.fillMirror(f.index.Mirror(dial).Stats())
	if kv.TierBlocks["cpu"] != 2 || kv.TierBlocks["storage"] != 0 || kv.Unapplied["tier_unknown_block"] != 1 {
		t.Fatalf("tier blocks %v, unapplied %v", kv.TierBlocks, kv.Unapplied)
	}
}
