package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/localtok"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// ReasonModelNotServed is what an explained routing decision says of a
// candidate that does not serve the request's model.
const ReasonModelNotServed = "model_not_served"

// maxModelGates bounds the admission gates one pool splits into by the
// engines its models are served by (see [Fleet.ModelGate]).
const maxModelGates = 64

// Serving returns the candidates among dials that may serve model: those
// whose model list (discovered, else configured) includes it — a base
// model's, an alias's or a LoRA adapter's id — and those whose models are
// unknown, which may serve anything (fail open: an engine that hides
// /v1/models still gets requests). One exception: an engine that joined
// after another candidate's models were known to include model, and whose
// own are pending (see [upstreams.ModelStanding]: its first poll has not
// fetched them yet), is left out until they are known, so that an engine
// joining a running fleet gets no requests for models it may not serve.
// Engines that start together are not held back by each other's first
// poll. notFound reports that dials is not empty and every one of them
// lists its models without model: no engine of the pool can serve the
// request, and waiting will not change that until an engine's models do.
//
// A request without a model ("") may go anywhere. When nothing is left
// out, dials itself is returned, so the common single-model fleet
// allocates nothing; otherwise a new slice, in dials' order.
func (f *Fleet) Serving(model string, dials []string) (serving []string, notFound bool) {
	mask := f.servingMask(model, dials)
	if mask == nil {
		return dials, false
	}
	serving = make([]string, 0, len(dials))
	for i, d := range dials {
		if mask[i] {
			serving = append(serving, d)
		}
	}
	return serving, len(serving) == 0
}

// standingOf is how engine dial stands for model. An engine the registry
// has not seen yet is pending, added now: its poller starts on first use.
func (f *Fleet) standingOf(dial, model string) upstreams.ModelStanding {
	if e, ok := f.registry.Get(dial); ok {
		return e.ModelStanding(model)
	}
	return upstreams.ModelStanding{Pending: true, Added: f.now()}
}

// servingMask is, for each of dials, whether it may serve model (see
// Serving); nil when every one may, the common case, which allocates
// nothing for up to 16 dials.
func (f *Fleet) servingMask(model string, dials []string) []bool {
	if model == "" {
		return nil
	}
	var buf [16]upstreams.ModelStanding
	st := buf[:0]
	if len(dials) > len(buf) {
		st = make([]upstreams.ModelStanding, 0, len(dials))
	}
	var servedSince time.Time // the earliest a candidate was known to serve model
	for _, d := range dials {
		s := f.standingOf(d, model)
		st = append(st, s)
		if s.Serves && (servedSince.IsZero() || s.KnownSince.Before(servedSince)) {
			servedSince = s.KnownSince
		}
	}
	var mask []bool
	for i, s := range st {
		joiner := s.Pending && !servedSince.IsZero() && servedSince.Before(s.Added)
		if s.Serves || (!s.Known && !joiner) {
			continue
		}
		if mask == nil {
			mask = make([]bool, len(dials))
			for j := range mask {
				mask[j] = true
			}
		}
		mask[i] = false
	}
	return mask
}

// TryReserveModel is [Fleet.TryReserve] among the candidates of dials that
// may serve model (see Serving): capacity counts per model, so a request
// for a model whose engines are full is not admitted because another
// model's engines are idle. When none may serve it, nothing is reserved,
// and nothing fails open either: the request cannot be served.
func (f *Fleet) TryReserveModel(model string, dials []string, lim Limits) (res *upstreams.Reservation, failOpen, ok bool) {
	serving, notFound := f.Serving(model, dials)
	if notFound {
		return nil, false, false
	}
	return f.TryReserve(serving, lim)
}

// ModelGate is the admission gate for requests that may go only to
// serving, among the pool's engines dials (see Serving). A gate admits
// head of line, so requests for a model whose engines are full would hold
// back, behind them, the requests for a model whose engines have room:
// such requests get a gate of their own, one per set of engines (not per
// model name, so that made-up names add none). Requests that may go to
// every engine of the pool, and any beyond maxModelGates sets, use the
// pool's gate.
func (f *Fleet) ModelGate(pool string, dials, serving []string, cfg admission.Config) *admission.Gate {
	if len(serving) == len(dials) || len(serving) == 0 {
		return f.Gate(pool, cfg)
	}
	key := pool + " [" + strings.Join(serving, " ") + "]"
	f.mu.Lock()
	g, ok := f.gates[key]
	if !ok && f.modelGates[pool] < maxModelGates {
		if f.modelGates == nil {
			f.modelGates = make(map[string]int)
		}
		f.modelGates[pool]++
		g = admission.NewGateClock(cfg, f.now)
		f.gates[key] = g
	}
	f.mu.Unlock()
	switch {
	case g == nil:
		return f.Gate(pool, cfg)
	case ok:
		g.SetConfig(cfg) // outside f.mu, as in Gate
	}
	return g
}

// OtherModel is the model label of a request for a model the fleet does
// not know (see [Fleet.ModelLabel]).
const OtherModel = "other"

// ModelLabel is model as a metric label: the name itself when an engine
// serves it (a base model, alias or adapter, as discovered or configured)
// or a local tokenizer is configured for it, "" for a request without
// one, and OtherModel for anything else. Clients choose the name, so a
// label of it as sent would let them add series without bound.
func (f *Fleet) ModelLabel(model string) string {
	if model == "" || f.registry.AnyServes(model) {
		return model
	}
	if names := f.tokNames.Load(); names != nil {
		if _, ok := (*names)[model]; ok {
			return model
		}
	}
	return OtherModel
}

// noteTokenizerNames records the models of cfgs (localtok.AnyModel
// names none) for ModelLabel.
func (f *Fleet) noteTokenizerNames(cfgs []*TokenizerConfig) {
	names := make(map[string]struct{}, len(cfgs))
	for _, c := range cfgs {
		if c != nil && c.Model != localtok.AnyModel {
			names[c.Model] = struct{}{}
		}
	}
	f.tokNames.Store(&names)
	ks := imageKeyings(cfgs)
	f.imageTokens.Store(&ks)
}

// maxAliasLength bounds an alias's names, as the engines' model ids are
// bounded when discovered.
const maxAliasLength = 1024

// ValidateAliases checks a map of public model names to served ones: both
// names non-empty, without surrounding blanks and of bounded length; no
// alias naming itself; and no chains (a served name that is itself an
// alias), which would make what a request reaches depend on how many
// times it is resolved. Errors name the alias at fault, first in sorted
// order so that the message is stable.
func ValidateAliases(aliases map[string]string) error {
	for _, public := range slices.Sorted(maps.Keys(aliases)) {
		served := aliases[public]
		for _, n := range []string{public, served} {
			switch {
			case n == "" || strings.TrimSpace(n) != n:
				return fmt.Errorf("alias %q -> %q: model name %q is empty or has surrounding blanks", public, served, n)
			case len(n) > maxAliasLength:
				return fmt.Errorf("alias %q -> %q: model name of %d bytes, at most %d", public, served, len(n), maxAliasLength)
			}
		}
		if public == served {
			return fmt.Errorf("alias %q names itself", public)
		}
		if next, ok := aliases[served]; ok {
			return fmt.Errorf("alias %q -> %q -> %q: aliases do not chain; name the served model %q directly", public, served, next, next)
		}
	}
	return nil
}

// ResolveAlias returns the served name of model when the running config
// makes it an alias (a public name for a model the engines serve under
// another, for renames and canaries). ok is false for any other name,
// which is used as sent.
func (f *Fleet) ResolveAlias(model string) (served string, ok bool) {
	m := f.aliases.Load()
	if m == nil || len(*m) == 0 || model == "" {
		return "", false
	}
	served, ok = (*m)[model]
	return served, ok
}
