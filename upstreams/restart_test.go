package upstreams

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestScrapeSeesRestart: a scrape after the engine restarted (its
// cumulative counters went down) calls OnRestart, once and before that
// scrape's OnUpdate; the first scrape and scrapes of counters that only
// grew do not.
func TestScrapeSeesRestart(t *testing.T) {
	sim, err := vllmsim.Start(context.Background(), vllmsim.Config{TimeScale: 10000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	var restarts, updates atomic.Int64
	var updatesAtRestart atomic.Int64
	r := NewRegistry(Options{
		OnUpdate:  func(string) { updates.Add(1) },
		OnRestart: func(string) { restarts.Add(1); updatesAtRestart.Store(updates.Load()) },
	})
	defer r.Close()
	e := r.Ensure(sim.Addr())

	pollOnceT(e) // the first sample: nothing to compare with
	complete(t, sim.URL())
	pollOnceT(e) // the counters grew
	if n := restarts.Load(); n != 0 {
		t.Fatalf("OnRestart called %d times before any restart", n)
	}
	if l := e.Load(); !l.Known || l.PrefillRate <= 0 {
		t.Fatalf("the engine's prefill counters were not read: %+v", l)
	}

	if err := sim.Restart(); err != nil {
		t.Fatal(err)
	}
	before := updates.Load()
	pollOnceT(e)
	if n := restarts.Load(); n != 1 {
		t.Fatalf("after a restart: OnRestart called %d times, want 1", n)
	}
	if got := updatesAtRestart.Load(); got != before {
		t.Errorf("OnRestart came after the scrape's OnUpdate (updates %d, want %d)", got, before)
	}
	pollOnceT(e)
	complete(t, sim.URL())
	pollOnceT(e)
	if n := restarts.Load(); n != 1 {
		t.Errorf("scrapes of the new process: OnRestart called %d times in all, want 1", n)
	}
}

// complete runs one short completion on the engine at base.
func complete(t *testing.T, base string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/completions",
		strings.NewReader(`{"model":"sim-model","prompt":"`+strings.Repeat("hello ", 64)+`","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Close = true // no idle connection left behind for goleak
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d %.200s", res.StatusCode, body)
	}
}
