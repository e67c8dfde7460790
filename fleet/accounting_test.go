package fleet

import (
	"testing"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

func TestEngineFree(t *testing.T) {
	lim := Limits{KV: 0.9}
	tests := []struct {
		name string
		l    upstreams.Load
		lim  Limits
		want int
	}{
		{"kv full", upstreams.Load{KVUsage: 0.95, MaxInflight: 8}, lim, 0},
		{"room", upstreams.Load{Running: 3, Waiting: 1, MaxInflight: 8}, lim, 4},
		{"dispatched counts", upstreams.Load{Running: 3, Dispatched: 2, MaxInflight: 8}, lim, 3},
		{"finished frees, off waiting first", upstreams.Load{Running: 8, Waiting: 2, Finished: 3, MaxInflight: 8}, lim, 1},
		{"handler limit when engine has none", upstreams.Load{Running: 2}, Limits{KV: 0.9, MaxInflight: 4}, 2},
		{"no limit: full while waiting", upstreams.Load{Running: 9, Waiting: 1}, lim, 0},
		{"no limit: room when nothing waits", upstreams.Load{Running: 9}, lim, 1},
		{"no limit: finished let the waiting in", upstreams.Load{Running: 9, Waiting: 1, Finished: 1}, lim, 1},
		{"local accounting off", upstreams.Load{Running: 3, Dispatched: 4, Finished: 3, MaxInflight: 8}, Limits{KV: 0.9, IgnoreDispatched: true}, 5},
		{"engine queue: room at max_inflight", upstreams.Load{Running: 8, MaxInflight: 8}, Limits{KV: 0.9, EngineQueue: 1}, 1},
		{"engine queue: full once it waits", upstreams.Load{Running: 8, Waiting: 1, MaxInflight: 8}, Limits{KV: 0.9, EngineQueue: 1}, 0},
		{"engine queue: dispatched fill it", upstreams.Load{Running: 8, Dispatched: 1, MaxInflight: 8}, Limits{KV: 0.9, EngineQueue: 1}, 0},
		{"engine queue: not past the KV limit", upstreams.Load{Running: 8, KVUsage: 0.95, MaxInflight: 8}, Limits{KV: 0.9, EngineQueue: 1}, 0},
		{"engine queue: none without a limit", upstreams.Load{Running: 9, Waiting: 1}, Limits{KV: 0.9, EngineQueue: 1}, 0},
		{"engine queue: negative is none", upstreams.Load{Running: 8, MaxInflight: 8}, Limits{KV: 0.9, EngineQueue: -1}, 0},
	}
	for _, tc := range tests {
		if got := engineFree(tc.l, tc.lim); got != tc.want {
			t.Errorf("%s: engineFree = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// manualFleet is a fleet running a config of the given engines whose
// gauges the test scrapes itself.
func manualFleet(t *testing.T, engines ...*EngineConfig) *Fleet {
	t.Helper()
	f := New(zap.NewNop(), Options{ManualScrape: true})
	t.Cleanup(f.Close)
	f.Start(f.NewGeneration(testConfig(engines...), zap.NewNop()))
	return f
}

func scrape(f *Fleet, dial string, g upstreams.Gauges) {
	f.Registry().Ensure(dial).StartScrape()(g)
}

// TestTryReserve: admission reserves on the engine with the most room,
// fails open on unknown engines unless fail-closed, skips drained ones,
// and refuses when every known engine is full.
func TestTryReserve(t *testing.T) {
	f := manualFleet(t, &EngineConfig{Dial: deadDials[0], MaxInflight: 4}, &EngineConfig{Dial: deadDials[1], MaxInflight: 4})
	two := deadDials[:2]
	// Unknown gauges: fail open, or refuse when fail-closed.
	if res, failOpen, ok := f.TryReserve(two, Limits{KV: 0.9}); !ok || !failOpen || res == nil {
		t.Fatalf("unknown engines: res=%v failOpen=%v ok=%v, want a fail-open reservation", res, failOpen, ok)
	} else {
		res.Done()
	}
	if _, _, ok := f.TryReserve(two, Limits{KV: 0.9, FailClosed: true}); ok || f.AnyKnown(two) {
		t.Fatal("fail-closed admitted on unknown engines")
	}
	scrape(f, deadDials[0], upstreams.Gauges{Running: 3})
	scrape(f, deadDials[1], upstreams.Gauges{Running: 1})
	res, failOpen, ok := f.TryReserve(two, Limits{KV: 0.9})
	if !ok || failOpen || res.Engine().Dial() != deadDials[1] {
		t.Fatalf("reserved on %v (failOpen %v, ok %v), want the roomier %s", res.Engine().Dial(), failOpen, ok, deadDials[1])
	}
	defer res.Done()
	f.SetDrained(deadDials[1], true)
	if r2, _, ok := f.TryReserve(two, Limits{KV: 0.9}); !ok || r2.Engine().Dial() != deadDials[0] {
		t.Fatal("a drained engine was reserved on")
	} else {
		r2.Done()
	}
	scrape(f, deadDials[0], upstreams.Gauges{Running: 4})
	if _, _, ok := f.TryReserve(two, Limits{KV: 0.9}); ok {
		t.Fatal("admitted with every undrained engine full")
	}
	if _, failOpen, ok := f.TryReserve(nil, Limits{KV: 0.9}); !ok || !failOpen {
		t.Fatal("an empty pool does not fail open")
	}
}

// TestDispatchAndFollow: the reservation moves to the engine the request is
// sent to and counts there as dispatched; without one, Dispatch makes one.
func TestDispatchAndFollow(t *testing.T) {
	f := manualFleet(t, &EngineConfig{Dial: deadDials[0]}, &EngineConfig{Dial: deadDials[1]})
	res := f.Registry().Ensure(deadDials[0]).Reserve()
	if got := f.Proxied(deadDials[1]).Dispatch(res); got != res || res.Engine().Dial() != deadDials[1] {
		t.Fatal("Dispatch did not move the admission reservation")
	}
	if l := f.Registry().Ensure(deadDials[0]).Load(); l.Inflight != 0 {
		t.Fatalf("the engine left still counts %d in flight", l.Inflight)
	}
	f.Proxied(deadDials[0]).Follow(res)
	if res.Engine().Dial() != deadDials[0] {
		t.Fatal("Follow did not move the reservation to the proxy's upstream")
	}
	f.Proxied("").Follow(res)
	res.Done()
	own := f.Proxied(deadDials[1]).Dispatch(nil)
	if l := f.Registry().Ensure(deadDials[1]).Load(); l.Inflight != 1 || l.Dispatched != 1 {
		t.Fatalf("a policy-made reservation counts inflight %d dispatched %d, want 1 and 1", l.Inflight, l.Dispatched)
	}
	own.Done()
}
