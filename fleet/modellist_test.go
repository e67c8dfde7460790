package fleet

import (
	"reflect"
	"testing"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestUnionModels pins the union rules of the gateway's /v1/models.
func TestUnionModels(t *testing.T) {
	type sm = upstreams.ServedModel
	base := sm{ID: "A", Root: "/models/A", MaxModelLen: 8192}
	adapter := sm{ID: "a1", Root: "/lora/a1", Parent: "A"}
	discovered := func(list ...sm) upstreams.ServedModels { return upstreams.ServedModels{List: list} }
	configured := func(ids ...string) upstreams.ServedModels {
		s := upstreams.ServedModels{List: []sm{}, Configured: true}
		for _, id := range ids {
			s.List = append(s.List, sm{ID: id})
		}
		return s
	}
	for _, tc := range []struct {
		name      string
		sets      []upstreams.ServedModels
		want      []sm
		wantKnown bool
	}{
		{"no engines", nil, []sm{}, false},
		{"nothing known", []upstreams.ServedModels{{}, {}}, []sm{}, false},
		{"known to serve nothing", []upstreams.ServedModels{{}, {List: []sm{}}}, []sm{}, true},
		{"one entry per id, sorted",
			[]upstreams.ServedModels{discovered(sm{ID: "B", Root: "/models/B", MaxModelLen: 4096}, base), discovered(base)},
			[]sm{base, {ID: "B", Root: "/models/B", MaxModelLen: 4096}}, true},
		{"smallest max_model_len wins",
			[]upstreams.ServedModels{discovered(base), discovered(sm{ID: "A", Root: "/models/A", MaxModelLen: 4096})},
			[]sm{{ID: "A", Root: "/models/A", MaxModelLen: 4096}}, true},
		{"an unknown length does not lower it",
			[]upstreams.ServedModels{discovered(sm{ID: "A", Root: "/models/A"}), discovered(base)},
			[]sm{base}, true},
		{"adapter keeps its parent and takes its length",
			[]upstreams.ServedModels{discovered(base, adapter)},
			[]sm{base, {ID: "a1", Root: "/lora/a1", Parent: "A", MaxModelLen: 8192}}, true},
		{"adapter of a missing parent has no length",
			[]upstreams.ServedModels{discovered(adapter)},
			[]sm{adapter}, true},
		{"configured-only names have root = id",
			[]upstreams.ServedModels{configured("C"), {}},
			[]sm{{ID: "C", Root: "C"}}, true},
		{"discovered wins over configured",
			[]upstreams.ServedModels{configured("a1"), discovered(base, adapter)},
			[]sm{base, {ID: "a1", Root: "/lora/a1", Parent: "A", MaxModelLen: 8192}}, true},
		{"first discovered entry gives root and parent",
			[]upstreams.ServedModels{discovered(sm{ID: "A", Root: "/x/A"}), discovered(base)},
			[]sm{{ID: "A", Root: "/x/A", MaxModelLen: 8192}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var shared [][]sm
			for _, s := range tc.sets {
				shared = append(shared, append([]sm(nil), s.List...))
			}
			got, known := UnionModels(tc.sets)
			if known != tc.wantKnown || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v known=%v, want %+v known=%v", got, known, tc.want, tc.wantKnown)
			}
			// The engines' lists are shared by their snapshots: the union
			// must not modify them.
			for i, s := range tc.sets {
				if !reflect.DeepEqual(append([]sm(nil), s.List...), shared[i]) {
					t.Errorf("set %d modified: %+v, was %+v", i, s.List, shared[i])
				}
			}
		})
	}
}

// TestListModelsPools: pool "" lists every engine's models, a pool name its
// own engines'.
func TestListModelsPools(t *testing.T) {
	f := New(zap.NewNop(), Options{ManualScrape: true})
	defer f.Close()
	g := f.NewGeneration(testConfig(
		&EngineConfig{Dial: deadDials[0]},
		&EngineConfig{Dial: deadDials[1], Pool: "other"},
	), zap.NewNop())
	f.Start(g)
	if _, known := f.ListModels(""); known {
		t.Fatal("models known before any engine told them")
	}
	f.Registry().Ensure(deadDials[0]).RecordModels([]upstreams.ServedModel{{ID: "A", Root: "/m/A", MaxModelLen: 100}}, nil)
	f.Registry().Ensure(deadDials[1]).RecordModels([]upstreams.ServedModel{{ID: "B", Root: "/m/B", MaxModelLen: 200}}, nil)
	ids := func(pool string) []string {
		list, known := f.ListModels(pool)
		if !known {
			t.Fatalf("pool %q: models unknown", pool)
		}
		var out []string
		for _, m := range list {
			out = append(out, m.ID)
		}
		return out
	}
	for pool, want := range map[string][]string{"": {"A", "B"}, "default": {"A"}, "other": {"B"}} {
		if got := ids(pool); !reflect.DeepEqual(got, want) {
			t.Errorf("pool %q: %v, want %v", pool, got, want)
		}
	}
}

// TestListModelsRouted: the fleet's list is of the engines the running
// config routes to — configured ones, and those a pool's proxy offered
// (found by DNS) — not of an engine a reload removed while it lingers in
// the registry for requests still on their way.
func TestListModelsRouted(t *testing.T) {
	f := New(zap.NewNop(), Options{ManualScrape: true})
	defer f.Close()
	cfg := func(dials ...string) *Generation {
		engines := make([]*EngineConfig, len(dials))
		for i, d := range dials {
			engines[i] = &EngineConfig{Dial: d}
		}
		return f.NewGeneration(testConfig(engines...), zap.NewNop())
	}
	f.Start(cfg(deadDials[0], deadDials[1]))
	learn := func(dial, id string) {
		f.Registry().Ensure(dial).RecordModels([]upstreams.ServedModel{{ID: id}}, nil)
	}
	learn(deadDials[0], "A")
	learn(deadDials[1], "B")
	ids := func() []string {
		list, _ := f.ListModels("")
		var out []string
		for _, m := range list {
			out = append(out, m.ID)
		}
		return out
	}
	if got := ids(); !reflect.DeepEqual(got, []string{"A", "B"}) {
		t.Fatalf("configured: %v", got)
	}
	// B's engine leaves the config while in use: it lingers, unlisted.
	f.Registry().Ensure(deadDials[1]).Reserve().Done()
	g := cfg(deadDials[0])
	f.Start(g)
	if _, ok := f.Registry().Get(deadDials[1]); !ok {
		t.Fatal("the removed engine should linger while recently used")
	}
	if got := ids(); !reflect.DeepEqual(got, []string{"A"}) {
		t.Errorf("after the removal: %v, want [A]", got)
	}
	// An engine a proxy offers (found by DNS) is listed once offered.
	const found = "127.0.0.1:61999"
	learn(found, "C")
	if got := ids(); !reflect.DeepEqual(got, []string{"A"}) {
		t.Errorf("before the proxy offered it: %v, want [A]", got)
	}
	f.LearnPool(g, "default", []string{deadDials[0], found})
	if got := ids(); !reflect.DeepEqual(got, []string{"A", "C"}) {
		t.Errorf("offered: %v, want [A C]", got)
	}
}
