package upstreams

import (
	dto "github.com/prometheus/client_model/go"
)

// metricSleepState is vLLM's sleep-mode gauge (vllm/v1/metrics/loggers.py,
// PrometheusStatLogger): one series per engine label (DP rank) and per
// sleep_state label value, "awake" (1 awake, 0 asleep),
// "weights_offloaded" (1 at sleep level 1) and "discard_all" (1 at level 2).
// Releases before it have no such family; their engines count as awake.
const metricSleepState = "vllm:engine_sleep_state"

// Sleep levels as vLLM's POST /sleep?level= names them: level 1 offloads
// the weights to CPU memory and discards the KV cache, level 2 discards
// both.
const (
	SleepAwake          = 0
	SleepWeightsOffload = 1
	SleepDiscardAll     = 2
)

// sleepState reads vllm:engine_sleep_state into a sleep level: 0 while any
// rank behind the address is awake (or the family is absent or unreadable,
// as on releases without sleep mode), else the deepest level a rank
// reports (1 when the asleep ranks name none). A rank is asleep when its
// "awake" series is 0, or, without that series, when one of the level
// series is 1. The gauge is optional: nothing here is an error, and a
// value that is not a finite number leaves its series unread.
func sleepState(fam *dto.MetricFamily) int {
	type rank struct {
		awake, asleep bool // an "awake" series said so
		level         int
	}
	ranks := make(map[string]*rank)
	for _, m := range fam.GetMetric() {
		v, err := sampleValue(fam, m)
		if err != nil {
			continue
		}
		eng, _ := labelValue(m, "engine")
		r := ranks[eng]
		if r == nil {
			r = &rank{}
			ranks[eng] = r
		}
		state, _ := labelValue(m, "sleep_state")
		switch state {
		case "awake":
			r.awake, r.asleep = v > 0, v == 0
		case "weights_offloaded":
			if v > 0 {
				r.level = max(r.level, SleepWeightsOffload)
			}
		case "discard_all":
			if v > 0 {
				r.level = max(r.level, SleepDiscardAll)
			}
		}
	}
	level := 0
	for _, r := range ranks {
		switch {
		case r.awake:
			return SleepAwake
		case r.asleep:
			level = max(level, r.level, SleepWeightsOffload)
		case r.level > 0:
			level = max(level, r.level)
		default:
			return SleepAwake // no series of this rank says it sleeps
		}
	}
	return level
}

// Asleep reports whether the engine's last successful scrape found it in
// vLLM's sleep mode (and its gauges are not stale): it takes no requests
// and its KV cache is gone.
func (e *Engine) Asleep() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.asleepLocked()
}

// asleepLocked is Asleep with e.mu held. Stale gauges say nothing about
// sleep: a failed scrape is treated as it always was.
func (e *Engine) asleepLocked() bool { return e.scraped && !e.stale && e.g.SleepLevel > 0 }

func (r *Registry) sleepChanged(dial string, asleep bool) {
	if f := r.options().OnSleep; f != nil {
		f(dial, asleep)
	}
}
