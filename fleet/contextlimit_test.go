package fleet

import (
	"testing"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestContextLimit: the smallest length among the engines serving the
// model, an adapter's being its parent's; unknown (0) as soon as one
// engine that may serve it does not say.
func TestContextLimit(t *testing.T) {
	dials := []string{"127.0.0.1:21", "127.0.0.1:22", "127.0.0.1:23", "127.0.0.1:24"}
	cfgs := make([]*EngineConfig, len(dials))
	for i, d := range dials {
		cfgs[i] = &EngineConfig{Dial: d}
	}
	f := manualFleet(t, cfgs...)
	learn := func(dial string, list ...upstreams.ServedModel) {
		f.Registry().Ensure(dial).RecordModels(list, nil)
	}
	learn(dials[0], upstreams.ServedModel{ID: "model-a", MaxModelLen: 4096}, upstreams.ServedModel{ID: "a-alias", MaxModelLen: 4096},
		upstreams.ServedModel{ID: "a-lora", Parent: "model-a"})
	learn(dials[1], upstreams.ServedModel{ID: "model-a", MaxModelLen: 2048}, upstreams.ServedModel{ID: "a-lora", Parent: "model-a"})
	learn(dials[2], upstreams.ServedModel{ID: "model-b", MaxModelLen: 1024}, upstreams.ServedModel{ID: "b-nolen"})
	// dials[3] never says what it serves.

	tests := []struct {
		model string
		dials []string
		want  int
	}{
		{"model-a", dials[:3], 2048},
		{"model-a", dials[:1], 4096},
		{"a-alias", dials[:3], 4096},
		{"a-lora", dials[:3], 2048}, // the parent's, on each engine
		{"model-b", dials[:3], 1024},
		{"b-nolen", dials[:3], 0}, // its engine leaves the length out
		{"nope", dials[:3], 0},    // nobody serves it
		{"", dials[:3], 0},        // the base model: whichever
		{"model-b", dials[:4], 0}, // the silent engine may serve it
		{"model-b", dials[2:3], 1024},
		{"model-a", []string{"127.0.0.1:99"}, 0}, // not in the registry
	}
	for _, tt := range tests {
		if got := f.ContextLimit(tt.model, tt.dials); got != tt.want {
			t.Errorf("ContextLimit(%q, %v) = %d, want %d", tt.model, tt.dials, got, tt.want)
		}
	}
}
