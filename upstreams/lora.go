package upstreams

import (
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Bounds on what one scrape reads from vllm:lora_requests_info. The page is
// the engine's to write, and a label value may be long: an engine with more
// adapters in flight than maxLoRAAdapters is reported truncated rather than
// costing the gateway memory in proportion to what it is sent.
const (
	maxLoRAAdapters   = 1024 // per list (running, waiting)
	maxLoRANameLength = 256  // bytes; longer names are dropped
)

// LoRAState is what vLLM's vllm:lora_requests_info says about an engine's
// LoRA adapters, read from the newest series of the last successful scrape.
// It lists adapters with requests in flight, not every loaded adapter: an
// adapter that is loaded but idle is in neither list.
type LoRAState struct {
	// MaxLoRA is the engine's --max-loras (adapters in one batch); 0 when
	// the label is absent or unparsable.
	MaxLoRA int
	// Running and Waiting name the adapters with running or waiting
	// requests, each once, in the engine's order. They are shared by every
	// snapshot of one scrape: callers must not modify them.
	Running, Waiting []string
	// Truncated: a list had more than 1024 adapters, or names longer than
	// 256 bytes, and was cut.
	Truncated bool
	// Known: the last successful scrape had the series (vLLM exports it
	// only with LoRA enabled) and the engine is not stale.
	Known bool
}

// LoRA returns the engine's LoRA state from its last successful scrape.
func (e *Engine) LoRA() LoRAState {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.g.LoRA
	s.Known = s.Known && e.scraped && !e.stale
	return s
}

// loraState reads the newest series of vllm:lora_requests_info. vLLM adds a
// series for every new label set and leaves the old ones on the page, each
// valued with the time it was last set, so only the newest says what runs
// now. An absent family, or one without a usable value, is not known; that
// is no scrape error, since the series is optional.
func loraState(fam *dto.MetricFamily) LoRAState {
	var newest *dto.Metric
	best := math.Inf(-1)
	for _, m := range fam.GetMetric() {
		v, err := sampleValue(fam, m)
		if err != nil || v < best {
			continue
		}
		// On a tie the later series wins, as it was written later.
		newest, best = m, v
	}
	if newest == nil {
		return LoRAState{}
	}
	s := LoRAState{Known: true}
	if v, ok := labelValue(newest, "max_lora"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
			s.MaxLoRA = n
		}
	}
	var cut bool
	running, _ := labelValue(newest, "running_lora_adapters")
	s.Running, cut = adapterList(running)
	s.Truncated = cut
	waiting, _ := labelValue(newest, "waiting_lora_adapters")
	s.Waiting, cut = adapterList(waiting)
	s.Truncated = s.Truncated || cut
	return s
}

// adapterList splits a comma-separated adapter list, trimming blanks and
// dropping empty entries and repeats; nil when it names none. cut reports
// names dropped for the bounds.
func adapterList(v string) (names []string, cut bool) {
	if strings.TrimSpace(v) == "" {
		return nil, false
	}
	var seen map[string]struct{}
	for part := range strings.SplitSeq(v, ",") {
		name := strings.TrimSpace(part)
		if name == "" {
			continue
		}
		if len(name) > maxLoRANameLength {
			cut = true
			continue
		}
		if seen == nil {
			seen = make(map[string]struct{})
		}
		if _, dup := seen[name]; dup {
			continue
		}
		if len(names) == maxLoRAAdapters {
			cut = true
			continue
		}
		seen[name] = struct{}{}
		names = append(names, name)
	}
	return names, cut
}
