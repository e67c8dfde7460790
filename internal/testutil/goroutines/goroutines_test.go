package goroutines

import (
	"fmt"
	"testing"
	"time"
)

// parkedForTest blocks until its channel closes: a goroutine with a known
// entry function.
func parkedForTest(ch chan struct{}) { <-ch }

func TestSelfCountsByEntryFunction(t *testing.T) {
	ch := make(chan struct{})
	defer close(ch)
	const n = 3
	for range n {
		go parkedForTest(ch)
	}
	const fn = "github.com/llmgw/caddy-llmgw/internal/testutil/goroutines.parkedForTest"
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := Self()
		if err == nil && got[fn] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d goroutines counted (err %v), want %d", fn, got[fn], err, n)
		}
		time.Sleep(10 * time.Millisecond) // the goroutines start on their own schedule
	}
}

func TestDiff(t *testing.T) {
	changes, conns, others := Diff(map[string]int{"gone": 2, "same": 1}, map[string]int{"net/http.(*conn).serve": 4, "x.leak": 1, "same": 1})
	want := "[+4 net/http.(*conn).serve +1 x.leak -2 gone]"
	if got := fmt.Sprint(changes); got != want || conns != 4 || others != -1 {
		t.Fatalf("Diff = %s, conns %d, others %d; want %s, 4, -1", got, conns, others, want)
	}
}
