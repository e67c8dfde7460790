package caddymodule

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime/pprof"
	"sort"
	"strings"
	"testing"
	"time"
)

// The soak's goroutine accounting: what holds the goroutines a gateway
// has after the load that it did not have before it. A goroutine is named
// by its entry function (the last frame of its stack, what `go` started);
// the gauges before and after the load carry these counts, and the
// difference is what the load left behind.

// keepAliveEntries are the goroutines of an open HTTP connection: the
// client transport's read and write loops of each idle keep-alive
// connection to an engine (Caddy keeps them for 2 minutes, /tokenize's
// client for 90 s), and a server connection's serve loop. They are the
// only goroutines a healthy gateway may hold more of after the load.
var keepAliveEntries = map[string]bool{
	"net/http.(*persistConn).readLoop":  true,
	"net/http.(*persistConn).writeLoop": true,
	"net/http.(*conn).serve":            true,
}

// soakHeldSlack is how many goroutines other than keep-alive connections'
// the gateway may hold after the load beyond its count before it: a
// goroutine per subscription being reconnected, a timer about to fire.
const soakHeldSlack = 5

// goroutineEntries counts goroutines by entry function in a goroutine
// dump in the debug=2 format (runtime.Stack's).
func goroutineEntries(dump io.Reader) (map[string]int, error) {
	counts := map[string]int{}
	sc := bufio.NewScanner(dump)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last string // the last function of the goroutine being read
	flush := func() {
		if last != "" {
			counts[last]++
		}
		last = ""
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "goroutine "):
			flush()
		case line == "" || strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "created by "):
			// file:line, the creator, or the gap between goroutines
		case strings.HasPrefix(line, "...additional frames elided..."):
			last = "(deep stack)"
		default:
			if i := strings.LastIndexByte(line, '('); i > 0 {
				line = line[:i]
			}
			last = line
		}
	}
	flush()
	return counts, sc.Err()
}

// soakHeld reads the gateway's goroutines by entry function: from the
// Caddy process's admin API, or from this process.
func soakHeld(external bool) (map[string]int, error) {
	if !external {
		var b bytes.Buffer
		if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
			return nil, err
		}
		return goroutineEntries(&b)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	res, err := c.Get("http://" + adminAddr + "/debug/pprof/goroutine?debug=2")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("goroutine dump: %s", res.Status)
	}
	return goroutineEntries(io.LimitReader(res.Body, 64<<20))
}

// heldDiff is after − before per entry function, non-zero ones only,
// largest first, and the total of those that are not keep-alive
// connections.
func heldDiff(before, after map[string]int) (lines []string, others int) {
	type d struct {
		fn string
		n  int
	}
	var ds []d
	for fn, n := range after {
		if n != before[fn] {
			ds = append(ds, d{fn, n - before[fn]})
		}
	}
	for fn, n := range before {
		if _, ok := after[fn]; !ok {
			ds = append(ds, d{fn, -n})
		}
	}
	sort.Slice(ds, func(i, j int) bool {
		if ds[i].n != ds[j].n {
			return ds[i].n > ds[j].n
		}
		return ds[i].fn < ds[j].fn
	})
	for _, x := range ds {
		lines = append(lines, fmt.Sprintf("%+d %s", x.n, x.fn))
		if !keepAliveEntries[x.fn] {
			others += x.n
		}
	}
	return lines, others
}

// parkedForTest blocks until its channel closes: a goroutine with a known
// entry function for TestGoroutineEntries.
func parkedForTest(ch chan struct{}) { <-ch }

func TestGoroutineEntries(t *testing.T) {
	ch := make(chan struct{})
	defer close(ch)
	const n = 3
	for range n {
		go parkedForTest(ch)
	}
	var got map[string]int
	eventually(t, 5*time.Second, "the parked goroutines in the dump", func() bool {
		var err error
		got, err = soakHeld(false)
		return err == nil && got["github.com/llmgw/caddy-llmgw/caddymodule.parkedForTest"] == n
	})
	lines, others := heldDiff(map[string]int{"gone": 2}, map[string]int{"net/http.(*conn).serve": 4, "x.leak": 1})
	want := []string{"+4 net/http.(*conn).serve", "+1 x.leak", "-2 gone"}
	if strings.Join(lines, "|") != strings.Join(want, "|") || others != -1 {
		t.Fatalf("heldDiff = %q, %d; want %q, -1", lines, others, want)
	}
}
