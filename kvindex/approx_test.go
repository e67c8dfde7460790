package kvindex

import (
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/gcscan"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
)

func approxOf(tr *ApproxTree, text string) (string, int) {
	ms, total := tr.Match(text)
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "%s=%d ", m.Engine, m.Bytes)
	}
	return strings.TrimSpace(b.String()), total
}

func TestApproxMatchLengths(t *testing.T) {
	clk := testclock.New(time.Unix(1000, 0))
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 4, Now: clk.Now})
	tr.Insert("aaaabbbbccccdd", "e1") // chunks aaaa bbbb cccc dd
	tr.Insert("aaaabbbbxxxx", "e2")
	for _, c := range []struct {
		text  string
		want  string
		total int
	}{
		{"aaaabbbbccccdd", "e1=14 e2=8", 14},
		{"aaaabbbbccccddee", "e1=12 e2=8", 16}, // "dd" was a partial chunk
		{"aaaabbbbxxxxyyyy", "e2=12 e1=8", 16},
		{"aaaabbb", "e1=4 e2=4", 7},
		{"aaaa", "e1=4 e2=4", 4},
		{"zzzzaaaa", "", 8},
		{"", "", 0},
	} {
		got, total := approxOf(tr, c.text)
		if got != c.want || total != c.total {
			t.Errorf("Match(%q) = %q, %d; want %q, %d", c.text, got, total, c.want, c.total)
		}
	}
}

func TestApproxTTL(t *testing.T) {
	clk := testclock.New(time.Unix(1000, 0))
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 4, TTL: time.Minute, Now: clk.Now})
	tr.Insert("aaaabbbbcccc", "e1")
	clk.Advance(40 * time.Second)
	tr.Insert("aaaabbbb", "e2")
	tr.Insert("aaaa", "e1") // refreshes only e1's first chunk
	clk.Advance(30 * time.Second)
	// e1's chunks 2-3 are 70s old: expired. e2 and e1's first chunk are not.
	if got, _ := approxOf(tr, "aaaabbbbcccc"); got != "e2=8 e1=4" {
		t.Fatalf("after 70s: %q", got)
	}
	clk.Advance(time.Minute)
	if got, _ := approxOf(tr, "aaaabbbbcccc"); got != "" {
		t.Fatalf("after 130s: %q", got)
	}
	tr.Insert("qqqq", "e3") // inserting sweeps expired chunks
	if n := tr.Len(); n != 1 {
		t.Fatalf("%d chunks left, want 1", n)
	}
}

// TestApproxMatchNearEpoch: an engine that has no record on a chunk stops
// matching there, whatever the clock reads (a cutoff before 0 must not
// count a missing record as fresh).
func TestApproxMatchNearEpoch(t *testing.T) {
	clk := testclock.New(time.Unix(0, 0))
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 4, TTL: time.Minute, Now: clk.Now})
	tr.Insert("aaaabbbb", "e1")
	tr.Insert("aaaa", "e2")
	if got, _ := approxOf(tr, "aaaabbbb"); got != "e1=8 e2=4" {
		t.Fatalf("Match = %q, want %q", got, "e1=8 e2=4")
	}
}

func TestApproxSizeCapEvictsLeavesFirst(t *testing.T) {
	clk := testclock.New(time.Unix(1000, 0))
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 4, MaxNodes: 5, Now: clk.Now})
	tr.Insert("aaaabbbbcccc", "e1")
	clk.Advance(time.Second)
	tr.Insert("xxxxyyyy", "e2") // 5 chunks: at the cap
	if tr.Len() != 5 {
		t.Fatalf("len %d", tr.Len())
	}
	clk.Advance(time.Second)
	tr.Insert("zzzz", "e3") // one over: e1's leaf goes, not its root
	if tr.Len() != 5 {
		t.Fatalf("len %d, want 5", tr.Len())
	}
	if got, _ := approxOf(tr, "aaaabbbbcccc"); got != "e1=8" {
		t.Fatalf("after eviction: %q", got)
	}
}

func TestApproxRemoveEngineAndMaxChunks(t *testing.T) {
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 4, MaxChunks: 2})
	tr.Insert("aaaabbbbcccc", "e1")
	tr.Insert("aaaabbbbcccc", "e2")
	if got, total := approxOf(tr, "aaaabbbbcccc"); got != "e1=8 e2=8" || total != 12 {
		t.Fatalf("max chunks: %q %d", got, total)
	}
	tr.RemoveEngine("e1")
	tr.RemoveEngine("unknown")
	if got, _ := approxOf(tr, "aaaabbbbcccc"); got != "e2=8" {
		t.Fatalf("after remove: %q", got)
	}
	tr.RemoveEngine("e2")
	if tr.Len() != 0 {
		t.Fatalf("len %d after removing every engine", tr.Len())
	}
	tr.Insert("aaaa", "e3") // reuses a freed engine index
	if got, _ := approxOf(tr, "aaaabbbb"); got != "e3=4" {
		t.Fatalf("after reuse: %q", got)
	}
}

func TestApproxConcurrent(t *testing.T) {
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 8, MaxNodes: 500})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				text := fmt.Sprintf("system prompt %d / user %d / %s", i%7, i, strings.Repeat("x", i%50))
				tr.Insert(text, fmt.Sprintf("e%d", (g+i)%5))
				tr.Match(text)
				if i%100 == 99 {
					tr.RemoveEngine(fmt.Sprintf("e%d", i%5))
				}
			}
		}()
	}
	wg.Wait()
	if n := tr.Len(); n > 500 {
		t.Fatalf("%d chunks over the cap", n)
	}
}

// approxTexts returns n prompts of about size bytes sharing a 2 KiB system
// prompt, like chat traffic.
func approxTexts(n, size int) []string {
	system := strings.Repeat("You are a helpful assistant. ", 80)[:2048]
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		b.WriteString(system)
		for b.Len() < size {
			fmt.Fprintf(&b, "user %d says something about topic %d. ", i, b.Len())
		}
		out[i] = b.String()
	}
	return out
}

// BenchmarkApproxInsert8k records 8 KiB prompts (128 chunks) into a tree
// kept at its 64Ki-chunk cap.
func BenchmarkApproxInsert8k(b *testing.B) {
	texts := approxTexts(1024, 8192)
	tr := NewApproxTree(ApproxConfig{MaxNodes: 64 << 10})
	for i, s := range texts {
		tr.Insert(s, fmt.Sprintf("e%d", i%16))
	}
	b.SetBytes(8192)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tr.Insert(texts[i%len(texts)], fmt.Sprintf("e%d", i%16))
		i++
	}
}

// BenchmarkApproxMatch8k matches 8 KiB prompts whose first 2 KiB sixteen
// engines served, and the rest one engine.
func BenchmarkApproxMatch8k(b *testing.B) {
	texts := approxTexts(1024, 8192)
	tr := NewApproxTree(ApproxConfig{MaxNodes: 1 << 20})
	for i, s := range texts {
		tr.Insert(s, fmt.Sprintf("e%d", i%16))
	}
	b.SetBytes(8192)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if ms, _ := tr.Match(texts[i%len(texts)]); len(ms) != 16 {
			b.Fatalf("%d matches", len(ms))
		}
		i++
	}
}

// TestApproxInsertSkipsFreshPrefix: Insert leaves alone the leading chunks
// an engine was recorded through within the refresh interval (a second
// here), records new tails, and records the whole path again once the
// interval has passed, so the TTL still runs from the latest refresh.
func TestApproxInsertSkipsFreshPrefix(t *testing.T) {
	clk := testclock.New(time.Unix(1000, 0))
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 4, TTL: time.Minute, Now: clk.Now})
	tr.Insert("aaaabbbbcccc", "e1")
	clk.Advance(500 * time.Millisecond)
	tr.Insert("aaaabbbbdddd", "e1") // within the interval: only dddd is new
	tr.Insert("aaaabbbbcccc", "e2") // another engine's record is its own
	if got, _ := approxOf(tr, "aaaabbbbdddd"); got != "e1=12 e2=8" {
		t.Fatalf("new tail behind a fresh prefix: %q", got)
	}
	clk.Advance(30 * time.Second)
	tr.Insert("aaaabbbbcccc", "e1")                    // past the interval: the path is recorded again
	clk.Advance(30*time.Second + 200*time.Millisecond) // 60.2 s after dddd and e2, 30.2 s after the refresh
	if got, _ := approxOf(tr, "aaaabbbbcccc"); got != "e1=12" {
		t.Fatalf("after the refresh: %q (want e1's path kept, e2's expired)", got)
	}
	if got, _ := approxOf(tr, "aaaabbbbdddd"); got != "e1=8" {
		t.Fatalf("dddd was not refreshed: %q", got)
	}
}

// BenchmarkApproxInsertSharedPrefix8k inserts 8 KiB prompts that share
// their first 8000 bytes and differ after, all from one engine: the
// gateway's common case (one system prompt, many questions).
func BenchmarkApproxInsertSharedPrefix8k(b *testing.B) {
	prefix := approxTexts(1, 8000)[0]
	tr := NewApproxTree(ApproxConfig{MaxNodes: 64 << 10})
	b.SetBytes(8192)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tr.Insert(fmt.Sprintf("%s%0192d", prefix, i), "e1")
		i++
	}
}

// TestApproxInsertStepsLetReadersIn: a long Insert records lockStep chunks
// at a time and releases the lock in between, so that matches on the
// approximate tier do not wait for a whole new prompt; a match meanwhile
// finds nothing of the half-recorded prompt (its end goes first). An
// engine removed during a pause is not recorded any further.
func TestApproxInsertStepsLetReadersIn(t *testing.T) {
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 4})
	text := func(tag string) string {
		var b strings.Builder
		for i := range 3*lockStep + 5 {
			fmt.Fprintf(&b, "%s%03d", tag, i%1000)
		}
		return b.String()
	}
	t1, t2 := text("a"), text("b")
	pauses := 0
	tr.betweenSteps = func() {
		pauses++
		if !tr.mu.TryRLock() {
			t.Fatal("the tree's lock is held between an Insert's steps")
		}
		tr.mu.RUnlock()
		if got, _ := approxOf(tr, t1); got != "" {
			t.Errorf("after %d steps, a match of the half-recorded prompt: %q", pauses, got)
		}
	}
	tr.Insert(t1, "e1")
	if pauses != 3 {
		t.Fatalf("%d pauses in an Insert of %d chunks, want 3", pauses, 3*lockStep+5)
	}
	if got, _ := approxOf(tr, t1); got != fmt.Sprintf("e1=%d", len(t1)) {
		t.Fatalf("after the Insert: %q", got)
	}
	n := tr.Len()
	tr.betweenSteps = func() { tr.RemoveEngine("e2") }
	tr.Insert(t2, "e2")
	if got, _ := approxOf(tr, t2); got != "" || tr.Len() != n {
		t.Fatalf("e2 removed during its Insert: match %q, %d nodes (want none, %d)", got, tr.Len(), n)
	}
}

// TestApproxTreeHoldsNoPointers: the tree's nodes, records and map hold no
// Go pointers, so the garbage collector does not scan them (see
// ApproxTree). A field that adds one — a string, a slice, a pointer —
// fails here.
func TestApproxTreeHoldsNoPointers(t *testing.T) {
	tr := NewApproxTree(ApproxConfig{})
	nodes, slab, seen := reflect.TypeOf(tr.nodes), reflect.TypeOf(tr.slab), reflect.TypeOf(tr.seen)
	if p := gcscan.PointerIn(nodes.Key(), nodes.Elem(), slab.Elem(), seen.Elem()); p != "" {
		t.Errorf("the tree holds a pointer: %s", p)
	}
}

// TestApproxReusesFreedSlots: nodes and records that eviction or
// RemoveEngine frees are used again, so the tree's slices stay within its
// bound however many prompts go through it, and an emptied tree lets go of
// them.
func TestApproxReusesFreedSlots(t *testing.T) {
	const maxNodes, chunks = 64, 16
	tr := NewApproxTree(ApproxConfig{ChunkBytes: 4, MaxNodes: maxNodes})
	for i := range 1000 {
		text := fmt.Sprintf("%04d", i) + strings.Repeat("abcd", chunks-1)
		tr.Insert(text, fmt.Sprintf("e%d", i%3))
		tr.Insert(text, fmt.Sprintf("e%d", (i+1)%3)) // a second record on every node
		if got, _ := approxOf(tr, text); !strings.HasSuffix(got, "=64") {
			t.Fatalf("prompt %d: %q", i, got)
		}
	}
	// At most the bound, plus one prompt's nodes before expiry, plus the
	// sentinel (or the unused record 0).
	if n := len(tr.slab); n > maxNodes+chunks+1 {
		t.Errorf("%d nodes in the slab, bound %d", n, maxNodes+chunks+1)
	}
	if n := len(tr.seen); n > 2*(maxNodes+chunks)+1 {
		t.Errorf("%d records, bound %d", n, 2*(maxNodes+chunks)+1)
	}
	for e := range 3 {
		tr.RemoveEngine(fmt.Sprintf("e%d", e))
	}
	if tr.Len() != 0 || len(tr.slab) != 1 || len(tr.seen) != 1 {
		t.Errorf("emptied tree: %d chunks, %d nodes, %d records", tr.Len(), len(tr.slab), len(tr.seen))
	}
}

// BenchmarkApproxTreeGC is the CPU one garbage collection costs with a
// tree at its default bound of 1<<18 chunks (16 engines; 8 KiB prompts
// behind a shared 2 KiB), beside the
// benchmark's own small heap. It is a cost every collection of a running
// gateway pays, however little the tree changes.
func BenchmarkApproxTreeGC(b *testing.B) {
	tr := NewApproxTree(ApproxConfig{})
	for i, s := range approxTexts(1<<18/96+64, 8192) {
		tr.Insert(s, fmt.Sprintf("e%d", i%16))
	}
	if n := tr.Len(); n < 1<<18 {
		b.Fatalf("%d chunks, want the bound", n)
	}
	gcscan.ReportCycleCost(b)
	runtime.KeepAlive(tr)
}
