package upstreams

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testclock"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// modelsFront is a simulated engine behind a proxy that counts its
// /v1/models requests and can answer them itself, so a test sees when the
// poller asks and what it makes of a bad answer.
type modelsFront struct {
	sim    *vllmsim.Engine
	srv    *httptest.Server
	hits   atomic.Int64 // /v1/models requests
	scrape atomic.Int64 // /metrics requests
	mu     sync.Mutex
	status int    // 0: pass /v1/models to the engine
	body   string // answered with status when status != 0
}

func newModelsFront(t *testing.T, cfg vllmsim.Config) *modelsFront {
	t.Helper()
	sim, err := vllmsim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	target, _ := url.Parse(sim.URL())
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = tr
	f := &modelsFront{sim: sim}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			f.hits.Add(1)
			f.mu.Lock()
			status, body := f.status, f.body
			f.mu.Unlock()
			if status != 0 {
				w.WriteHeader(status)
				_, _ = w.Write([]byte(body))
				return
			}
		case "/metrics":
			f.scrape.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *modelsFront) dial() string { return strings.TrimPrefix(f.srv.URL, "http://") }

// answer makes the front answer /v1/models itself; status 0 passes it on.
func (f *modelsFront) answer(status int, body string) {
	f.mu.Lock()
	f.status, f.body = status, body
	f.mu.Unlock()
}

// pollModelsT scrapes a non-running registry's engine once and fetches its
// models if s says they are due, as the poller does.
func pollModelsT(e *Engine, s *modelsSchedule) {
	var buf, scratch []byte
	ctx := context.Background()
	e.fetchModelsIfDue(ctx, s, e.scrapeSince(ctx, e.markEpoch(), &buf, &scratch))
}

// TestModelsLearnedFromSim: the first successful scrape learns the
// engine's models as vLLM lists them — the base model with its context
// length, the adapters with the base as parent — and its LoRA state.
func TestModelsLearnedFromSim(t *testing.T) {
	f := newModelsFront(t, vllmsim.Config{Model: "base", MaxModelLen: 4096, LoRAModules: []string{"sql", "chat"}, TimeScale: 10000})
	o := fastOpts()
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: f.dial()}}, o)
	e, _ := r.Get(f.dial())
	testwait.For(t, 15*time.Second, "models learned", func() bool { return e.Models().List != nil })
	m := e.Models()
	want := []ServedModel{{ID: "base", Root: "base", MaxModelLen: 4096},
		{ID: "sql", Root: "/sim/lora/sql", Parent: "base"}, {ID: "chat", Root: "/sim/lora/chat", Parent: "base"}}
	if m.Configured || m.Error != "" || m.LearnedAt.IsZero() || len(m.List) != len(want) {
		t.Fatalf("models: %+v", m)
	}
	for i := range want {
		if m.List[i] != want[i] {
			t.Errorf("model %d: %+v, want %+v", i, m.List[i], want[i])
		}
	}
	if s := e.LoRA(); !s.Known || s.MaxLoRA != 2 || len(s.Running) != 0 || len(s.Waiting) != 0 {
		t.Fatalf("LoRA state of an idle engine: %+v", s)
	}
	if got := dials(r.Serving("chat")); len(got) != 1 || got[0] != f.dial() {
		t.Fatalf("Serving(chat) = %v", got)
	}
}

// TestModelsSchedule: models are fetched at first contact, then only every
// ModelsInterval on the registry's clock, at once after a restart; a bad
// body keeps the last good list, and an engine without /v1/models is asked
// ten times less often.
func TestModelsSchedule(t *testing.T) {
	f := newModelsFront(t, vllmsim.Config{TimeScale: 10000})
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	r := NewRegistry(Options{ModelsInterval: 30 * time.Second, PollInterval: time.Second, Now: clk.Now})
	defer r.Close()
	e := r.Ensure(f.dial())
	var s modelsSchedule
	step := func(what string, advance time.Duration, wantHits int64) {
		t.Helper()
		clk.Advance(advance)
		pollModelsT(e, &s)
		if got := f.hits.Load(); got != wantHits {
			t.Fatalf("%s: %d /v1/models requests, want %d", what, got, wantHits)
		}
	}

	step("first contact", 0, 1)
	if m := e.Models(); len(m.List) != 1 || m.List[0].ID != "sim-model" {
		t.Fatalf("models: %+v", m)
	}
	step("a scrape later", time.Second, 1)
	complete(t, f.sim.URL())
	step("counters grew", 20*time.Second, 1)
	if err := f.sim.Restart(); err != nil {
		t.Fatal(err)
	}
	step("after a restart", time.Second, 2)
	step("before the interval", 29*time.Second, 2)
	step("an interval after the restart", time.Second, 3)

	f.answer(http.StatusOK, `{"object":"list","data":[{"id":7}]}`)
	step("a bad body", 30*time.Second, 4)
	if m := e.Models(); len(m.List) != 1 || m.List[0].ID != "sim-model" || !strings.Contains(m.Error, "parse models") {
		t.Fatalf("after a bad body: %+v, want the last good list and the error", m)
	}
	step("retried after a poll interval", time.Second, 5)
	step("then after two", time.Second, 5)
	step("two", time.Second, 6)

	f.answer(http.StatusNotFound, "404 page not found")
	step("404", 4*time.Second, 7)
	if m := e.Models(); !m.Unavailable || m.Error != "" || len(m.List) != 1 {
		t.Fatalf("after a 404: %+v", m)
	}
	step("an interval after the 404", 30*time.Second, 7)
	step("ten intervals after", 270*time.Second, 8)
	f.answer(0, "")
	step("and again", 300*time.Second, 9)
	if m := e.Models(); m.Unavailable || m.Error != "" {
		t.Fatalf("readable again: %+v", m)
	}
}

// TestPollerFetchesModels: a running poller fetches at first contact, then
// keeps to ModelsInterval on the registry's clock however often it
// scrapes, and fetches again after the engine restarts.
func TestPollerFetchesModels(t *testing.T) {
	f := newModelsFront(t, vllmsim.Config{TimeScale: 10000})
	clk := testclock.New(time.Unix(1_700_000_000, 0))
	o := fastOpts()
	o.ModelsInterval, o.Now = 30*time.Second, clk.Now
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: f.dial()}}, o)
	e, _ := r.Get(f.dial())
	testwait.For(t, 15*time.Second, "models at first contact", func() bool { return e.Models().List != nil })
	scrapes := f.scrape.Load()
	testwait.For(t, 15*time.Second, "five more scrapes", func() bool { return f.scrape.Load() >= scrapes+5 })
	if n := f.hits.Load(); n != 1 {
		t.Fatalf("%d /v1/models requests within the interval, want 1", n)
	}
	clk.Advance(30 * time.Second)
	testwait.For(t, 15*time.Second, "a fetch an interval later", func() bool { return f.hits.Load() == 2 })

	complete(t, f.sim.URL())
	testwait.For(t, 15*time.Second, "the prefill seen", func() bool { return e.Load().PrefillRate > 0 })
	if err := f.sim.Restart(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, "a fetch after the restart", func() bool { return f.hits.Load() == 3 })
}

// TestModelsDiscoveryOff: a negative ModelsInterval never asks the engine;
// its configured names stand.
func TestModelsDiscoveryOff(t *testing.T) {
	f := newModelsFront(t, vllmsim.Config{TimeScale: 10000})
	o := Options{ModelsInterval: -1}
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: f.dial(), Models: []string{"configured"}}}, Options{ModelsInterval: -1, PollInterval: time.Hour})
	e, _ := r.Get(f.dial())
	testwait.For(t, 15*time.Second, "first scrape", func() bool { return e.Load().Known })
	var s modelsSchedule
	pollModelsT(e, &s)
	if n := f.hits.Load(); n != 0 {
		t.Fatalf("%d /v1/models requests with discovery off", n)
	}
	if m := e.Models(); !m.Configured || !m.Serves("configured") {
		t.Fatalf("models: %+v", m)
	}
}

// TestModelsURLChangeForgetsModels: a new ModelsURL may name another
// engine's list, so the old one is dropped and the new one fetched.
func TestModelsURLChangeForgetsModels(t *testing.T) {
	f := newModelsFront(t, vllmsim.Config{TimeScale: 10000})
	o := fastOpts()
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: f.dial()}}, o)
	e, _ := r.Get(f.dial())
	testwait.For(t, 15*time.Second, "models learned", func() bool { return e.Models().List != nil })
	r.Apply([]EngineConfig{{Dial: f.dial(), ModelsURL: f.srv.URL + "/elsewhere/v1/models"}}, o)
	if m := e.Models(); m.List != nil || !m.LearnedAt.IsZero() {
		t.Fatalf("after the URL changed: %+v, want nothing known", m)
	}
	testwait.For(t, 15*time.Second, "the new URL's 404", func() bool { return e.Models().Unavailable })
}
