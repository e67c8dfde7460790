package ctxsleep

import (
	"context"
	"testing"
	"time"
)

// TestSleep: the whole wait on a live context, none on an ended one, and a
// non-positive wait that only reports whether the context is live.
func TestSleep(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want bool
	}{
		{"waits", context.Background(), time.Millisecond, true},
		{"zero, live", context.Background(), 0, true},
		{"negative, live", context.Background(), -time.Second, true},
		{"ended", ended, time.Hour, false},
		{"zero, ended", ended, 0, false},
	} {
		start := time.Now()
		if got := Sleep(tc.ctx, tc.d); got != tc.want {
			t.Errorf("%s: Sleep = %v, want %v", tc.name, got, tc.want)
		}
		if tc.want && time.Since(start) < tc.d {
			t.Errorf("%s: returned after %v, before %v", tc.name, time.Since(start), tc.d)
		}
	}
}
