package vllmsim

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMaxLoRAsConfig(t *testing.T) {
	cases := []struct {
		name     string
		cfg      Config
		wantErr  string // "" = valid
		wantMax  int
		wantLoad time.Duration
	}{
		{"default without adapters", Config{}, "", 1, 0},
		{"default is the number of adapters", Config{LoRAModules: []string{"a", "b", "c"}}, "", 3, 0},
		{"explicit", Config{LoRAModules: []string{"a", "b", "c"}, MaxLoRAs: 2, LoRALoadTime: 20 * time.Millisecond}, "", 2, 20 * time.Millisecond},
		{"more slots than adapters", Config{LoRAModules: []string{"a"}, MaxLoRAs: 8}, "", 8, 0},
		{"most", Config{MaxLoRAs: 1024}, "", 1024, 0},
		{"too many", Config{MaxLoRAs: 1025}, "max_loras 1025 out of range 1..1024", 0, 0},
		{"negative", Config{MaxLoRAs: -1}, "max_loras -1 out of range", 0, 0},
		{"negative load time", Config{LoRALoadTime: -time.Millisecond}, "lora_load_time -1ms must not be negative", 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.cfg.withDefaults()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("withDefaults error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("withDefaults: %v", err)
			}
			if got.MaxLoRAs != tc.wantMax || got.LoRALoadTime != tc.wantLoad {
				t.Errorf("MaxLoRAs %d LoRALoadTime %v, want %d %v", got.MaxLoRAs, got.LoRALoadTime, tc.wantMax, tc.wantLoad)
			}
		})
	}
}

// TestLoRASlotsLRU drives the slot bookkeeping step by step: which adapters
// a batch admits and which it has to load.
func TestLoRASlotsLRU(t *testing.T) {
	type step struct {
		batch        []int // adapters in the order the step admits them
		wantRejected []int // adapters refused because the batch is full
		wantLoads    int
		wantResident []int
	}
	cases := []struct {
		name     string
		capacity int
		steps    []step
	}{
		{"one slot swaps", 1, []step{
			{[]int{1}, nil, 1, []int{1}},
			{[]int{1, 1}, nil, 0, []int{1}},
			{[]int{2, 1}, []int{1}, 1, []int{2}},
			{[]int{0, 1}, nil, 1, []int{1}}, // the base model takes no slot
			{[]int{0}, nil, 0, []int{1}},    // an idle adapter stays loaded
		}},
		{"two slots evict the least recently used", 2, []step{
			{[]int{1, 2}, nil, 2, []int{1, 2}},
			{[]int{1, 3, 2}, []int{2}, 1, []int{1, 3}},
			{[]int{3}, nil, 0, []int{1, 3}},
			{[]int{2}, nil, 1, []int{2, 3}},
			{[]int{3, 2, 1}, []int{1}, 0, []int{2, 3}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newLoRASlots(tc.capacity, 3)
			for i, st := range tc.steps {
				s.begin(nil)
				var rejected []int
				for _, id := range st.batch {
					if !s.admits(id) {
						rejected = append(rejected, id)
						continue
					}
					s.add(id)
				}
				loads := s.load()
				if !slices.Equal(rejected, st.wantRejected) || loads != st.wantLoads || !slices.Equal(s.resident(), st.wantResident) {
					t.Fatalf("step %d: rejected %v loads %d resident %v, want %v %d %v",
						i, rejected, loads, s.resident(), st.wantRejected, st.wantLoads, st.wantResident)
				}
			}
			s.reset()
			if r := s.resident(); len(r) != 0 {
				t.Errorf("resident after reset: %v", r)
			}
		})
	}
}

// longRequest is a completion in flight that the test ends by cancelling.
type longRequest struct {
	cancel context.CancelFunc
	done   chan int // its status, or 0 when the client gave up
}

func startLong(t *testing.T, c *http.Client, e *Engine, model string) *longRequest {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": "a long one for " + model, "max_tokens": 5000})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	lr := &longRequest{cancel: cancel, done: make(chan int, 1)}
	go func() {
		resp, err := c.Do(req)
		if err != nil {
			lr.done <- 0
			return
		}
		resp.Body.Close()
		lr.done <- resp.StatusCode
	}()
	t.Cleanup(func() { cancel(); <-lr.done })
	return lr
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// liveAdapters returns the adapters of the running and the waiting
// requests, as vllm:lora_requests_info would label them now.
func (e *Engine) liveAdapters() (running, waiting string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.loraSetLocked(e.running), e.loraSetLocked(e.waiting)
}

// TestMaxLoRAsHoldsAdapters: with two slots and three adapters in flight,
// the third adapter's request waits until a slot frees, while base-model
// requests and requests for adapters in the batch pass it; the running
// requests never use more than two adapters. The engine counts the
// adapter requests that arrived while their adapter was in flight.
func TestMaxLoRAsHoldsAdapters(t *testing.T) {
	e := startEngine(t, Config{Model: "base", TimeScale: 10, MaxNumSeqs: 8, MaxLoRAs: 2, LoRAModules: []string{"a", "b", "c"}})
	c := newClient(t)

	// Watch the running adapters for the whole test.
	stop := make(chan struct{})
	var watch sync.WaitGroup
	var most []string
	watch.Add(1)
	go func() {
		defer watch.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if running, _ := e.liveAdapters(); strings.Count(running, ",") >= 2 {
				most = append(most, running)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	stats := func(running, waiting int) func() bool {
		return func() bool { st := e.Stats(); return st.Running == running && st.Waiting == waiting }
	}
	reqA, reqB := startLong(t, c, e, "a"), startLong(t, c, e, "b")
	waitFor(t, "a and b running", stats(2, 0))
	reqC := startLong(t, c, e, "c")
	waitFor(t, "c waiting", stats(2, 1))
	startLong(t, c, e, "base")
	waitFor(t, "the base model passing c", stats(3, 1))
	// A short request for a joins the batch ahead of c and finishes.
	if r := complete(t, c, e.URL()+"/v1/completions", map[string]any{"model": "a", "prompt": "short", "max_tokens": 2}); r.Usage.CompletionTokens != 2 {
		t.Fatalf("short request for a: %+v", r)
	}
	if running, waiting := e.liveAdapters(); running != "a,b" || waiting != "c" {
		t.Fatalf("running adapters %q waiting %q, want a,b and c", running, waiting)
	}
	// Four adapter requests arrived; only the short one for a joined
	// requests for its adapter (the base model's is not counted).
	if st := e.Stats(); st.AdapterArrivals != 4 || st.AdapterArrivalsInFlight != 1 {
		t.Errorf("adapter arrivals %d, in flight %d, want 4 and 1", st.AdapterArrivals, st.AdapterArrivalsInFlight)
	}
	labels := loraInfo(t, c, e)
	if labels["max_lora"] != "2" || labels["running_lora_adapters"] != "a,b" || labels["waiting_lora_adapters"] != "c" {
		t.Errorf("lora_requests_info %v", labels)
	}

	// b's slot frees: c runs.
	reqB.cancel()
	waitFor(t, "c running in b's slot", stats(3, 0))
	if running, _ := e.liveAdapters(); running != "a,c" {
		t.Errorf("running adapters %q, want a,c", running)
	}
	select {
	case st := <-reqC.done:
		t.Fatalf("c's request ended early: %d", st)
	default:
	}
	reqA.cancel()
	close(stop)
	watch.Wait()
	if len(most) > 0 {
		t.Errorf("more than 2 adapters running: %q", most)
	}
}

// loraInfo returns the labels of vllm:lora_requests_info.
func loraInfo(t *testing.T, c *http.Client, e *Engine) map[string]string {
	t.Helper()
	f, ok := scrape(t, c, e)["vllm:lora_requests_info"]
	if !ok || len(f.Metric) != 1 {
		t.Fatalf("lora_requests_info %v", f)
	}
	labels := map[string]string{}
	for _, l := range f.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	return labels
}

// TestLoRALoadTimeInTTFT: a step that loads an adapter takes LoRALoadTime
// longer, which time to first token shows; loaded adapters are an LRU of
// MaxLoRAs slots, emptied by a restart.
func TestLoRALoadTimeInTTFT(t *testing.T) {
	const load = 500 * time.Millisecond
	cases := []struct {
		name     string
		maxLoRAs int
		models   []string
		loads    []int // adapters each request loads
	}{
		{"one slot", 1,
			[]string{"base", "a", "a", "b", "a", "base", "a", "restart", "a"},
			[]int{0, 1, 0, 1, 1, 0, 0, 0, 1}},
		{"two slots", 2,
			[]string{"a", "b", "a", "b", "base", "restart", "b"},
			[]int{1, 1, 0, 0, 0, 0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Model: "base", TimeScale: 100, MaxLoRAs: tc.maxLoRAs, LoRALoadTime: load, LoRAModules: []string{"a", "b"}}
			e := startEngine(t, cfg)
			cfg = e.Config()
			c := newClient(t)
			for i, model := range tc.models {
				if model == "restart" {
					if err := e.Restart(); err != nil {
						t.Fatal(err)
					}
					c.CloseIdleConnections() // the restart dropped them
					continue
				}
				before, loadsBefore := gauge(t, scrape(t, c, e), "vllm:time_to_first_token_seconds"), e.Stats().LoRALoads
				// A prompt of its own, so no request reuses another's blocks.
				r := complete(t, c, e.URL()+"/v1/completions", map[string]any{"model": model, "prompt": fmt.Sprintf("request %d", i), "max_tokens": 1})
				ttft := gauge(t, scrape(t, c, e), "vllm:time_to_first_token_seconds") - before
				prefill := float64(r.Usage.PromptTokens-cachedTokens(r)) / cfg.PrefillTokensPerSec
				want := cfg.DecodeStepTime.Seconds() + prefill + float64(tc.loads[i])*load.Seconds()
				if math.Abs(ttft-want) > 1e-6 {
					t.Errorf("request %d (%s): ttft %v s, want %v s", i, model, ttft, want)
				}
				if got := e.Stats().LoRALoads - loadsBefore; got != uint64(tc.loads[i]) {
					t.Errorf("request %d (%s): %d loads, want %d", i, model, got, tc.loads[i])
				}
			}
		})
	}
}
