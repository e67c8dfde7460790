package fleet

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// deadDials are loopback addresses nothing listens on.
var deadDials = []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}

// testConfig is a config with the given engines, polled rarely.
func testConfig(engines ...*EngineConfig) Config {
	return Config{
		PollInterval: time.Hour, PollTimeout: time.Second, StaleAfter: 3, IdleTTL: time.Hour,
		TokenizeTimeout: time.Second, TokenizeConcurrency: 8, TokenizeCacheSize: 64,
		Engines: engines,
	}
}

func dialsConfig(dials ...string) Config {
	var es []*EngineConfig
	for _, d := range dials {
		es = append(es, &EngineConfig{Dial: d})
	}
	return testConfig(es...)
}

func registryDials(f *Fleet) []string {
	var out []string
	for _, e := range f.registry.Engines() {
		if e.Config().Static {
			out = append(out, e.Dial())
		}
	}
	slices.Sort(out)
	return out
}

// TestGenerations: only the running config generation's policies teach
// admission a pool's upstreams (during a reload, requests still in the old
// routes must not re-teach the old list), and a reload that fails after the
// llm app started hands the fleet back to the generation that keeps
// serving, while a shutdown restores nothing.
func TestGenerations(t *testing.T) {
	f := New(zap.NewNop(), Options{})
	defer f.Close()
	old := f.NewGeneration(dialsConfig(deadDials[0]), zap.NewNop())
	next := f.NewGeneration(dialsConfig(deadDials[1]), zap.NewNop())

	f.Start(old)
	f.LearnPool(old, "default", []string{deadDials[0]})
	if got := f.PoolDials("default"); !slices.Equal(got, []string{deadDials[0]}) {
		t.Fatalf("running generation's pool = %v", got)
	}

	// Reload: the new generation starts; an old route's request arrives late.
	f.Start(next)
	if next.prev != old {
		t.Fatalf("the new generation replaced %p, want the old generation", next.prev)
	}
	f.LearnPool(old, "default", []string{deadDials[0]})
	if got := f.PoolDials("default"); !slices.Equal(got, []string{deadDials[1]}) {
		t.Fatalf("after reload the pool is %v: an old route's request re-taught it (want the new config's %v)", got, deadDials[1:2])
	}
	f.LearnPool(next, "default", []string{deadDials[1], deadDials[2]})
	if got := f.PoolDials("default"); len(got) != 2 {
		t.Fatalf("the running generation's policy did not teach the pool: %v", got)
	}

	// The reload fails after the llm app started: Caddy stops the new
	// generation and the old one keeps serving.
	f.Stop(next)
	if got := registryDials(f); !slices.Equal(got, []string{deadDials[0]}) {
		t.Fatalf("after a failed reload the fleet follows %v, want the old config's %v", got, deadDials[:1])
	}
	f.LearnPool(next, "default", []string{deadDials[2]})
	f.LearnPool(old, "default", []string{deadDials[0]})
	if got := f.PoolDials("default"); !slices.Equal(got, []string{deadDials[0]}) {
		t.Fatalf("after a failed reload the pool is %v, want %v", got, deadDials[:1])
	}
	f.Cleanup(next)

	// A successful reload, then shutdown: nothing is restored.
	third := f.NewGeneration(dialsConfig(deadDials[2]), zap.NewNop())
	f.Start(third)
	f.Stop(old)
	f.Cleanup(old)
	f.Stop(third)
	if got := registryDials(f); !slices.Equal(got, []string{deadDials[2]}) {
		t.Fatalf("shutdown re-applied a cleaned-up generation: fleet follows %v", got)
	}
	f.LearnPool(third, "default", []string{deadDials[0]})
	if got := f.PoolDials("default"); slices.Equal(got, []string{deadDials[0]}) {
		t.Fatalf("a stopped generation taught the pool: %v", got)
	}
}

// TestGenerationLogger: the fleet logs through the running generation's
// logger, and through the previous one's again after a failed reload.
func TestGenerationLogger(t *testing.T) {
	f := New(zap.NewNop(), Options{})
	defer f.Close()
	l1, l2 := zap.NewNop().Named("one"), zap.NewNop().Named("two")
	g1, g2 := f.NewGeneration(testConfig(), l1), f.NewGeneration(testConfig(), l2)
	f.Start(g1)
	if f.logBase.Load() != l1 {
		t.Fatal("the fleet does not log through the running generation's logger")
	}
	f.Start(g2)
	if f.logBase.Load() != l2 {
		t.Fatal("after a reload the fleet does not log through the new generation's logger")
	}
	f.Stop(g2) // the reload failed
	if f.logBase.Load() != l1 {
		t.Fatal("after a failed reload the fleet does not log through the generation that keeps serving")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"ok", dialsConfig("127.0.0.1:8000", "127.0.0.1:8001"), ""},
		{"negative stale_after", Config{StaleAfter: -1}, "stale_after"},
		{"negative duration", Config{PollInterval: -time.Second}, "durations"},
		{"port", Config{KVEventsPort: 70000}, "out of range"},
		{"nil engine", Config{Engines: []*EngineConfig{nil}}, "dial address is required"},
		{"no port", dialsConfig("127.0.0.1"), "host:port"},
		{"twice", dialsConfig("127.0.0.1:1", "127.0.0.1:1"), "listed twice"},
		{"max_inflight", testConfig(&EngineConfig{Dial: "127.0.0.1:1", MaxInflight: -1}), "max_inflight"},
		{"zmq endpoint", testConfig(&EngineConfig{Dial: "127.0.0.1:1", KVEvents: "ipc:///x"}), "tcp://"},
		{"unknown hash_algo", Config{HashAlgo: "sha256"}, "hash_algo"},
		{"sha256_cbor without a seed", Config{HashAlgo: "sha256_cbor"}, "needs hash_seed"},
		{"llm-d hashing, default seed", Config{HashAlgo: "llmd_fnv64a_cbor"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
