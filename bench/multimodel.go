package main

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// The multimodel scenario (issue 37): engines that serve different base
// models, one of them with LoRA adapters, behind one route. The gateway
// learns each engine's models from its /v1/models; lb_policy llm routes a
// request only to engines serving its model, while Caddy's own policies
// pick among all of them and the engines answer 404 to a model they do
// not serve.

// ModelFleet lays out the models of a scenario's fleet: pools of engines,
// each serving one base model and its adapters.
type ModelFleet struct {
	Pools []ModelPool `json:"pools"`
	// MaxLoRAs is every engine's --max-loras: the most adapters one step's
	// batch holds, and the GPU's adapter slots.
	MaxLoRAs int `json:"max_loras,omitempty"`
	// LoRALoadSeconds is the simulated time to load an adapter into a
	// slot.
	LoRALoadSeconds float64 `json:"lora_load_seconds,omitempty"`
}

// ModelPool is Engines engines serving Model and its Adapters.
type ModelPool struct {
	Model    string   `json:"model"`
	Engines  int      `json:"engines"`
	Adapters []string `json:"adapters,omitempty"`
}

// engines is the fleet's size.
func (f *ModelFleet) engines() int {
	n := 0
	for _, p := range f.Pools {
		n += p.Engines
	}
	return n
}

// pool is the pool of engine i (engines are numbered pool after pool).
func (f *ModelFleet) pool(i int) ModelPool {
	for _, p := range f.Pools {
		if i < p.Engines {
			return p
		}
		i -= p.Engines
	}
	return ModelPool{}
}

// configure gives engine i its pool's models and the LoRA settings.
func (f *ModelFleet) configure(i int, c *vllmsim.Config) {
	p := f.pool(i)
	c.Model, c.LoRAModules = p.Model, p.Adapters
	if len(p.Adapters) > 0 {
		c.MaxLoRAs = f.MaxLoRAs
		c.LoRALoadTime = time.Duration(f.LoRALoadSeconds * float64(time.Second))
	}
}

// adapters is the set of every pool's adapter names.
func (f *ModelFleet) adapters() map[string]bool {
	out := map[string]bool{}
	for _, p := range f.Pools {
		for _, a := range p.Adapters {
			out[a] = true
		}
	}
	return out
}

// describe states the layout for the report: "3 × A (+ 6 adapters), 2 × B".
func (f *ModelFleet) describe() string {
	s := ""
	for i, p := range f.Pools {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d × `%s`", p.Engines, p.Model)
		if len(p.Adapters) > 0 {
			s += fmt.Sprintf(" (+ %d adapters)", len(p.Adapters))
		}
	}
	return s
}

// ModelStats are a multimodel run's figures beyond the summary's.
type ModelStats struct {
	// Unserved counts the requests the engines received for a model they
	// do not serve (each answered 404), summed over the engines.
	Unserved int `json:"unserved"`
	// NotFound counts the client's requests answered 404, by an engine or
	// by llm_admission.
	NotFound int `json:"not_found"`
	// AdapterRequests counts the client's requests for an adapter;
	// AdapterTTFT is the TTFT of those that completed (simulated
	// seconds).
	AdapterRequests int  `json:"adapter_requests"`
	AdapterTTFT     Pcts `json:"adapter_ttft"`
	// AdapterArrivals and AdapterInFlight sum the engines' counters of
	// the same names: adapter requests an engine serving the adapter
	// received, and of those the ones that arrived while it had requests
	// for that adapter running or waiting.
	AdapterArrivals uint64 `json:"adapter_arrivals"`
	AdapterInFlight uint64 `json:"adapter_in_flight"`
	LoRALoads       uint64 `json:"lora_loads"`
}

// InFlightShare is AdapterInFlight ÷ AdapterArrivals (0 without any).
func (m *ModelStats) InFlightShare() float64 {
	if m == nil || m.AdapterArrivals == 0 {
		return 0
	}
	return float64(m.AdapterInFlight) / float64(m.AdapterArrivals)
}

// EngineModels is what one engine counted of the models asked of it.
type EngineModels struct {
	// ByModel is Engine.RequestsByModel; Serves, Engine.Serves.
	ByModel map[string]int
	Serves  func(model string) bool
	Stats   vllmsim.Stats
}

// engineModels reads the fleet's per-engine model counters.
func engineModels(fleet *SimFleet) []EngineModels {
	out := make([]EngineModels, len(fleet.Engines))
	for i, e := range fleet.Engines {
		out[i] = EngineModels{ByModel: e.RequestsByModel(), Serves: e.Serves, Stats: e.Stats()}
	}
	return out
}

// modelStats sums the engines' counters and the client's records (of
// sessions, whose models they are) into a run's ModelStats; adapters
// names the adapters, timeScale converts TTFT to simulated seconds.
func modelStats(engines []EngineModels, recs []Record, sessions []Session, adapters map[string]bool, timeScale float64) *ModelStats {
	st := &ModelStats{}
	for _, e := range engines {
		for model, n := range e.ByModel {
			if !e.Serves(model) {
				st.Unserved += n
			}
		}
		st.AdapterArrivals += e.Stats.AdapterArrivals
		st.AdapterInFlight += e.Stats.AdapterArrivalsInFlight
		st.LoRALoads += e.Stats.LoRALoads
	}
	var ttft []float64
	for i := range recs {
		r := &recs[i]
		if r.Status == http.StatusNotFound {
			st.NotFound++
		}
		if r.Session < 0 || r.Session >= len(sessions) || !adapters[sessions[r.Session].Model] {
			continue
		}
		st.AdapterRequests++
		if r.OK() {
			ttft = append(ttft, r.TTFT.Seconds()*timeScale)
		}
	}
	st.AdapterTTFT = percentiles(ttft)
	return st
}

// renderMultiModel writes the multimodel scenario's table: per policy the
// client's figures, the requests sent to engines that do not serve their
// model, and how adapter requests were placed.
func renderMultiModel(b *strings.Builder, q *QualityResult, qw QualityWorkload) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	name := qw.Spec.Name
	w("### %s\n\n%s\n\n", name, qw.Scenario.Desc)
	w("| rate | policy | hit rate | TTFT p50 | p90 | adapter TTFT p90 | completed | 404 | 503 | failed | sent to an engine not serving the model | adapter requests joining their adapter in flight | LoRA loads | sim lag |\n")
	w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range q.rates(name) {
		for _, pol := range q.Params.Policies {
			r := q.at(name, pol.Name, x)
			if r == nil || r.Models == nil {
				continue
			}
			s, m := r.Summary, r.Models
			w("| %.1f/s (%g×) | `%s` | %.1f%% | %s | %s | %s | %d/%d | %d | %d | %d | %d of %d | %s | %d | %s |\n",
				r.Rate, x, pol.Name, s.HitRate*100, secs(s.TTFT.P50), secs(s.TTFT.P90), secs(m.AdapterTTFT.P90),
				s.OK, s.Requests, m.NotFound, s.Rejected, s.Errors+s.Timeouts, m.Unserved, s.Requests, inFlightText(m), m.LoRALoads, lagText(r, q.Params))
		}
	}
	w("\n")
	if qw.Scenario.Why != "" {
		w("Why: %s\n\n", qw.Scenario.Why)
	}
}

// inFlightText is "61.2% (88 of 144)": the adapter requests that arrived
// where their adapter was running or waiting.
func inFlightText(m *ModelStats) string {
	if m.AdapterArrivals == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%% (%d of %d)", m.InFlightShare()*100, m.AdapterInFlight, m.AdapterArrivals)
}

// loraGoal is issue 37's LoRA figure for a multimodel scenario at rate
// x: the share of adapter requests that joined their adapter in flight
// under `llm` (the goal: ≥ 90%) and under `least_conn` in the same run,
// and the requests each policy sent to engines not serving their model.
func loraGoal(q *QualityResult, name string, x float64) string {
	llm := q.at(name, "llm", x)
	if llm == nil || llm.Models == nil {
		return ""
	}
	met := "below"
	if llm.Models.InFlightShare() >= 0.9 {
		met = "meets"
	}
	line := fmt.Sprintf("%s at %.1f req/s (%g× cap₀): %s of `llm`'s adapter requests arrived where their adapter was running or waiting (%s the goal of ≥ 90%%)",
		name, llm.Rate, x, inFlightText(llm.Models), met)
	if lc := q.at(name, "least_conn", x); lc != nil && lc.Models != nil {
		line += fmt.Sprintf(", `least_conn` %s", inFlightText(lc.Models))
	}
	var sent []string
	for _, pol := range q.Params.Policies {
		if r := q.at(name, pol.Name, x); r != nil && r.Models != nil {
			sent = append(sent, fmt.Sprintf("`%s` %d of %d", pol.Name, r.Models.Unserved, r.Summary.Requests))
		}
	}
	return line + "; requests sent to an engine not serving their model: " + strings.Join(sent, ", ")
}
