package tokenizer

import (
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/testutil/gcscan"
)

func TestWordCache(t *testing.T) {
	c := newWordCache()
	for _, e := range []struct {
		word string
		ids  []int32
	}{{"hello", []int32{1, 2}}, {"wörld", []int32{3}}, {"", nil}, {"x", []int32{4, 5, 6}}} {
		c.put(e.word, e.ids)
		got, ok := c.get(e.word)
		if !ok || !slices.Equal(got, e.ids) {
			t.Errorf("get(%q) = %v, %v; want %v", e.word, got, ok, e.ids)
		}
		if cap(got) != len(got) {
			t.Errorf("get(%q): cap %d, len %d: an append would write into the cache", e.word, cap(got), len(got))
		}
	}
	if _, ok := c.get("hell"); ok {
		t.Error("a prefix of a cached word hits")
	}
	long := strings.Repeat("a", maxCachedWordLen+1)
	c.put(long, []int32{7})
	if _, ok := c.get(long); ok {
		t.Error("a word over maxCachedWordLen was cached")
	}
	// The ids handed out are the cache's own copy, not the caller's.
	ids := []int32{8, 9}
	c.put("copy", ids)
	ids[0] = 0
	if got, _ := c.get("copy"); !slices.Equal(got, []int32{8, 9}) {
		t.Errorf("put kept the caller's slice: %v", got)
	}
}

// TestWordCacheFullShard: a full shard starts over, and ids handed out
// before stay as they were.
func TestWordCacheFullShard(t *testing.T) {
	c := newWordCache()
	var kept [][]int32
	for i := range cacheShards * cacheShardEntries * 2 {
		w := fmt.Sprintf("w%d", i)
		c.put(w, []int32{int32(i), int32(i + 1)})
		if i%1000 == 0 {
			ids, ok := c.get(w)
			if !ok {
				t.Fatalf("%s missing right after put", w)
			}
			kept = append(kept, ids)
		}
	}
	for i := range c.shards {
		if n := c.shards[i].n; n > cacheShardEntries || len(c.shards[i].slots) > 2*cacheShardEntries {
			t.Fatalf("shard %d holds %d entries in %d slots, bound %d", i, n, len(c.shards[i].slots), cacheShardEntries)
		}
	}
	for j, ids := range kept {
		if i := int32(j * 1000); !slices.Equal(ids, []int32{i, i + 1}) {
			t.Fatalf("ids of w%d changed to %v", i, ids)
		}
	}
}

// TestWordCacheConcurrent runs puts and gets of overlapping words from
// several goroutines; with -race it checks that readers and the shards'
// restarts do not race.
func TestWordCacheConcurrent(t *testing.T) {
	c := newWordCache()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20000 {
				w := fmt.Sprintf("w%d", (i*7+g)%30000)
				if ids, ok := c.get(w); ok && (len(ids) != 1 || ids[0] != int32(len(w))) {
					t.Errorf("get(%q) = %v", w, ids)
					return
				}
				c.put(w, []int32{int32(len(w))})
			}
		})
	}
	wg.Wait()
}

// TestWordCacheHoldsNoPointers: a shard's entries and slices hold no Go
// pointers, so the garbage collector does not scan them (see wordCache).
func TestWordCacheHoldsNoPointers(t *testing.T) {
	sh := cacheShard{}
	sh.reset()
	if p := gcscan.PointerIn(reflect.TypeOf(sh.slots).Elem(), reflect.TypeOf(sh.words).Elem(), reflect.TypeOf(sh.ids).Elem()); p != "" {
		t.Errorf("the word cache holds a pointer: %s", p)
	}
}

// BenchmarkWordCacheGC is the CPU one garbage collection costs with a
// word cache whose shards are each three quarters full (48Ki words of
// 8 bytes or so, three ids each), beside the benchmark's own small heap.
func BenchmarkWordCacheGC(b *testing.B) {
	c := newWordCache()
	for i := 0; ; i++ {
		c.put(fmt.Sprintf("word%dx", i), []int32{1, 2, 3})
		if i%cacheShards == 0 && minShard(c) >= cacheShardEntries*3/4 {
			break
		}
	}
	gcscan.ReportCycleCost(b)
	runtime.KeepAlive(c)
}

func minShard(c *wordCache) int {
	n := cacheShardEntries
	for i := range c.shards {
		n = min(n, c.shards[i].n)
	}
	return n
}
