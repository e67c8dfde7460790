package vllmsim

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// vLLM's sleep mode (vllm/entrypoints/serve/dev endpoints, on with
// VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode): POST /sleep?level=1|2,
// POST /wake_up, GET /is_sleeping, and the vllm:engine_sleep_state gauge
// (vllm/v1/metrics/loggers.py). AsyncLLM.sleep first tries to reset the
// prefix cache, which publishes AllBlocksCleared only when no block is in
// use, then discards the KV cache (level 1 also offloads the weights,
// level 2 discards them) without any further event. While asleep, the
// endpoints that need the weights answer 503 (docs/features/sleep_mode.md);
// /metrics, /tokenize, /v1/models and /health keep working.

// errAsleep fails the requests in flight when the engine goes to sleep.
// vLLM leaves requests in flight while sleeping undefined; the simulator
// aborts them, so no handler waits on a scheduler that will not run them.
var errAsleep = errors.New("vllmsim: engine went to sleep")

// sleepRefused are the paths that need the model's weights, refused while
// the engine sleeps.
var sleepRefused = map[string]bool{
	"/v1/chat/completions": true, "/v1/completions": true, "/v1/responses": true, "/v1/messages": true,
	"/v1/embeddings": true, "/pooling": true, "/classify": true, "/score": true, "/v1/score": true,
	"/rerank": true, "/v1/rerank": true, "/v2/rerank": true, "/invocations": true,
}

// Sleep puts the engine to sleep at level 1 or 2, as POST /sleep does:
// an idle engine publishes AllBlocksCleared first (the prefix-cache reset
// vLLM attempts), a busy one publishes nothing; the requests in flight
// are aborted, and the KV cache is emptied either way.
func (e *Engine) Sleep(level int) error {
	if level != 1 && level != 2 {
		return fmt.Errorf("vllmsim: sleep level %d: want 1 or 2", level)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pool.resetPrefixCache() && e.pub != nil {
		e.events = append(e.events, kvEvent{kind: evCleared})
		e.flushEventsLocked(time.Now())
	}
	e.abortAllLocked(errAsleep)
	clear(e.events)
	e.events = e.events[:0]
	e.pool.reset()
	e.shownRunning, e.shownWaiting = 0, 0
	e.sleepLevel = level
	return nil
}

// WakeUp wakes the engine, as POST /wake_up does; its KV cache is empty.
// A no-op on an awake engine.
func (e *Engine) WakeUp() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sleepLevel = 0
}

// SleepLevel is 0 while the engine is awake, else its sleep level.
func (e *Engine) SleepLevel() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sleepLevel
}

// refuseAsleep answers 503 for a request that needs the weights while the
// engine sleeps, and reports whether it did.
func (e *Engine) refuseAsleep(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodPost || !sleepRefused[r.URL.Path] || e.SleepLevel() == 0 {
		return false
	}
	writeError(w, http.StatusServiceUnavailable, "The engine is sleeping; wake it up with POST /wake_up.")
	return true
}

func (e *Engine) handleSleep(w http.ResponseWriter, r *http.Request) {
	level := 1
	if s := r.URL.Query().Get("level"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid sleep level %q", s))
			return
		}
		level = n
	}
	if err := e.Sleep(level); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) handleWakeUp(w http.ResponseWriter, _ *http.Request) {
	e.WakeUp()
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) handleIsSleeping(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": e.SleepLevel() > 0})
}

// sleepStateMetric renders vllm:engine_sleep_state as vLLM does: one
// series per sleep_state, "awake" 1 exactly when the level is 0, the
// level's own series 1 while asleep.
func sleepStateMetric(labels string, level int) string {
	one := func(on bool) string {
		if on {
			return "1.0"
		}
		return "0.0"
	}
	const name = "vllm:engine_sleep_state"
	return "# HELP " + name + " Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.\n" +
		"# TYPE " + name + " gauge\n" +
		name + "{" + labels + `,sleep_state="awake"} ` + one(level == 0) + "\n" +
		name + "{" + labels + `,sleep_state="weights_offloaded"} ` + one(level == 1) + "\n" +
		name + "{" + labels + `,sleep_state="discard_all"} ` + one(level == 2) + "\n"
}
