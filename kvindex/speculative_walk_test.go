package kvindex

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
)

// refSpecWalk is the walk of the engines with predictions as it was
// before it shared a pass over the keys with the others: the reference
// predictions.walkLocked must agree with.
func refSpecWalk(p *predictions, ix *Index, pred []uint64, blockSize int, keys []uint64, out []EngineMatch) []EngineMatch {
	for b, a := range pred {
		if a == 0 {
			continue
		}
		t, pt := ix.banks[b], p.banks[b]
		var realLen [64]int
		held, merged := a, a
		j := 0
		for ; j < len(keys) && merged != 0; j++ {
			r := t.get(keys[j])
			m := r | pt.get(keys[j])
			for lost := held &^ r; lost != 0; lost &= lost - 1 {
				realLen[bits.TrailingZeros64(lost)] = j
			}
			held &= r
			out = emitPredicted(ix, b, merged&^m, j, &realLen, blockSize, out)
			merged &= m
		}
		for ; held != 0; held &= held - 1 {
			realLen[bits.TrailingZeros64(held)] = j
		}
		out = emitPredicted(ix, b, merged, j, &realLen, blockSize, out)
	}
	return out
}

// refMatch is matchLocked with the two walks apart, as it was.
func refMatch(ix *Index, keys []uint64) []EngineMatch {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	active, found := ix.activeLocked(specBS, 0, nil)
	if !found || len(keys) == 0 {
		return nil
	}
	var pred []uint64
	if ix.spec.any() {
		ix.spec.mu.RLock()
		defer ix.spec.mu.RUnlock()
		pred = ix.spec.split(active, nil)
	}
	out := ix.walkLocked(specBS, keys, active, nil)
	if pred != nil {
		out = refSpecWalk(ix.spec, ix, pred, specBS, keys, out)
	}
	sortMatches(out)
	return out
}

// TestSpecWalkMatchesTwoWalks: over two banks of engines holding and
// predicted to hold random runs (with gaps) of a prompt, Match says what
// the separate walks said, for prefixes of the prompt of every length.
func TestSpecWalkMatchesTwoWalks(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	clk := testclock.New(time.Unix(1000, 0))
	x := &specFixture{t: t, clk: clk, ix: NewIndex(IndexConfig{Now: clk.Now}), p: prompt(40*specBS, 7)}
	x.ix.SetPredictTTL(time.Hour)
	keys, err := RequestKeys(nil, x.p, KeySpec{BlockSize: specBS})
	if err != nil {
		t.Fatal(err)
	}
	for e := range 100 {
		id := fmt.Sprintf("e%d", e)
		if _, err := x.ix.AddEngine(id, MirrorConfig{}); err != nil {
			t.Fatal(err)
		}
		f := NewFeed(x.ix.Mirror(id), nil, FeedConfig{})
		f.Connected()
		for from := r.IntN(3); from < 40; from += 1 + r.IntN(12) {
			x.store(id, x.p, from, min(40, from+1+r.IntN(15)), uint64(e)<<32)
		}
		if r.IntN(3) > 0 {
			from := r.IntN(40)
			x.ix.Predict(id, specBS, 0, keys[from:from+r.IntN(40-from)+1])
		}
	}
	predicted := 0
	for n := 0; n <= len(keys); n++ {
		want := refMatch(x.ix, keys[:n])
		got, err := x.ix.Match(Query{Tokens: x.p[:n*specBS], Keys: keys[:n], KeysBlockSize: specBS})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		for _, m := range got {
			predicted += m.Predicted
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%d blocks: Match %+v\nseparate walks %+v", n, got, want)
		}
	}
	if predicted == 0 {
		t.Fatal("no match rested on predictions: the fixture tests nothing")
	}
}
