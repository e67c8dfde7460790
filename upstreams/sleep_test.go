package upstreams

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// sleepStatePage renders vllm:engine_sleep_state for one engine label at
// a sleep level as vLLM's PrometheusStatLogger does: three series, one per
// sleep_state, "awake" 1 exactly when the level is 0.
func sleepStatePage(engine string, level int) string {
	b := func(on bool) int {
		if on {
			return 1
		}
		return 0
	}
	s := "# HELP vllm:engine_sleep_state Engine sleep state\n# TYPE vllm:engine_sleep_state gauge\n"
	for _, st := range []struct {
		name string
		on   bool
	}{{"awake", level == 0}, {"weights_offloaded", level == 1}, {"discard_all", level == 2}} {
		s += fmt.Sprintf("vllm:engine_sleep_state{engine=%q,model_name=\"m\",sleep_state=%q} %d.0\n", engine, st.name, b(st.on))
	}
	return s
}

// TestParseSleepState: the gauge is read per rank; an address is asleep
// only when no rank is awake; an absent or unusable gauge is awake.
func TestParseSleepState(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		want  int
	}{
		{"absent (vLLM before sleep mode)", "", 0},
		{"awake", sleepStatePage("0", 0), 0},
		{"level 1", sleepStatePage("0", 1), 1},
		{"level 2", sleepStatePage("0", 2), 2},
		{"two ranks asleep", sleepStatePage("0", 1) + sleepStatePage("1", 2)[len("# HELP vllm:engine_sleep_state Engine sleep state\n# TYPE vllm:engine_sleep_state gauge\n"):], 2},
		{"one rank of two awake", sleepStatePage("0", 1) + sleepStatePage("1", 0)[len("# HELP vllm:engine_sleep_state Engine sleep state\n# TYPE vllm:engine_sleep_state gauge\n"):], 0},
		{"awake series only, 0", "vllm:engine_sleep_state{sleep_state=\"awake\"} 0\n", 1},
		{"level series only", "vllm:engine_sleep_state{sleep_state=\"discard_all\"} 1\n", 2},
		{"no sleep_state label", "vllm:engine_sleep_state 0\n", 0},
		{"NaN awake", "vllm:engine_sleep_state{sleep_state=\"awake\"} NaN\n", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var scratch []byte
			g, err := parseGauges([]byte(prefillPage(tc.extra)), &scratch)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if g.SleepLevel != tc.want {
				t.Fatalf("SleepLevel = %d, want %d", g.SleepLevel, tc.want)
			}
		})
	}
}

// sleepEvents records OnSleep calls.
type sleepEvents struct {
	mu  sync.Mutex
	got []bool
}

func (s *sleepEvents) add(_ string, asleep bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, asleep)
}

func (s *sleepEvents) list() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bool(nil), s.got...)
}

// TestPollerSleepTransitions: a real poller against an engine that goes
// to sleep and wakes: OnSleep fires once per transition, Load and Free
// show the state, and a gauge that goes stale while asleep is treated as
// any stale engine.
func TestPollerSleepTransitions(t *testing.T) {
	f := newFakeEngine(t)
	f.set(1, 0, 0.2)
	f.mu.Lock()
	f.sleepGauge = true
	f.mu.Unlock()
	var ev sleepEvents
	o := fastOpts()
	o.OnSleep = ev.add
	r := NewRegistry(o)
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: f.dial(), MaxInflight: 10}}, o)
	e, _ := r.Get(f.dial())
	testwait.For(t, 15*time.Second, "first scrape", func() bool { return e.Load().Known })
	if l := e.Load(); l.Asleep || l.SleepLevel != 0 {
		t.Fatalf("awake engine reads asleep: %+v", l)
	}
	if free, known := e.Free(0.9); free != 9 || !known {
		t.Fatalf("Free awake = %d, %v; want 9, true", free, known)
	}

	setSleep := func(level int) {
		f.mu.Lock()
		f.sleep = level
		f.mu.Unlock()
	}
	setSleep(1)
	testwait.For(t, 15*time.Second, "asleep", e.Asleep)
	if l := e.Load(); !l.Asleep || l.SleepLevel != 1 {
		t.Fatalf("load asleep: %+v", l)
	}
	if free, known := e.Free(0.9); free != 0 || !known {
		t.Fatalf("Free asleep = %d, %v; want 0, true", free, known)
	}
	testwait.For(t, 15*time.Second, "OnSleep(true)", func() bool { return len(ev.list()) == 1 })

	// Stale while asleep: not asleep as far as callers know (a failed
	// scrape is treated as always), and no transition is announced.
	f.setMode(mode500)
	testwait.For(t, 15*time.Second, "stale", func() bool { return e.Load().Stale })
	if e.Asleep() {
		t.Fatal("a stale engine reads asleep")
	}
	f.setMode(modeOK)
	testwait.For(t, 15*time.Second, "recovered asleep", e.Asleep)

	setSleep(0)
	testwait.For(t, 15*time.Second, "awake again", func() bool { return !e.Asleep() })
	testwait.For(t, 15*time.Second, "OnSleep(false)", func() bool { return len(ev.list()) == 2 })
	if got := ev.list(); !got[0] || got[1] {
		t.Fatalf("OnSleep calls = %v, want [true false]", got)
	}
}

// TestManualScrapeSleep: callers that scrape themselves report the level
// through Gauges, with the same hooks.
func TestManualScrapeSleep(t *testing.T) {
	var ev sleepEvents
	r := NewRegistry(Options{ManualScrape: true, OnSleep: ev.add})
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: "a:1", MaxInflight: 4}}, Options{ManualScrape: true, OnSleep: ev.add})
	e, _ := r.Get("a:1")
	for _, level := range []int{0, 2, 2, 0, 0} {
		e.StartScrape()(Gauges{SleepLevel: level})
		if got := e.Load().SleepLevel; got != level {
			t.Fatalf("SleepLevel = %d, want %d", got, level)
		}
	}
	if got := ev.list(); len(got) != 2 || !got[0] || got[1] {
		t.Fatalf("OnSleep calls = %v, want [true false]", got)
	}
}
