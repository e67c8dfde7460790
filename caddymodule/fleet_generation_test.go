package caddymodule

import (
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

func generationApp(dials ...string) *App {
	a := &App{
		PollInterval: caddy.Duration(time.Hour), PollTimeout: caddy.Duration(time.Second),
		StaleAfter: 3, IdleTTL: caddy.Duration(time.Hour),
		TokenizeTimeout: caddy.Duration(time.Second), TokenizeConcurrency: 8, TokenizeCacheSize: 64,
	}
	for _, d := range dials {
		a.Engines = append(a.Engines, &EngineConfig{Dial: d})
	}
	return a
}

func registryDials(f *fleet) []string {
	var out []string
	for _, e := range f.registry.Engines() {
		if e.Config().Static {
			out = append(out, e.Dial())
		}
	}
	slices.Sort(out)
	return out
}

// TestFleetGenerations: only the running config generation's policies
// teach admission a pool's upstreams (during a reload, requests still in
// the old routes must not re-teach the old list), and a reload that fails
// after the llm app started hands the fleet back to the generation that
// keeps serving, while a shutdown restores nothing.
func TestFleetGenerations(t *testing.T) {
	f := newFleet(zap.NewNop())
	defer f.Destruct()
	old, next := generationApp(deadDials[0]), generationApp(deadDials[1])

	f.startGeneration(old)
	f.learnPool(old, "default", []string{deadDials[0]})
	if got := f.poolDials("default"); !slices.Equal(got, []string{deadDials[0]}) {
		t.Fatalf("running generation's pool = %v", got)
	}

	// Reload: the new generation starts; an old route's request arrives late.
	if prev := f.startGeneration(next); prev != old {
		t.Fatalf("startGeneration returned %p, want the old generation", prev)
	}
	f.learnPool(old, "default", []string{deadDials[0]})
	if got := f.poolDials("default"); !slices.Equal(got, []string{deadDials[1]}) {
		t.Fatalf("after reload the pool is %v: an old route's request re-taught it (want the new config's %v)", got, deadDials[1:2])
	}
	f.learnPool(next, "default", []string{deadDials[1], deadDials[2]})
	if got := f.poolDials("default"); len(got) != 2 {
		t.Fatalf("the running generation's policy did not teach the pool: %v", got)
	}

	// The reload fails after the llm app started: Caddy stops the new
	// generation and the old one keeps serving.
	f.stopGeneration(next, old)
	if got := registryDials(f); !slices.Equal(got, []string{deadDials[0]}) {
		t.Fatalf("after a failed reload the fleet follows %v, want the old config's %v", got, deadDials[:1])
	}
	f.learnPool(next, "default", []string{deadDials[2]})
	f.learnPool(old, "default", []string{deadDials[0]})
	if got := f.poolDials("default"); !slices.Equal(got, []string{deadDials[0]}) {
		t.Fatalf("after a failed reload the pool is %v, want %v", got, deadDials[:1])
	}
	f.cleanupGeneration(next)

	// A successful reload, then shutdown: nothing is restored.
	third := generationApp(deadDials[2])
	f.startGeneration(third)
	f.stopGeneration(old, nil)
	f.cleanupGeneration(old)
	f.stopGeneration(third, old)
	if got := registryDials(f); !slices.Equal(got, []string{deadDials[2]}) {
		t.Fatalf("shutdown re-applied a cleaned-up generation: fleet follows %v", got)
	}
	f.learnPool(third, "default", []string{deadDials[0]})
	if got := f.poolDials("default"); slices.Equal(got, []string{deadDials[0]}) {
		t.Fatalf("a stopped generation taught the pool: %v", got)
	}
}
