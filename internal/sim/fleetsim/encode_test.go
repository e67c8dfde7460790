package fleetsim

import (
	"slices"
	"testing"

	"github.com/llmgw/caddy-llmgw/kvindex"
)

// TestBatchEncoder checks the simulation's event batches against
// the gateway's own decoder.
func TestBatchEncoder(t *testing.T) {
	evs := []desEvent{
		{stored: true, hashes: []uint64{11, 12}, tokens: []uint64{1, 2, 3, 4}},
		{stored: true, hashes: []uint64{13}, parent: 12, hasPar: true, tokens: []uint64{5, 6}},
		{hashes: []uint64{11}},
	}
	b, err := kvindex.DecodeBatch(newBatchEncoder().encode(1.5, evs, 2))
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 1.5 || len(b.Events) != 3 || b.Unknown != 0 {
		t.Fatalf("batch %+v", b)
	}
	for i, want := range evs {
		got := b.Events[i]
		kind := kvindex.EventBlockRemoved
		if want.stored {
			kind = kvindex.EventBlockStored
		}
		if got.Kind != kind || !slices.Equal(got.BlockHashes, want.hashes) || got.HasParent != want.hasPar || got.Parent != want.parent {
			t.Errorf("event %d: %+v, want %+v", i, got, want)
		}
		if want.stored && (!slices.Equal(got.TokenIDs, want.tokens) || got.BlockSize != 2 || got.Medium != "GPU") {
			t.Errorf("event %d: tokens %v block size %d medium %q", i, got.TokenIDs, got.BlockSize, got.Medium)
		}
	}
}
