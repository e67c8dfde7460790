package testwait

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	var polls atomic.Int32
	start := time.Now()
	For(t, 10*time.Second, "the third poll", func() bool { return polls.Add(1) == 3 })
	if polls.Load() != 3 {
		t.Fatalf("%d polls, want 3", polls.Load())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

// recorder is a testing.TB that records a Fatalf instead of ending the
// test, as the real one would with runtime.Goexit.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = format
	panic(r)
}

func TestForFailsAfterTheTimeout(t *testing.T) {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != r {
				t.Fatalf("recovered %v, want the recorder's Fatalf", p)
			}
		}()
		For(r, 20*time.Millisecond, "never", func() bool { return false })
	}()
	if !strings.Contains(r.msg, "timed out") {
		t.Fatalf("message %q", r.msg)
	}
}
