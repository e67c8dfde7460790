// Package goroutines says what holds a process's goroutines: it counts
// them by entry function (the last frame of a goroutine's stack, what `go`
// started) in a goroutine dump, and compares two such counts, so that a
// soak can name what its load left behind. The soak test (caddymodule)
// checks with it and the bench's soak report explains with it.
package goroutines

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"runtime/pprof"
	"sort"
	"strings"
)

// keepAlive are the entry functions of an open HTTP connection's
// goroutines: the client transport's read and write loops of each idle
// keep-alive connection (Caddy keeps those to the engines for 2 minutes,
// /tokenize's client for 90 s), and a server connection's serve loop.
var keepAlive = map[string]bool{
	"net/http.(*persistConn).readLoop":  true,
	"net/http.(*persistConn).writeLoop": true,
	"net/http.(*conn).serve":            true,
}

// KeepAlive reports whether fn is the entry function of an open HTTP
// connection's goroutine.
func KeepAlive(fn string) bool { return keepAlive[fn] }

// Entries counts goroutines by entry function in a goroutine dump in the
// debug=2 format (runtime.Stack's, /debug/pprof/goroutine?debug=2).
func Entries(dump io.Reader) (map[string]int, error) {
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

// Self is Entries for this process.
func Self() (map[string]int, error) {
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		return nil, err
	}
	return Entries(&b)
}

// Change is how many more goroutines (fewer, when negative) one entry
// function had after than before.
type Change struct {
	Fn string
	N  int
}

func (c Change) String() string { return fmt.Sprintf("%+d %s", c.N, c.Fn) }

// Diff returns after − before per entry function, the non-zero ones only,
// largest first, and their totals for open HTTP connections (KeepAlive)
// and for all others.
func Diff(before, after map[string]int) (changes []Change, conns, others int) {
	for fn, n := range after {
		if n != before[fn] {
			changes = append(changes, Change{fn, n - before[fn]})
		}
	}
	for fn, n := range before {
		if _, ok := after[fn]; !ok {
			changes = append(changes, Change{fn, -n})
		}
	}
	sort.Slice(changes, func(i, j int) bool {
		if changes[i].N != changes[j].N {
			return changes[i].N > changes[j].N
		}
		return changes[i].Fn < changes[j].Fn
	})
	for _, c := range changes {
		if KeepAlive(c.Fn) {
			conns += c.N
		} else {
			others += c.N
		}
	}
	return changes, conns, others
}
