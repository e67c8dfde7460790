package fleet

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/admission"
)

// TestGateFleetLockOrder: requests entering a pool's gate (the gate runs
// their try function, which reads the fleet, under its own lock) while
// other requests fetch the same gate (Fleet.Gate) do not deadlock.
// Regression: Gate called Gate.SetConfig holding the fleet's lock, the
// reverse order; under concurrent load the gateway froze, config reloads
// included (they wait for the fleet's lock).
func TestGateFleetLockOrder(t *testing.T) {
	f := New(zap.NewNop(), Options{})
	defer f.Close()
	cfg := admission.Config{QueueSize: 16, Aging: time.Second}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5000 {
				g := f.Gate("default", cfg)
				w, err := g.Enter(admission.Normal, func() bool { return !f.IsDrained("127.0.0.1:1") })
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

// TestPoolDials: a pool's engines are what its policy learned under the
// running generation, else the engines configured for it, else every
// engine known.
func TestPoolDials(t *testing.T) {
	f := New(zap.NewNop(), Options{})
	defer f.Close()
	g := f.NewGeneration(testConfig(
		&EngineConfig{Dial: deadDials[0]},
		&EngineConfig{Dial: deadDials[1], Pool: "other"},
	), zap.NewNop())
	f.Start(g)
	f.Registry().Ensure(deadDials[2]) // discovered
	for _, tc := range []struct {
		pool string
		want []string
	}{
		{"default", deadDials[:1]},
		{"other", deadDials[1:2]},
		{"nobody", nil}, // every engine: checked below
	} {
		got := f.PoolDials(tc.pool)
		if tc.want == nil {
			if len(got) != 3 {
				t.Errorf("pool %q: %v, want all three engines", tc.pool, got)
			}
			continue
		}
		if len(got) != len(tc.want) || got[0] != tc.want[0] {
			t.Errorf("pool %q: %v, want %v", tc.pool, got, tc.want)
		}
	}
	f.LearnPool(g, "default", deadDials[1:])
	if got := f.PoolDials("default"); len(got) != 2 || got[0] != deadDials[1] {
		t.Errorf("learned pool: %v, want %v", got, deadDials[1:])
	}
}

func TestDrain(t *testing.T) {
	f := New(zap.NewNop(), Options{})
	defer f.Close()
	f.SetDrained(deadDials[0], true)
	if !f.IsDrained(deadDials[0]) || f.IsDrained(deadDials[1]) {
		t.Fatal("drain marks the wrong engines")
	}
	f.SetDrained(deadDials[0], false)
	if f.IsDrained(deadDials[0]) {
		t.Fatal("undrain left the engine drained")
	}
}
