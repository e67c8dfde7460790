package upstreams

import (
	"maps"
	"math"
	"slices"
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

// AdapterStanding is where an engine stands for one LoRA adapter's next
// request, as far as this gateway knows: its last scrape's
// vllm:lora_requests_info, and the requests for the adapter this gateway
// sent it since (which that scrape cannot show).
type AdapterStanding struct {
	// Running: the adapter's requests run there, or this gateway sent
	// one since the last scrape's epoch began.
	Running bool
	// Waiting: the adapter's requests wait there (and none runs).
	Waiting bool
	// FreeSlot: fewer adapters are in flight there than its max_lora, or
	// its LoRA state or max_lora is unknown: the adapter would get a
	// slot without waiting for another adapter's requests to end.
	FreeSlot bool
}

// SentAdapter records that this gateway sends the engine a request for
// LoRA adapter name, so that routing counts the adapter as running there
// until a scrape shows the engine's own view ([Engine.Adapter]). At most
// maxLoRAAdapters adapters are remembered per engine: sends a scrape has
// seen are forgotten first, and a send past the bound is not recorded.
func (e *Engine) SentAdapter(name string) {
	if name == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sentLoRA == nil {
		e.sentLoRA = make(map[string]uint64)
	}
	if _, ok := e.sentLoRA[name]; !ok && len(e.sentLoRA) >= maxLoRAAdapters {
		maps.DeleteFunc(e.sentLoRA, func(_ string, epoch uint64) bool { return epoch < e.dropBelow })
		if len(e.sentLoRA) >= maxLoRAAdapters {
			return
		}
	}
	e.sentLoRA[name] = e.epoch
}

// Adapter returns where the engine stands for adapter name (see
// [AdapterStanding]).
func (e *Engine) Adapter(name string) AdapterStanding {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.g.LoRA
	known := l.Known && e.scraped && !e.stale
	if !known {
		l = LoRAState{}
	}
	epoch, sent := e.sentLoRA[name]
	unseen := sent && epoch >= e.dropBelow // sent since the last scrape's epoch began
	st := AdapterStanding{
		Running: unseen || slices.Contains(l.Running, name),
		Waiting: slices.Contains(l.Waiting, name),
	}
	if !known || l.MaxLoRA == 0 {
		st.FreeSlot = true
		return st
	}
	busy := len(l.Running)
	for other, epoch := range e.sentLoRA {
		if epoch >= e.dropBelow && !slices.Contains(l.Running, other) {
			busy++
		}
	}
	st.FreeSlot = busy < l.MaxLoRA
	return st
}
