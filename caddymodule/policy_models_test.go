package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// multiModelEngines starts issue 37's fleet: three engines of model-a
// (also named a-alias), the first with the adapter a-lora, and two of
// model-b.
func multiModelEngines(t *testing.T) (all, a, b []*vllmsim.Engine) {
	t.Helper()
	cfgA := vllmsim.Config{Model: "model-a", ModelAliases: []string{"a-alias"}}
	loraA := cfgA
	loraA.LoRAModules = []string{"a-lora"}
	a = append(startEngines(t, 1, loraA), startEngines(t, 2, cfgA)...)
	b = startEngines(t, 2, vllmsim.Config{Model: "model-b"})
	return append(append([]*vllmsim.Engine{}, a...), b...), a, b
}

// waitModelsLearned waits until /llm/engines shows every engine's models
// as discovered from its /v1/models.
func waitModelsLearned(t *testing.T, engines ...*vllmsim.Engine) {
	t.Helper()
	testwait.For(t, 15*time.Second, "every engine's models learned", func() bool {
		var reports []map[string]any
		if adminJSON(t, http.MethodGet, "/llm/engines", "", &reports) != http.StatusOK {
			return false
		}
		learned := map[string]bool{}
		for _, r := range reports {
			if models, _ := r["models"].([]any); len(models) > 0 && r["models_source"] == "discovered" {
				learned[r["dial"].(string)] = true
			}
		}
		for _, e := range engines {
			if !learned[e.Addr()] {
				return false
			}
		}
		return true
	})
}

// modelBody is a small chat request for model.
func modelBody(model string, i int) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"hello %d"}]}`, model, i)
}

// checkServedOnly fails the test for every request an engine received for
// a model it does not serve, and returns the requests each model got.
func checkServedOnly(t *testing.T, engines []*vllmsim.Engine) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, e := range engines {
		for model, n := range e.RequestsByModel() {
			got[model] += n
			if n > 0 && !e.Serves(model) {
				t.Errorf("engine %s got %d requests for %q, which it does not serve", e.Addr(), n, model)
			}
		}
	}
	return got
}

// TestAdmissionRoutesByModel is issue 37's test: behind one endpoint,
// requests for each model (its base id, its alias, its adapter) reach
// only engines serving it, and a model no engine serves is answered 404
// model_not_found by the gateway, reaching no engine.
func TestAdmissionRoutesByModel(t *testing.T) {
	all, _, _ := multiModelEngines(t)
	gateway{engines: noKVEngines(all...), engineExtra: "\t\t\tmax_inflight 4\n"}.load(t)
	waitModelsLearned(t, all...)
	rejectedBefore := metricValue(t, "llmgw_admission_rejected_total", `reason="model_not_found"`)

	models := []string{"model-a", "a-alias", "a-lora", "model-b", "no-such-model"}
	const n = 300
	var mu sync.Mutex
	status := map[string]map[int]int{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		model := models[i%len(models)]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r := send(context.Background(), "", modelBody(model, i), nil)
			mu.Lock()
			defer mu.Unlock()
			if status[model] == nil {
				status[model] = map[int]int{}
			}
			status[model][r.status]++
			if model == "no-such-model" && r.status == http.StatusNotFound {
				checkModelNotFound(t, r.body, model)
			}
		}()
	}
	wg.Wait()
	for _, model := range models {
		want := http.StatusOK
		if model == "no-such-model" {
			want = http.StatusNotFound
		}
		if status[model][want] != n/len(models) {
			t.Errorf("%s: statuses %v, want all %d", model, status[model], want)
		}
	}
	got := checkServedOnly(t, all)
	if got["no-such-model"] != 0 {
		t.Errorf("engines saw %d requests for the unknown model", got["no-such-model"])
	}
	if d := metricValue(t, "llmgw_admission_rejected_total", `reason="model_not_found"`) - rejectedBefore; d != n/float64(len(models)) {
		t.Errorf("model_not_found rejections counted %v, want %d", d, n/len(models))
	}
}

// checkModelNotFound checks a 404 body is OpenAI's model_not_found error
// naming model.
func checkModelNotFound(t *testing.T, body, model string) {
	t.Helper()
	var v struct {
		Error struct {
			Message, Type, Param, Code string
		}
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Errorf("404 body not JSON (%v): %q", err, body)
		return
	}
	e := v.Error
	if e.Code != "model_not_found" || e.Type != "invalid_request_error" || e.Param != "model" ||
		e.Message != "The model `"+model+"` does not exist." {
		t.Errorf("404 body %q", body)
	}
}

// llmgwSeries is the set of llmgw_* sample lines' names and labels on
// the admin /metrics page.
func llmgwSeries(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, line := range strings.Split(scrapeMetrics(t), "\n") {
		if strings.HasPrefix(line, "llmgw_") {
			out[line[:strings.LastIndexByte(line, ' ')]] = true
		}
	}
	return out
}

// TestModelLabelBounded: requests' model label is one of the fleet's
// models; 10,000 made-up model names (answered 404, counted as rejected)
// add no llmgw_* series.
func TestModelLabelBounded(t *testing.T) {
	all, _, _ := multiModelEngines(t)
	gateway{engines: noKVEngines(all...), engineExtra: "\t\t\tmax_inflight 4\n"}.load(t)
	waitModelsLearned(t, all...)
	// Every series the test's requests make, made once.
	for _, model := range []string{"model-a", "a-lora", "model-b"} {
		if r := mustSend(t, "", modelBody(model, 0), nil); r.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", model, r.status, r.body)
		}
	}
	if r := send(context.Background(), "", modelBody("made-up", 0), nil); r.status != http.StatusNotFound {
		t.Fatalf("made-up model: status %d: %s", r.status, r.body)
	}
	if v := metricValue(t, "llmgw_responses_total", `model="a-lora"`); v < 1 {
		t.Fatalf("no response counted under the adapter's own name")
	}
	before := llmgwSeries(t)
	const n = 10000
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				r := send(context.Background(), "", modelBody(fmt.Sprintf("made-up-%d", i), i), nil)
				if r.status != http.StatusNotFound {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d made-up models were not answered 404", f)
	}
	after := llmgwSeries(t)
	for s := range after {
		if !before[s] {
			t.Errorf("new series %s", s)
		}
	}
	if len(after) != len(before) {
		t.Errorf("%d llmgw_* series before, %d after", len(before), len(after))
	}
}

// TestPolicyRoutesByModel: without llm_admission, lb_policy llm sends each
// model's requests only to engines serving it and answers a model none
// serves 404 model_not_found itself.
func TestPolicyRoutesByModel(t *testing.T) {
	all, _, _ := multiModelEngines(t)
	gateway{engines: noKVEngines(all...), admission: "-"}.load(t)
	waitModelsLearned(t, all...)
	for i := range 100 {
		model := []string{"model-a", "a-alias", "a-lora", "model-b", "no-such-model"}[i%5]
		r := send(context.Background(), "", modelBody(model, i), nil)
		switch {
		case model == "no-such-model" && r.status == http.StatusNotFound:
			checkModelNotFound(t, r.body, model)
		case model == "no-such-model":
			t.Fatalf("unknown model: status %d: %s", r.status, r.body)
		case r.status != http.StatusOK:
			t.Fatalf("%s: status %d: %s", model, r.status, r.body)
		}
	}
	if got := checkServedOnly(t, all); got["no-such-model"] != 0 {
		t.Errorf("engines saw %d requests for the unknown model", got["no-such-model"])
	}
}
