package vllmsim

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// TestSubConnSpuriousWakeup: a wake-up that finds the queue empty must not
// leave the writer and the queue sharing one array, or the writer clears
// (and sends) slots that enqueue has filled since: a message is lost.
func TestSubConnSpuriousWakeup(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	s := &subConn{c: a, notify: make(chan struct{}, 1), done: make(chan struct{}), q: make([][]byte, 0, 8)}
	// The subscriber reads one message per request, so the writer stays
	// blocked in a write meanwhile (net.Pipe has no buffer).
	reads, lines := make(chan struct{}), make(chan string)
	go func() {
		defer close(lines)
		r := bufio.NewReader(b)
		for range reads {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			lines <- l
		}
	}()
	defer close(reads)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		s.writeLoop()
	}()
	defer func() {
		close(s.done)
		a.Close()
		<-wrote
	}()
	until := func(what string, cond func() bool) {
		t.Helper()
		testwait.For(t, 10*time.Second, what, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return cond()
		})
	}
	next := func(want string) {
		t.Helper()
		reads <- struct{}{}
		select {
		case l := <-lines:
			if l != want {
				t.Fatalf("subscriber got %q, want %q", l, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("subscriber got nothing, want %q", want)
		}
	}

	s.enqueue([]byte("m0\n"), 100)
	next("m0\n")
	// The wake-up that finds nothing: the queue takes the spare array.
	s.notify <- struct{}{}
	until("the queue to take the spare array", func() bool { return cap(s.q) > 0 })
	s.enqueue([]byte("m1\n"), 100)
	until("the writer to take m1", func() bool { return len(s.q) == 0 })
	s.enqueue([]byte("m2\n"), 100) // while the writer still holds m1's batch
	next("m1\n")
	s.enqueue([]byte("m3\n"), 100)
	next("m2\n")
	next("m3\n")
}
