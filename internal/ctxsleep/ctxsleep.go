// Package ctxsleep is a sleep that ends early when its context does, for the
// goroutines that wait between retries, polls and paced requests.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits d, or less if ctx ends first; it reports whether it waited
// the whole of d. A d of zero or less does not wait: it reports whether ctx
// is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
