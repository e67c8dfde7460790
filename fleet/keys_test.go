package fleet

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sighting"
	"github.com/llmgw/caddy-llmgw/kvindex"
)

// blockKeys are the prompt's block keys hashed whole: what keyKeep must
// give.
func blockKeys(tokens []uint64, blockSize int, lora, salt string) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	keys, err := kvindex.RequestKeys(make([]uint64, 0, len(tokens)/blockSize), tokens, kvindex.KeySpec{BlockSize: blockSize, LoRAName: lora, CacheSalt: salt})
	if err != nil {
		return nil
	}
	return keys
}

// TestKeyKeep: after a prompt was kept, every later prompt gets exactly
// the keys hashing it whole gives, whatever it shares with the kept one
// (nothing, a few blocks, all but a partial tail, more than it) and under
// another block size, adapter or salt; the blocks it shares are copied,
// not hashed.
func TestKeyKeep(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	base := make([]uint64, 16*100+7)
	for i := range base {
		base[i] = rng.Uint64N(150000)
	}
	with := func(n int, tail ...uint64) []uint64 { return append(slices.Clone(base[:n]), tail...) }
	changed := func(at int) []uint64 { p := slices.Clone(base); p[at]++; return p }
	for _, c := range []struct {
		name       string
		tokens     []uint64
		bs         int
		lora, salt string
		reused     int // blocks the kept prompt gives
	}{
		{"the same prompt", base, 16, "", "", 100},
		{"a new last token", changed(len(base) - 1), 16, "", "", 100},
		{"a change in block 60", changed(60*16 + 5), 16, "", "", 60},
		{"a change at block 60's first token", changed(60 * 16), 16, "", "", 60},
		{"a change in block 1", changed(16 + 3), 16, "", "", 0},
		{"a change in block 0", changed(3), 16, "", "", 0},
		{"longer", with(len(base), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17), 16, "", "", 100},
		{"shorter, on a block edge", with(50 * 16), 16, "", "", 50},
		{"shorter, mid-block", with(50*16 + 9), 16, "", "", 50},
		{"another block size", base, 32, "", "", 0},
		{"an adapter", base, 16, "lora-a", "", 0},
		{"a salt", base, 16, "", "s", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newKeyKeep()
			_ = k.blockKeys(base, 16, "", "")
			_ = k.blockKeys(base, 16, "", "") // kept from its second sighting
			if r := reusedBlocks(k, c.tokens, c.bs, c.lora, c.salt); r != c.reused {
				t.Fatalf("%d blocks come from the kept prompt, want %d", r, c.reused)
			}
			got := k.blockKeys(c.tokens, c.bs, c.lora, c.salt)
			want := blockKeys(c.tokens, c.bs, c.lora, c.salt)
			if !slices.Equal(got, want) || len(got) != cap(got) {
				t.Fatalf("keys differ from the prompt's hashed whole (%d vs %d, cap %d)", len(got), len(want), cap(got))
			}
		})
	}
}

// reusedBlocks is how many of tokens' blocks the entry kept under their
// first block's key would give, as blockKeys counts them (one shared
// block is hashed, not copied).
func reusedBlocks(k *keyKeep, tokens []uint64, bs int, lora, salt string) int {
	first := blockKeys(tokens[:bs], bs, lora, salt)
	e, ok := k.kept.Get(first[0])
	if !ok || e.blockSize != bs || e.lora != lora || e.salt != salt {
		return 0
	}
	if n := min(sharedIDs(e.tokens, tokens)/bs, len(e.keys)); n > 1 {
		return n
	}
	return 0
}

// TestKeyKeepCopiesPooledIDs: ids that are not stable (a pooled buffer
// the caller reuses) are copied when kept, so a later prompt compares with
// what was hashed, not with what the buffer holds by then.
func TestKeyKeepCopiesPooledIDs(t *testing.T) {
	buf := make([]uint64, 16*64)
	for i := range buf {
		buf[i] = uint64(i)
	}
	k := newKeyKeep()
	_ = k.blockKeys(buf, 16, "", "")
	_ = k.blockKeys(buf, 16, "", "")
	if k.kept.Len() != 1 {
		t.Fatalf("%d prompts kept after two sightings, want 1", k.kept.Len())
	}
	want := blockKeys(buf, 16, "", "")
	for i := 16; i < len(buf); i++ {
		buf[i] += 1000 // the caller reuses its buffer for another prompt
	}
	other := blockKeys(buf, 16, "", "")
	if got := k.blockKeys(buf, 16, "", ""); !slices.Equal(got, other) {
		t.Fatal("a prompt was given keys of the ids a reused buffer held before")
	}
	restored := slices.Clone(buf)
	for i := 16; i < len(restored); i++ {
		restored[i] -= 1000
	}
	if got := k.blockKeys(restored, 16, "", ""); !slices.Equal(got, want) {
		t.Fatal("the first prompt's keys differ when it comes again")
	}
}

// TestKeyKeepSecondSighting: a prompt is kept only once a prompt with
// its first block was offered before: prompts sharing no prefix copy
// nothing.
func TestKeyKeepSecondSighting(t *testing.T) {
	k := newKeyKeep()
	for i := range 20 {
		p := make([]uint64, 16*64)
		for j := range p {
			p[j] = uint64(i*100000 + j)
		}
		_ = k.blockKeys(p, 16, "", "")
	}
	if k.kept.Len() != 0 || k.kept.Bytes() != 0 {
		t.Fatalf("distinct prompts offered once: %d kept (%d bytes)", k.kept.Len(), k.kept.Bytes())
	}
}

// TestKeyKeepBudget: what is kept stays within the budget.
func TestKeyKeepBudget(t *testing.T) {
	const budget = 256 << 10
	k := newKeyKeep()
	k.kept = sighting.NewKeep[*keptKeys](budget, maxSeenPrompts)
	rng := rand.New(rand.NewPCG(2, 2))
	for i := range 50 {
		p := make([]uint64, 16*(32+rng.IntN(400)))
		for j := range p {
			p[j] = rng.Uint64N(150000)
		}
		want := blockKeys(p, 16, "", fmt.Sprint(i%3))
		for range 2 {
			if got := k.blockKeys(p, 16, "", fmt.Sprint(i%3)); !slices.Equal(got, want) {
				t.Fatalf("prompt %d: keys differ", i)
			}
		}
		if k.kept.Bytes() > budget {
			t.Fatalf("after %d prompts %d bytes kept, budget %d", i+1, k.kept.Bytes(), budget)
		}
	}
}

// BenchmarkKeyKeep8k: an 8k-token prompt's keys when a kept prompt shares
// all but its last block, against hashing it whole.
func BenchmarkKeyKeep8k(b *testing.B) {
	p := make([]uint64, 8192)
	for i := range p {
		p[i] = uint64(i * 7919 % 150000)
	}
	b.Run("whole", func(b *testing.B) {
		for b.Loop() {
			_ = blockKeys(p, 16, "", "")
		}
	})
	b.Run("kept", func(b *testing.B) {
		k := newKeyKeep()
		_ = k.blockKeys(p, 16, "", "")
		_ = k.blockKeys(p, 16, "", "")
		q := slices.Clone(p)
		i := 0
		for b.Loop() {
			i++
			q[len(q)-1] = uint64(i)
			_ = k.blockKeys(q, 16, "", "")
		}
	})
}
