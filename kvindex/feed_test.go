package kvindex

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/golden"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// engineSim produces the events a vLLM engine with PYTHONHASHSEED seed and
// the given block size would publish, with real sha256_cbor hashes.
type engineSim struct {
	t      testing.TB
	h      *Hasher
	bs     int
	seq    uint64
	medium any
}

func newEngineSim(t testing.TB, seed string, bs int) *engineSim {
	h, err := NewHasher(seed, bs)
	if err != nil {
		t.Fatal(err)
	}
	return &engineSim{t: t, h: h, bs: bs, medium: "GPU"}
}

func (e *engineSim) hashes(tokens []uint64, extra [][]any) []uint64 {
	ds, err := e.h.BlockHashes(nil, tokens, extra)
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.Uint64()
	}
	return out
}

// stored is the 10-element positional BlockStored announcing blocks
// [from, to) of a prompt.
func (e *engineSim) stored(tokens []uint64, extra [][]any, from, to int) arr {
	hs := e.hashes(tokens, extra)
	var parent any
	if from > 0 {
		parent = hs[from-1]
	}
	hashes, toks, ek := arr{}, arr{}, arr{}
	for i := from; i < to; i++ {
		hashes = append(hashes, hs[i])
		var x any
		if i < len(extra) && extra[i] != nil {
			x = arr(extra[i])
		}
		ek = append(ek, x)
	}
	for _, tk := range tokens[from*e.bs : to*e.bs] {
		toks = append(toks, tk)
	}
	return arr{"BlockStored", hashes, parent, toks, e.bs, nil, e.medium, nil, ek, 0}
}

func removed(hashes ...uint64) arr {
	hs := arr{}
	for _, h := range hashes {
		hs = append(hs, h)
	}
	return arr{"BlockRemoved", hs, "GPU", 0}
}

func batch(events ...any) []byte { return payload(arr{1.0, arr(events), 0}) }

// msg feeds one batch with the next sequence number.
func (e *engineSim) msg(f *Feed, events ...any) {
	f.Message([]byte("kv"), e.seq, batch(events...))
	e.seq++
}

func prompt(n int, salt uint64) []uint64 {
	out := make([]uint64, n)
	x := salt*0x9e3779b97f4a7c15 + 1
	for i := range out {
		x = x*6364136223846793005 + 1442695040888963407
		out[i] = (x >> 33) % 151000
	}
	return out
}

func newTestFeed(t testing.TB, ix *Index, id string, replay Replayer) (*Mirror, *Feed) {
	m, err := ix.AddEngine(id, MirrorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	f := NewFeed(m, replay, FeedConfig{})
	t.Cleanup(f.Close)
	f.Connected()
	return m, f
}

func matchOf(t testing.TB, ix *Index, q Query) map[string]int {
	t.Helper()
	ms, err := ix.Match(q)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, m := range ms {
		out[m.Engine] = m.Blocks
	}
	return out
}

func wantMatch(t testing.TB, ix *Index, q Query, want map[string]int) {
	t.Helper()
	got := matchOf(t, ix, q)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("match = %v, want %v", got, want)
	}
}

func TestFeedInOrderStoreRemoveClear(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 16)
	p := prompt(100, 1) // 6 full blocks, 4-token tail
	hs := e.hashes(p, nil)
	e.msg(f, e.stored(p, nil, 0, 4))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 4})
	e.msg(f, e.stored(p, nil, 4, 6))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 6})
	// A prompt sharing 3 blocks then diverging.
	q := append(append([]uint64{}, p[:48]...), prompt(50, 2)...)
	wantMatch(t, ix, Query{Tokens: q}, map[string]int{"e1": 3})
	// A hole stops the count even though later blocks are held.
	e.msg(f, removed(hs[2]))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 2})
	if st := m.Stats(); st.Blocks != 5 || st.Stored != 2 || st.Removed != 1 || st.LastSeq != 2 || st.BlockSize != 16 {
		t.Fatalf("stats %+v", st)
	}
	e.msg(f, arr{"AllBlocksCleared"}, e.stored(p, nil, 0, 1))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 1})
	st := m.Stats()
	if st.Blocks != 1 || st.Resyncs["cleared"] != 1 || st.Resyncs["subscribe"] != 1 || st.LastResyncReason != "cleared" {
		t.Fatalf("stats after clear %+v", st)
	}
}

func TestFeedRefcounts(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 4)
	p := prompt(8, 3)
	hs := e.hashes(p, nil)
	e.msg(f, e.stored(p, nil, 0, 2), e.stored(p, nil, 0, 1)) // block 0 stored twice
	e.msg(f, removed(hs[0]))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 2})
	e.msg(f, removed(hs[0]))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
	e.msg(f, removed(hs[0])) // more removals than stores
	if st := m.Stats(); st.Blocks != 1 || st.RemovedUnknown != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// replayLog serves buffered messages like vLLM's replay endpoint.
type replayLog struct {
	msgs  map[uint64][]byte
	calls int
	// failAfter, when >= 0, stops the replay with an error after that
	// many messages.
	failAfter int
}

func (r *replayLog) replay(ctx context.Context, start uint64, fn func(uint64, []byte) error) error {
	r.calls++
	n := 0
	for s := start; ; s++ {
		p, ok := r.msgs[s]
		if !ok {
			return nil // end of buffer
		}
		if r.failAfter >= 0 && n == r.failAfter {
			return errors.New("replay socket closed")
		}
		if err := fn(s, p); err != nil {
			return err
		}
		n++
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

func TestFeedGapReplay(t *testing.T) {
	for _, c := range []struct {
		name      string
		failAfter int
		nilReplay bool
		wantReset bool
	}{
		{"replay fills the gap", -1, false, false},
		{"replay fails at once", 0, false, true},
		{"replay partial", 1, false, true},
		{"no replay endpoint", -1, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ix := NewIndex(IndexConfig{})
			e := newEngineSim(t, "0", 4)
			p := prompt(40, 4)
			log := &replayLog{msgs: map[uint64][]byte{}, failAfter: c.failAfter}
			var rp Replayer = log.replay
			if c.nilReplay {
				rp = nil
			}
			m, f := newTestFeed(t, ix, "e1", rp)
			f.Message(nil, 10, batch(e.stored(p, nil, 0, 2)))
			// Messages 11 and 12 are lost on the PUB socket but buffered.
			log.msgs[11] = batch(e.stored(p, nil, 2, 4))
			log.msgs[12] = batch(e.stored(p, nil, 4, 6))
			log.msgs[13] = batch(e.stored(p, nil, 6, 8))
			f.Message(nil, 13, log.msgs[13])
			st := m.Stats()
			if got := st.Resyncs["gap"] == 1; got != c.wantReset {
				t.Fatalf("gap resync %v, want %v (stats %+v)", got, c.wantReset, st)
			}
			if c.wantReset {
				// Blocks 6-7 lost their parents with the reset.
				wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
				if st.Unchainable != 2 {
					t.Fatalf("unchainable %d, want 2", st.Unchainable)
				}
				if !c.nilReplay && (st.GapsFilled != 0 || st.LastReplayError == "") {
					t.Fatalf("failed replay not reported: %+v", st)
				}
			} else {
				wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 8})
				if log.calls != 1 || st.LastSeq != 13 || st.GapsFilled != 1 || st.Replayed != 2 {
					t.Fatalf("calls %d, stats %+v", log.calls, st)
				}
			}
			// The next in-order message applies normally.
			f.Message(nil, 14, batch(e.stored(p, nil, 0, 1)))
			if st := m.Stats(); st.LastSeq != 14 || st.Resyncs["gap"] != map[bool]uint64{true: 1, false: 0}[c.wantReset] {
				t.Fatalf("after gap: %+v", st)
			}
		})
	}
}

func TestFeedReplayDeadline(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, err := ix.AddEngine("e1", MirrorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var sawDeadline bool
	f := NewFeed(m, func(ctx context.Context, start uint64, fn func(uint64, []byte) error) error {
		_, sawDeadline = ctx.Deadline()
		<-ctx.Done() // an endpoint that never answers
		return ctx.Err()
	}, FeedConfig{ReplayTimeout: 50 * time.Millisecond})
	defer f.Close()
	f.Connected()
	e := newEngineSim(t, "0", 4)
	f.Message(nil, 0, batch(e.stored(prompt(8, 1), nil, 0, 2)))
	f.Message(nil, 5, batch(arr{"AllBlocksCleared"}))
	if !sawDeadline || m.Stats().Resyncs["gap"] != 1 {
		t.Fatalf("deadline %v, stats %+v", sawDeadline, m.Stats())
	}
}

func TestFeedRestartAndDecodeError(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 4)
	p := prompt(16, 5)
	f.Message(nil, 7, batch(e.stored(p, nil, 0, 4)))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 4})
	// The engine restarted: numbering begins again at 0.
	f.Message(nil, 0, batch(e.stored(p, nil, 0, 1)))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 1})
	if st := m.Stats(); st.Resyncs["restart"] != 1 || st.LastSeq != 0 {
		t.Fatalf("stats %+v", st)
	}
	// An undecodable message could have held a removal: reset.
	f.Message(nil, 1, []byte{0x93, 0xc1})
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
	st := m.Stats()
	if st.DecodeErrors != 1 || st.Resyncs["decode"] != 1 || st.LastDecodeError == "" || st.LastSeq != 1 {
		t.Fatalf("stats %+v", st)
	}
	f.Message(nil, 2, batch(e.stored(p, nil, 0, 2)))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 2})
}

func TestFeedConnectDisconnect(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 4)
	p := prompt(16, 6)
	f.Message(nil, 3, batch(e.stored(p, nil, 0, 4)))
	f.Disconnected(errors.New("connection reset"))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
	st := m.Stats()
	if st.Connected || m.Connected() || st.LastError != "connection reset" || st.Resyncs["disconnect"] != 1 {
		t.Fatalf("stats %+v, Connected() %v", st, m.Connected())
	}
	f.Connected()
	if !m.Connected() {
		t.Fatal("Connected() false after the Feed's Connected")
	}
	// The first message after Connected is taken as is, whatever its seq.
	f.Message(nil, 2, batch(e.stored(p, nil, 0, 4)))
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 4})
	if st := m.Stats(); !st.Connected || st.Resyncs["restart"] != 0 || st.Resyncs["subscribe"] != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMirrorSkipsWhatItCannotChain(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 4)
	p := prompt(16, 7)
	// Parent never seen (stored before we subscribed).
	e.msg(f, e.stored(p, nil, 2, 4))
	// Shape mismatch: 2 hashes, 3 tokens per block announced.
	bad := e.stored(p, nil, 0, 2)
	bad[4] = 3
	e.msg(f, bad)
	// CPU offload tier: raw digest, no tokens, block size 0, of a block
	// the mirror never saw: counted, not guessed.
	cpu := arr{"BlockStored", arr{[]byte("0123456789abcdef0123456789abcdef")}, nil, arr{}, 0, nil, "CPU", nil}
	e.msg(f, cpu)
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
	st := m.Stats()
	if st.Unchainable != 2 || st.Malformed != 1 || st.TierUnknown != 1 || st.OtherTier != 0 || st.Blocks != 0 {
		t.Fatalf("stats %+v", st)
	}
	// A CPU-tier removal of a block also on GPU leaves the GPU copy.
	e.msg(f, e.stored(p, nil, 0, 1))
	hs := e.hashes(p, nil)
	e.msg(f, arr{"BlockRemoved", arr{hs[0]}, "cpu", 0})
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 1})
}

func TestMatchExtraKeysSeparate(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	_, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 4)
	p := prompt(16, 8)
	extra := RequestExtraKeys("sql-adapter", "tenant-a", 4)
	e.msg(f, e.stored(p, extra, 0, 4))
	wantMatch(t, ix, Query{Tokens: p, LoRAName: "sql-adapter", CacheSalt: "tenant-a"}, map[string]int{"e1": 4})
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{})
	wantMatch(t, ix, Query{Tokens: p, LoRAName: "sql-adapter", CacheSalt: "tenant-b"}, map[string]int{})
	wantMatch(t, ix, Query{Tokens: p, LoRAName: "sql-adapter"}, map[string]int{})
	wantMatch(t, ix, Query{Tokens: p, Group: 1, LoRAName: "sql-adapter", CacheSalt: "tenant-a"}, map[string]int{})
	// Pre-extra_keys events (8 elements) still separate LoRA adapters.
	old := arr{"BlockStored", arr{1, 2}, nil, arr{}, 4, 3, "GPU", "old-lora"}
	for _, tk := range p[:8] {
		old[3] = append(old[3].(arr), tk)
	}
	e.msg(f, old)
	wantMatch(t, ix, Query{Tokens: p, LoRAName: "old-lora"}, map[string]int{"e1": 2})
}

func TestMatchManyEnginesAndBlockSizes(t *testing.T) {
	ix := NewIndex(IndexConfig{MaxEngines: 130})
	p := prompt(64, 9)
	want := map[string]int{}
	for i := 0; i < 130; i++ {
		id := fmt.Sprintf("10.0.0.%d:8000", i)
		bs := 4
		if i%3 == 0 {
			bs = 8
		}
		_, f := newTestFeed(t, ix, id, nil)
		e := newEngineSim(t, "0", bs)
		n := i % (64/bs + 1)
		if n > 0 {
			e.msg(f, e.stored(p, nil, 0, n))
			want[id] = n
		}
	}
	if _, err := ix.AddEngine("one too many", MirrorConfig{}); !errors.Is(err, ErrIndexFull) {
		t.Fatalf("AddEngine on a full index: %v", err)
	}
	if _, err := ix.AddEngine("10.0.0.1:8000", MirrorConfig{}); !errors.Is(err, ErrEngineExists) {
		t.Fatalf("AddEngine twice: %v", err)
	}
	ms, err := ix.Match(Query{Tokens: p})
	if err != nil {
		t.Fatal(err)
	}
	wantMatch(t, ix, Query{Tokens: p}, want)
	for i := 1; i < len(ms); i++ {
		if ms[i].Tokens > ms[i-1].Tokens {
			t.Fatalf("not sorted by tokens: %+v before %+v", ms[i-1], ms[i])
		}
	}
	for _, m := range ms {
		if m.Tokens != m.Blocks*m.BlockSize {
			t.Fatalf("tokens: %+v", m)
		}
	}
	// Removing an engine withdraws its claims and frees its slot.
	removedMirror := ix.Mirror("10.0.0.5:8000")
	if !ix.RemoveEngine("10.0.0.5:8000") || ix.RemoveEngine("10.0.0.5:8000") {
		t.Fatal("RemoveEngine")
	}
	delete(want, "10.0.0.5:8000")
	wantMatch(t, ix, Query{Tokens: p}, want)
	m5, f5 := newTestFeed(t, ix, "new", nil) // takes the freed slot
	e := newEngineSim(t, "0", 4)
	e.msg(f5, e.stored(p, nil, 0, 2))
	want["new"] = 2
	wantMatch(t, ix, Query{Tokens: p}, want)
	// The removed engine's feed, still running, must not disturb the
	// slot's new owner.
	old := newEngineSim(t, "0", 4)
	stale := NewFeed(removedMirror, nil, FeedConfig{})
	stale.Connected()
	old.msg(stale, old.stored(p, nil, 0, 16))
	stale.Disconnected(nil)
	stale.Close()
	wantMatch(t, ix, Query{Tokens: p}, want)
	if m5.Stats().Blocks != 2 {
		t.Fatalf("new engine stats %+v", m5.Stats())
	}
	if got := len(ix.Stats()); got != 130 {
		t.Fatalf("%d stats, want 130", got)
	}
}

func TestMirrorCapacityEviction(t *testing.T) {
	ix := NewIndex(IndexConfig{MaxBlocksPerEngine: 6})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 2)
	a, b := prompt(8, 10), prompt(8, 11)
	e.msg(f, e.stored(a, nil, 0, 4))
	e.msg(f, e.stored(b, nil, 0, 4)) // 8 blocks > hard cap 6: a's first two go
	st := m.Stats()
	if st.Blocks != 6 || st.Evicted != 2 || st.Capacity != 6 {
		t.Fatalf("stats %+v", st)
	}
	ka, _ := Keys(nil, a, 2, 0, nil)
	kb, _ := Keys(nil, b, 2, 0, nil)
	wantKeys := func(keys []uint64, from int, want int) {
		t.Helper()
		got := ix.MatchKeys(2, 0, keys[from:])
		if (want == 0 && len(got) != 0) || (want > 0 && (len(got) != 1 || got[0].Blocks != want)) {
			t.Fatalf("MatchKeys from block %d = %+v, want %d", from, got, want)
		}
	}
	wantKeys(ka, 0, 0)
	wantKeys(ka, 2, 2) // a's blocks 2-3 are still held
	wantKeys(kb, 0, 4)
	m.SetCapacity(3) // num_gpu_blocks learnt later, below the hard cap
	if st := m.Stats(); st.Blocks != 3 || st.Evicted != 5 || st.Capacity != 3 {
		t.Fatalf("stats %+v", st)
	}
	wantKeys(ka, 2, 0)
	wantKeys(kb, 1, 3)
	checkConsistent(t, ix)
	m.SetCapacity(100) // above the hard cap: the cap wins
	if st := m.Stats(); st.Capacity != 6 {
		t.Fatalf("capacity %d, want 6", st.Capacity)
	}
	if blocks, capacity := m.Fill(); blocks != 3 || capacity != 6 {
		t.Fatalf("Fill() = %d, %d; want 3 blocks of 6", blocks, capacity)
	}
}

func TestVerifySeedAndBlockSize(t *testing.T) {
	p := prompt(32, 12)
	for _, c := range []struct {
		name     string
		cfg      VerifyConfig
		hashBS   int // block size the engine hashed with
		wantOK   bool
		contains string
	}{
		{"right seed", VerifyConfig{Sample: 1, Seed: "0"}, 16, true, ""},
		{"wrong seed", VerifyConfig{Sample: 1, Seed: "1"}, 16, false, `seed "1"`},
		{"configured block size differs", VerifyConfig{Sample: 1, Seed: "0", BlockSize: 32}, 16, false, "configured 32"},
		{"hashed at another block size", VerifyConfig{Sample: 1, Seed: "0"}, 8, false, "block size 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ix := NewIndex(IndexConfig{})
			m, err := ix.AddEngine("e1", MirrorConfig{Verify: c.cfg})
			if err != nil {
				t.Fatal(err)
			}
			f := NewFeed(m, nil, FeedConfig{})
			defer f.Close()
			f.Connected()
			e := newEngineSim(t, "0", 16)
			ev := e.stored(p, nil, 0, 2)
			if c.hashBS != 16 {
				// Hashes of 8-token blocks announced as 16-token blocks.
				e8 := newEngineSim(t, "0", c.hashBS)
				hs := e8.hashes(p, nil)
				ev[1] = arr{hs[0], hs[1]}
			}
			e.msg(f, ev)
			e.msg(f, e.stored(p, nil, 1, 2)) // not anchored at the root: not checked
			vs := m.Stats().Verify
			if !vs.Enabled || vs.Checked != 1 {
				t.Fatalf("verify stats %+v", vs)
			}
			if ok := vs.Verified == 1 && vs.Mismatched == 0; ok != c.wantOK {
				t.Fatalf("verified %v, want %v: %+v", ok, c.wantOK, vs)
			}
			if !strings.Contains(vs.LastMismatch, c.contains) {
				t.Fatalf("last mismatch %q does not mention %q", vs.LastMismatch, c.contains)
			}
			// The index does not depend on the engine's seed.
			wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 2})
		})
	}
}

func TestVerifySampling(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, _ := ix.AddEngine("e1", MirrorConfig{Verify: VerifyConfig{Sample: 3, Seed: "0"}})
	f := NewFeed(m, nil, FeedConfig{})
	defer f.Close()
	f.Connected()
	e := newEngineSim(t, "0", 4)
	for i := 0; i < 7; i++ {
		e.msg(f, e.stored(prompt(8, uint64(100+i)), nil, 0, 2))
	}
	if vs := m.Stats().Verify; vs.Checked != 3 || vs.Verified != 3 {
		t.Fatalf("verify stats %+v, want 3 of 7 checked", vs)
	}
	m.SetVerify(VerifyConfig{})
	e.msg(f, e.stored(prompt(8, 1), nil, 0, 2))
	if vs := m.Stats().Verify; vs.Enabled || vs.Checked != 0 {
		t.Fatalf("verify stats after disabling %+v", vs)
	}
}

func TestMirrorGoldenPayloads(t *testing.T) {
	g := golden.Load(t)
	ix := NewIndex(IndexConfig{})
	m, err := ix.AddEngine("e1", MirrorConfig{Verify: VerifyConfig{Sample: 1, Seed: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	f := NewFeed(m, nil, FeedConfig{})
	defer f.Close()
	f.Connected()
	tok := make([]uint64, 32)
	for i := range tok {
		tok[i] = uint64(i)
	}
	for i, p := range g.Payloads {
		f.Message(nil, uint64(i), p.Payload)
		if p.Name == "array_pr19737_stored" {
			wantMatch(t, ix, Query{Tokens: tok}, map[string]int{"e1": 2})
		}
		if p.Name == "map_lora_salt_extra_keys" {
			wantMatch(t, ix, Query{Tokens: tok, LoRAName: "sql-adapter", CacheSalt: "tenant-a"}, map[string]int{"e1": 2})
		}
	}
	st := m.Stats()
	// The CPU offload payload names, by its raw digest, block 0 of the
	// GPU store before it: the CPU tier holds it.
	if st.DecodeErrors != 0 || st.OtherTier != 0 || st.TierUnknown != 0 || st.TierBlocks[TierCPU] != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The seed-0 golden events verify; the v0.9 builtin-hash one is not
	// sha256_cbor and must not.
	if st.Verify.Verified < 3 || st.Verify.Mismatched != 1 {
		t.Fatalf("verify %+v", st.Verify)
	}
}

// checkConsistent verifies the index's claims are exactly its mirrors'
// blocks: every mirrored block's key carries its engine's bit, and every
// bit belongs to a mirrored block.
func checkConsistent(t testing.TB, ix *Index) {
	t.Helper()
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	for slot, m := range ix.slots {
		if m == nil {
			continue
		}
		keys := map[uint64]bool{}
		n := 0
		for _, g := range m.groups {
			if g == nil {
				continue
			}
			for _, e := range g.entries {
				keys[normKey(e.key)] = true
				if e.refs == 0 {
					t.Fatalf("engine %s: block with 0 refs", m.id)
				}
			}
			n += len(g.entries)
		}
		if n != m.blocks {
			t.Fatalf("engine %s: %d entries, blocks counter %d", m.id, n, m.blocks)
		}
		if n > m.capacityLocked() {
			t.Fatalf("engine %s: %d blocks over capacity %d", m.id, n, m.capacityLocked())
		}
		bit := uint64(1) << (slot % 64)
		claimed := 0
		ix.banks[slot/64].each(func(k, bits uint64) {
			if bits&bit == 0 {
				return
			}
			claimed++
			if !keys[k] {
				t.Fatalf("engine %s: index claims key %#x it does not hold", m.id, k)
			}
		})
		if claimed != len(keys) {
			t.Fatalf("engine %s: index claims %d keys, mirror holds %d", m.id, claimed, len(keys))
		}
	}
}

// FuzzFeed drives two engines' feeds with arbitrary payloads and
// sequence numbers and checks the index stays consistent with the mirrors.
func FuzzFeed(f *testing.F) {
	for _, p := range golden.Load(f).Payloads {
		f.Add(p.Payload, p.Payload, uint8(1), uint8(2))
	}
	e := newEngineSim(f, "0", 2)
	pr := prompt(16, 1)
	hs := e.hashes(pr, nil)
	f.Add(batch(e.stored(pr, nil, 0, 4)), batch(e.stored(pr, nil, 4, 8), removed(hs[1])), uint8(1), uint8(7))
	f.Add(batch(e.stored(pr, nil, 0, 8)), batch(arr{"AllBlocksCleared"}, e.stored(pr, nil, 0, 2)), uint8(0), uint8(1))
	// Offload tiers: token-less CPU copies by digest, self-describing
	// storage stores, removals.
	ds := e.digests(pr)
	f.Add(batch(e.stored(pr, nil, 0, 4), offloaded("CPU", ds[0], ds[1], ds[5])),
		batch(e.storedAt("STORAGE", pr, 4, 8), arr{"BlockRemoved", arr{ds[1]}, "CPU", 0}, removed(hs[0])), uint8(1), uint8(2))
	// Hybrid groups: a sliding-window group 0 beside a full-attention
	// group 1, evictions in either, a kind that changes.
	f.Add(batch(inGroup(e.stored(pr, nil, 0, 4), 0, "sliding_window"), inGroup(e.stored(pr, nil, 0, 2), 1, "full_attention")),
		batch(removedIn(1, hs[0]), removedIn(0, hs[1]), inGroup(e.stored(pr, nil, 0, 3), 0, "full_attention")), uint8(1), uint8(2))
	// Locality: REMOTE stores and removals beside LOCAL ones.
	f.Add(batch(asMap(e.stored(pr, nil, 0, 4), "locality", "REMOTE", "ownership", "x", "session_id", "s"),
		asMap(e.storedAt("STORAGE", pr, 0, 4), "locality", "LOCAL")),
		batch(asMap(e.stored(pr, nil, 0, 2), "locality", "LOCAL"),
			omap{"type", "BlockRemoved", "block_hashes", arr{hs[0]}, "medium", "GPU", "locality", "REMOTE"}), uint8(1), uint8(2))
	// Ranks: engine b follows rank 1 only.
	f.Add(payload(arr{1.0, arr{e.stored(pr, nil, 0, 4)}, 1}), payload(arr{1.0, arr{e.stored(pr, nil, 4, 8)}, 0}), uint8(1), uint8(2))
	for _, p := range vectorPayloads(f) {
		f.Add(p, p, uint8(1), uint8(2))
	}
	f.Fuzz(func(t *testing.T, p1, p2 []byte, s1, s2 uint8) {
		ix := NewIndex(IndexConfig{MaxBlocksPerEngine: 5})
		var feeds []*Feed
		for i, id := range []string{"a", "b"} {
			// b follows data-parallel rank 1 only.
			m, err := ix.AddEngine(id, MirrorConfig{Verify: VerifyConfig{Sample: 1, Seed: "0"}, Rank: i, HasRank: i == 1})
			if err != nil {
				t.Fatal(err)
			}
			fd := NewFeed(m, nil, FeedConfig{})
			defer fd.Close()
			fd.Connected()
			feeds = append(feeds, fd)
		}
		for i, step := range []struct {
			seq uint64
			p   []byte
		}{{0, p1}, {uint64(s1), p2}, {uint64(s2), p1}, {uint64(s2) + 1, p2}} {
			feeds[i%2].Message(nil, step.seq, step.p)
			feeds[(i+1)%2].Message(nil, uint64(i), step.p)
			checkConsistent(t, ix)
			checkTiers(t, ix)
		}
		if _, err := ix.Match(Query{Tokens: pr}); err != nil {
			t.Fatal(err)
		}
		keys, err := RequestKeys(nil, pr, KeySpec{BlockSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ix.MatchTiers(2, 0, keys) {
			if m.Total() > len(keys) {
				t.Fatalf("tier match %+v longer than the prompt's %d blocks", m, len(keys))
			}
		}
	})
}

func TestFeedGapBeyondMaxReplay(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, err := ix.AddEngine("e1", MirrorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	log := &replayLog{msgs: map[uint64][]byte{}, failAfter: -1}
	f := NewFeed(m, log.replay, FeedConfig{MaxReplay: 3})
	defer f.Close()
	f.Connected()
	e := newEngineSim(t, "0", 4)
	f.Message(nil, 0, batch(e.stored(prompt(8, 1), nil, 0, 2)))
	f.Message(nil, 5, batch(arr{"AllBlocksCleared"})) // 4 missing > 3
	st := m.Stats()
	if log.calls != 0 || st.Resyncs["gap"] != 1 || !strings.Contains(st.LastReplayError, "MaxReplay") {
		t.Fatalf("calls %d, stats %+v", log.calls, st)
	}
}

// TestFeedLastLag: the mirror reports how late the last batch was
// applied, from the batch's ts; a batch without one reports 0.
func TestFeedLastLag(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	m, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 16)
	p := prompt(32, 1)
	published := time.Now().Add(-1500 * time.Millisecond)
	f.Message([]byte("kv"), 0, payload(arr{float64(published.UnixNano()) / 1e9, arr{e.stored(p, nil, 0, 1)}, 0}))
	before := time.Since(published)
	if lag := m.Stats().LastLag; lag < 1500*time.Millisecond || lag > before+time.Second {
		t.Fatalf("LastLag %v, want about 1.5s (at most %v)", lag, before)
	}
	f.Message([]byte("kv"), 1, payload(arr{0.0, arr{e.stored(p, nil, 1, 2)}, 0}))
	if lag := m.Stats().LastLag; lag != 0 {
		t.Fatalf("LastLag %v after a batch without ts, want 0", lag)
	}
}
