package caddymodule

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
)

// TestReliabilityGateFleetLockOrder: requests entering a pool's gate (the
// gate runs their try function, which reads the fleet, under its own lock)
// while other requests fetch the same gate (fleet.gate) do not deadlock.
// Regression: fleet.gate called Gate.SetConfig holding the fleet's lock,
// the reverse order; under concurrent load the gateway froze, config
// reloads included (they wait for the fleet's lock).
func TestReliabilityGateFleetLockOrder(t *testing.T) {
	f := newFleet(zap.NewNop())
	defer f.Destruct()
	cfg := admission.Config{QueueSize: 16, Aging: time.Second}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5000 {
				g := f.gate("default", cfg)
				w, err := g.Enter(admission.Normal, func() bool { return !f.isDrained("127.0.0.1:1") })
				if err != nil {
					t.Error(err)
					return
				}
				<-w.Ready()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("deadlock between the fleet's and the gate's locks")
	}
}
