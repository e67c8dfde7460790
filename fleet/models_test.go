package fleet

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/upstreams"
	"go.uber.org/zap"
)

// modelDials are five engines: two serve model-a (the first also its
// adapter), one serves model-b, one does not serve /v1/models, and the
// last has not answered it yet. joinerDial joined after they answered.
var modelDials = []string{"127.0.0.1:11", "127.0.0.1:12", "127.0.0.1:13", "127.0.0.1:14", "127.0.0.1:15"}

const joinerDial = "127.0.0.1:16"

// modelFleet is a manual fleet over modelDials with their models learned,
// each engine taking at most two requests, and joinerDial added last. Its
// clock moves a millisecond at every reading, so that what happens later
// in the test is later on it.
func modelFleet(t *testing.T) *Fleet {
	t.Helper()
	var ticks atomic.Int64
	f := New(zap.NewNop(), Options{ManualScrape: true, Now: func() time.Time {
		return time.Unix(0, ticks.Add(int64(time.Millisecond)))
	}})
	t.Cleanup(f.Close)
	cfgs := make([]*EngineConfig, len(modelDials))
	for i, d := range modelDials {
		cfgs[i] = &EngineConfig{Dial: d, MaxInflight: 2}
	}
	f.Start(f.NewGeneration(testConfig(cfgs...), zap.NewNop()))
	learn := func(dial string, ids ...string) {
		list := make([]upstreams.ServedModel, len(ids))
		for i, id := range ids {
			list[i] = upstreams.ServedModel{ID: id}
		}
		f.Registry().Ensure(dial).RecordModels(list, nil)
	}
	learn(modelDials[0], "model-a", "a-alias", "a-lora")
	learn(modelDials[1], "model-a", "a-alias")
	learn(modelDials[2], "model-b")
	f.Registry().Ensure(modelDials[3]).RecordModels(nil, fmt.Errorf("HTTP 404: %w", upstreams.ErrModelsUnavailable))
	for _, d := range modelDials {
		scrape(f, d, upstreams.Gauges{})
	}
	f.Registry().Ensure(joinerDial)
	return f
}

// TestServing: the candidates for a model are the engines listing it (by
// base id, alias or adapter id) and those whose models are unknown,
// except an engine that joined after the model's engines were known and
// has not answered /v1/models yet; a model no known engine lists is not
// found only when every candidate's models are known.
func TestServing(t *testing.T) {
	f := modelFleet(t)
	known := modelDials[:3]
	tests := []struct {
		model    string
		dials    []string
		want     []string
		notFound bool
	}{
		{"model-a", modelDials, []string{modelDials[0], modelDials[1], modelDials[3], modelDials[4]}, false},
		{"model-a", []string{modelDials[0], joinerDial}, modelDials[:1], false}, // the joiner waits for its models
		{"model-b", []string{joinerDial, modelDials[4]}, []string{joinerDial, modelDials[4]}, false},
		{"a-alias", known, modelDials[:2], false},
		{"a-lora", known, modelDials[:1], false},
		{"model-b", known, modelDials[2:3], false},
		{"", known, known, false},
		{"nope", known, []string{}, true},
		{"nope", modelDials, modelDials[3:], false},                                // fail open on the unknown engines
		{"nope", []string{modelDials[0], joinerDial}, []string{joinerDial}, false}, // the joiner too: no one else may
		{"nope", nil, nil, false},
		{"model-a", []string{"127.0.0.1:99"}, []string{"127.0.0.1:99"}, false}, // never seen
		{"model-a", []string{modelDials[0], "127.0.0.1:99"}, modelDials[:1], false},
	}
	for _, tc := range tests {
		got, notFound := f.Serving(tc.model, tc.dials)
		if !slices.Equal(got, tc.want) || notFound != tc.notFound {
			t.Errorf("Serving(%q, %v) = %v, %v; want %v, %v", tc.model, tc.dials, got, notFound, tc.want, tc.notFound)
		}
	}
}

// TestTryReserveModel: admission counts capacity per model. With
// model-a's engines full, model-a requests are refused (they park) while
// model-b's idle engine admits model-b requests; an unknown model is
// never admitted, not even fail-open.
func TestTryReserveModel(t *testing.T) {
	f := modelFleet(t)
	dials := modelDials[:3]
	lim := Limits{KV: 0.9}
	for _, d := range modelDials[:2] {
		scrape(f, d, upstreams.Gauges{Running: 2})
	}
	if res, _, ok := f.TryReserveModel("model-a", dials, lim); ok {
		t.Fatalf("model-a admitted on %s with its engines full", res.Engine().Dial())
	}
	res, failOpen, ok := f.TryReserveModel("model-b", dials, lim)
	if !ok || failOpen || res.Engine().Dial() != modelDials[2] {
		t.Fatalf("model-b: ok %v failOpen %v, want a reservation on %s", ok, failOpen, modelDials[2])
	}
	res.Done()
	if _, _, ok := f.TryReserveModel("nope", dials, lim); ok {
		t.Fatal("an unknown model was admitted")
	}
	// A model-a request's placement refuses too, and takes model-a's
	// engine once it has room.
	s := DefaultSettings()
	s.Tokenize = false
	p := f.Place(context.Background(), Query{Request: chatRequest(t, map[string]any{"model": "model-a"}, "hi"), Dials: dials, Settings: s})
	if _, _, ok := p.Reserve(dials, lim, admission.PassAny); ok {
		t.Fatalf("placed model-a admitted on %s with its engines full", p.Engine)
	}
	scrape(f, modelDials[1], upstreams.Gauges{Running: 1})
	res, _, ok = p.Reserve(dials, lim, admission.PassAny)
	if !ok || res.Engine().Dial() != modelDials[1] {
		t.Fatalf("placed model-a: ok %v engine %q, want %s", ok, p.Engine, modelDials[1])
	}
	res.Done()
}

// TestModelGateNoHeadOfLine: requests for a model whose engines are full
// park in a gate of their own, so requests for another model are admitted
// past them, and a completion on the full model's engine wakes them.
func TestModelGateNoHeadOfLine(t *testing.T) {
	f := modelFleet(t)
	dials := modelDials[:3]
	lim := Limits{KV: 0.9}
	for _, d := range modelDials[:2] {
		scrape(f, d, upstreams.Gauges{Running: 2})
	}
	cfg := admission.Config{QueueSize: 8}
	var held []*upstreams.Reservation
	t.Cleanup(func() {
		for _, r := range held {
			r.Done()
		}
	})
	enter := func(model string) (*admission.Waiter, *admission.Gate) {
		serving, _ := f.Serving(model, dials)
		g := f.ModelGate("pool", dials, serving, cfg)
		w, err := g.Enter(admission.Normal, func() bool {
			res, _, ok := f.TryReserveModel(model, dials, lim)
			if ok {
				held = append(held, res)
			}
			return ok
		})
		if err != nil {
			t.Fatal(err)
		}
		return w, g
	}
	wa, ga := enter("model-a")
	if isReady(wa) {
		t.Fatal("model-a admitted with its engines full")
	}
	wb, gb := enter("model-b")
	if !isReady(wb) || ga == gb {
		t.Fatal("model-b waited behind model-a's parked request")
	}
	if _, gAlias := enter("a-alias"); gAlias != ga {
		t.Fatal("two names of one engine set got different gates")
	}
	scrape(f, modelDials[0], upstreams.Gauges{Running: 1})
	ga.Kick()
	if !isReady(wa) || held[len(held)-1].Engine().Dial() != modelDials[0] {
		t.Fatal("model-a's parked request was not admitted on its engine when it freed")
	}
}

// TestRouteByModel: routing leaves out the engines of other models,
// whatever they hold and however idle, cache-keyed requests included.
func TestRouteByModel(t *testing.T) {
	f := modelFleet(t)
	dials := modelDials[:3]
	scrape(f, modelDials[2], upstreams.Gauges{Running: 1}) // the busiest
	s := DefaultSettings()
	s.Tokenize = false
	for _, model := range []string{"model-b", "model-a", "a-lora", "nope"} {
		req := chatRequest(t, map[string]any{"model": model}, "route me")
		for _, key := range []string{"", "k1", "k2", "k3"} {
			pick := f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s, CacheKey: key})
			var got string
			if pick.Index >= 0 {
				got = dials[pick.Index]
			}
			serving, _ := f.Serving(model, dials)
			switch {
			case len(serving) == 0 && pick.Index != -1:
				t.Errorf("%s (key %q): routed to %s, want no candidate", model, key, got)
			case len(serving) > 0 && !slices.Contains(serving, got):
				t.Errorf("%s (key %q): routed to %q, not among %v", model, key, got, serving)
			}
		}
	}
	pick := f.Route(context.Background(), Query{Request: chatRequest(t, map[string]any{"model": "model-b"}, "x"),
		Dials: dials, Settings: s, Explain: true})
	if pick.Scored == nil || pick.Scored[0].Excluded != ReasonModelNotServed {
		t.Fatalf("explain does not say why model-a's engine was left out: %+v", pick.Scored)
	}
}

// TestModelLabel: a label is a name some engine serves or a configured
// tokenizer's model; any other name, even one admitted fail-open on an
// engine whose models are unknown, is "other".
func TestModelLabel(t *testing.T) {
	f := modelFleet(t)
	f.noteTokenizerNames([]*TokenizerConfig{{Model: "tok-model"}, {Model: "*"}, nil})
	for model, want := range map[string]string{
		"model-a": "model-a", "a-alias": "a-alias", "a-lora": "a-lora", "model-b": "model-b",
		"tok-model": "tok-model", "": "", "*": OtherModel, "made-up": OtherModel, "other": OtherModel,
	} {
		if got := f.ModelLabel(model); got != want {
			t.Errorf("ModelLabel(%q) = %q, want %q", model, got, want)
		}
	}
}
