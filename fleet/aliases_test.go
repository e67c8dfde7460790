package fleet

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

// TestValidateAliases: empty or blank-padded names, an alias naming
// itself and chains are refused with an error naming the alias.
func TestValidateAliases(t *testing.T) {
	for _, tc := range []struct {
		name    string
		aliases map[string]string
		want    string
	}{
		{"none", nil, ""},
		{"two to one model", map[string]string{"prod": "m-v2", "stable": "m-v2", "canary": "m-v3"}, ""},
		{"empty public name", map[string]string{"": "m"}, `model name "" is empty`},
		{"empty served name", map[string]string{"prod": ""}, `alias "prod" -> ""`},
		{"blank-padded", map[string]string{"prod ": "m"}, "surrounding blanks"},
		{"too long", map[string]string{strings.Repeat("x", maxAliasLength+1): "m"}, "at most 1024"},
		{"itself", map[string]string{"m": "m"}, `alias "m" names itself`},
		{"chain", map[string]string{"a": "b", "b": "c"}, `alias "a" -> "b" -> "c": aliases do not chain`},
		{"cycle", map[string]string{"a": "b", "b": "a"}, "do not chain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateAliases(tc.aliases)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	cfg := testConfig()
	cfg.Aliases = map[string]string{"a": "a"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "names itself") {
		t.Errorf("Config.Validate: %v, want the alias error", err)
	}
}

// TestConfigValidateModels: the engines' models_url and models and the
// models interval are checked with the rest of the config.
func TestConfigValidateModels(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"ok", testConfig(&EngineConfig{Dial: "127.0.0.1:1", ModelsURL: "https://h/v1/models", Models: []string{"a", "b"}}), ""},
		{"negative interval", Config{ModelsInterval: -time.Second}, "models_interval must not be negative"},
		{"relative models_url", testConfig(&EngineConfig{Dial: "127.0.0.1:1", ModelsURL: "/v1/models"}), "must be absolute http(s)"},
		{"bad models_url", testConfig(&EngineConfig{Dial: "127.0.0.1:1", ModelsURL: "http://h/%zz"}), "bad URL"},
		{"ftp models_url", testConfig(&EngineConfig{Dial: "127.0.0.1:1", ModelsURL: "ftp://h/v1/models"}), "must be absolute http(s)"},
		{"model twice", testConfig(&EngineConfig{Dial: "127.0.0.1:1", Models: []string{"a", "a"}}), "listed twice"},
		{"empty model", testConfig(&EngineConfig{Dial: "127.0.0.1:1", Models: []string{""}}), "empty"},
	} {
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

// TestConfigModelsReachRegistry: an engine's configured models and
// models_url, and the models interval, reach the registry.
func TestConfigModelsReachRegistry(t *testing.T) {
	f := New(zap.NewNop(), Options{ManualScrape: true})
	defer f.Close()
	cfg := testConfig(&EngineConfig{Dial: deadDials[0], ModelsURL: "http://127.0.0.1:1/x/v1/models", Models: []string{"A", "a1"}})
	cfg.ModelsInterval = time.Minute
	f.Start(f.NewGeneration(cfg, zap.NewNop()))
	e, ok := f.Registry().Get(deadDials[0])
	if !ok {
		t.Fatal("engine not registered")
	}
	if got := e.Config().ModelsURL; got != "http://127.0.0.1:1/x/v1/models" {
		t.Errorf("ModelsURL %q", got)
	}
	if serves, known := e.ServesModel("a1"); !serves || !known {
		t.Errorf("configured model a1: serves %v, known %v", serves, known)
	}
	if got := f.registryOptions(&cfg).ModelsInterval; got != time.Minute {
		t.Errorf("ModelsInterval %v", got)
	}
}

// TestWithAliases: an alias is listed as a copy of its served model's
// entry, only where that model is served, shadowing a served model of
// its own name; the input list is left alone.
func TestWithAliases(t *testing.T) {
	type sm = upstreams.ServedModel
	base := sm{ID: "A", Root: "/models/A", MaxModelLen: 8192}
	adapter := sm{ID: "a1", Root: "/lora/a1", Parent: "A"}
	shadowed := sm{ID: "old", Root: "/models/old", MaxModelLen: 10}
	list := []sm{base, adapter, shadowed}
	got := WithAliases(list, map[string]string{"prod": "A", "tuned": "a1", "old": "A", "gone": "B"})
	want := []sm{
		base, adapter,
		{ID: "old", Root: "/models/A", MaxModelLen: 8192},
		{ID: "prod", Root: "/models/A", MaxModelLen: 8192},
		{ID: "tuned", Root: "/lora/a1", Parent: "A"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if !reflect.DeepEqual(list, []sm{base, adapter, shadowed}) {
		t.Errorf("input list modified: %+v", list)
	}
	if got := WithAliases(list, map[string]string{"gone": "B"}); &got[0] != &list[0] {
		t.Error("no alias applies, yet the list was copied")
	}
}

// TestAliasesFollowGenerations: ResolveAlias and ListModels follow the
// running generation's aliases, and a failed reload restores the
// previous ones.
func TestAliasesFollowGenerations(t *testing.T) {
	f := New(zap.NewNop(), Options{ManualScrape: true})
	defer f.Close()
	cfg1 := testConfig(&EngineConfig{Dial: deadDials[0]})
	cfg1.Aliases = map[string]string{"prod": "A"}
	g1 := f.NewGeneration(cfg1, zap.NewNop())
	f.Start(g1)
	f.Registry().Ensure(deadDials[0]).RecordModels([]upstreams.ServedModel{{ID: "A", Root: "/m/A"}}, nil)
	if served, ok := f.ResolveAlias("prod"); !ok || served != "A" {
		t.Fatalf("ResolveAlias(prod) = %q, %v", served, ok)
	}
	for _, name := range []string{"A", "", "other"} {
		if _, ok := f.ResolveAlias(name); ok {
			t.Errorf("%q resolved as an alias", name)
		}
	}
	list, _ := f.ListModels("")
	if len(list) != 2 || list[1] != (upstreams.ServedModel{ID: "prod", Root: "/m/A"}) {
		t.Errorf("ListModels: %+v", list)
	}
	cfg2 := testConfig(&EngineConfig{Dial: deadDials[0]})
	g2 := f.NewGeneration(cfg2, zap.NewNop())
	f.Start(g2)
	if _, ok := f.ResolveAlias("prod"); ok {
		t.Error("alias kept after a config without it")
	}
	f.Stop(g2) // a failed reload: g1 keeps serving
	if _, ok := f.ResolveAlias("prod"); !ok {
		t.Error("alias not restored with the generation that keeps serving")
	}
}
