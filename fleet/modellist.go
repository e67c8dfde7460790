package fleet

import (
	"slices"
	"strings"

	"github.com/llmgw/caddy-llmgw/upstreams"
)

// ListModels is the union of what a pool's engines serve, for the gateway's
// own GET /v1/models: one entry per id, sorted by id. pool "" means every
// engine the running config routes to (see routedDials); a pool name
// means the engines [Fleet.PoolDials] gives it, the ones admission sends
// the pool's requests to. known is false
// when no engine's models are known yet (none has answered /v1/models and
// none has configured names): an empty list would then claim the fleet
// serves nothing, which it does not know. See [UnionModels] for the rules.
//
// The running config's aliases are listed too, each as a copy of its
// served model's entry under the public name, when the pool serves that
// model: SDKs that check a name against the list accept the alias. An
// alias shadows a model of the same name that engines serve, as requests
// for it go to the served model.
func (f *Fleet) ListModels(pool string) (list []upstreams.ServedModel, known bool) {
	dials := f.routedDials()
	if pool != "" {
		dials = f.PoolDials(pool)
	}
	var engines []*upstreams.Engine
	for _, d := range dials {
		if e, ok := f.registry.Get(d); ok {
			engines = append(engines, e)
		}
	}
	sets := make([]upstreams.ServedModels, len(engines))
	for i, e := range engines {
		sets[i] = e.Models()
	}
	list, known = UnionModels(sets)
	if m := f.aliases.Load(); m != nil && len(*m) > 0 {
		list = WithAliases(list, *m)
	}
	return list, known
}

// routedDials are the engines the running config routes to, over every
// pool: those it configures, and those its proxies offered their policies
// (engines found by DNS among them); every engine the registry knows when
// neither is known yet. An engine a reload removed lingers in the registry
// until idle_ttl, for requests still on their way to it, but is in
// neither list.
func (f *Fleet) routedDials() []string {
	f.mu.Lock()
	var dials []string
	for _, ds := range f.pools {
		dials = append(dials, ds...)
	}
	f.mu.Unlock()
	var all []string
	for _, e := range f.registry.Engines() {
		all = append(all, e.Dial())
		if e.Config().Static {
			dials = append(dials, e.Dial())
		}
	}
	if len(dials) == 0 {
		return all
	}
	slices.Sort(dials)
	return slices.Compact(dials)
}

// WithAliases is list, sorted by id, with an entry for each alias whose
// served model list holds: the served model's entry (root, parent and
// context length) under the alias's name, replacing any entry of that
// name. list is not modified; it is returned itself when no alias applies.
func WithAliases(list []upstreams.ServedModel, aliases map[string]string) []upstreams.ServedModel {
	byID := make(map[string]int, len(list))
	for i, m := range list {
		byID[m.ID] = i
	}
	var out []upstreams.ServedModel
	for public, served := range aliases {
		i, ok := byID[served]
		if !ok {
			continue // not served by this pool: the alias would 404
		}
		if out == nil {
			out = slices.Clone(list)
		}
		entry := list[i]
		entry.ID = public
		if j, shadowed := byID[public]; shadowed {
			out[j] = entry
		} else {
			out = append(out, entry)
		}
	}
	if out == nil {
		return list
	}
	slices.SortFunc(out, func(a, b upstreams.ServedModel) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// UnionModels merges engines' model lists, given in a stable order (the
// registry's, by dial), into one entry per id sorted by id. known is false
// when no set's List is known (nil).
//
//   - An entry the engines discovered wins over a configured name, and the
//     first discovered entry gives the id's Root and Parent: adapters keep
//     their parent. A configured-only name has Root = ID, as vLLM reports a
//     model served under its own path.
//   - An adapter's MaxModelLen, which vLLM leaves out, is its parent's on the
//     same engine: an adapter runs with the base model's context.
//   - Where engines disagree on MaxModelLen the smallest known one is kept:
//     a request to the id may go to any engine serving it, so it must fit
//     every one of them. 0 means no engine says.
func UnionModels(sets []upstreams.ServedModels) (list []upstreams.ServedModel, known bool) {
	byID := make(map[string]*unionEntry)
	for _, s := range sets {
		if s.List == nil {
			continue
		}
		known = true
		for _, m := range withAdapterLengths(s.List) {
			if s.Configured {
				m.Root = m.ID
			}
			u, ok := byID[m.ID]
			if !ok {
				byID[m.ID] = &unionEntry{ServedModel: m, discovered: !s.Configured}
				continue
			}
			u.merge(m, !s.Configured)
		}
	}
	list = make([]upstreams.ServedModel, 0, len(byID))
	for _, u := range byID {
		list = append(list, u.ServedModel)
	}
	slices.SortFunc(list, func(a, b upstreams.ServedModel) int { return strings.Compare(a.ID, b.ID) })
	return list, known
}

// unionEntry is one id's merged entry, and whether an engine discovered it.
type unionEntry struct {
	upstreams.ServedModel
	discovered bool
}

// merge folds another engine's entry for the same id into u.
func (u *unionEntry) merge(m upstreams.ServedModel, discovered bool) {
	if discovered && !u.discovered {
		u.Root, u.Parent, u.discovered = m.Root, m.Parent, true
	}
	if m.MaxModelLen > 0 && (u.MaxModelLen == 0 || m.MaxModelLen < u.MaxModelLen) {
		u.MaxModelLen = m.MaxModelLen
	}
}

// withAdapterLengths is list with each adapter lacking a MaxModelLen given
// its parent's from the same list. list is shared by the engine's
// snapshots, so it is copied rather than modified, and only when needed.
func withAdapterLengths(list []upstreams.ServedModel) []upstreams.ServedModel {
	var out []upstreams.ServedModel
	var lengths map[string]int // id -> MaxModelLen, built at the first adapter
	for i, m := range list {
		if m.Parent == "" || m.MaxModelLen > 0 {
			continue
		}
		if lengths == nil {
			lengths = make(map[string]int, len(list))
			for _, p := range list {
				lengths[p.ID] = p.MaxModelLen
			}
		}
		if n := lengths[m.Parent]; n > 0 {
			if out == nil {
				out = slices.Clone(list)
			}
			out[i].MaxModelLen = n
		}
	}
	if out == nil {
		return list
	}
	return out
}
