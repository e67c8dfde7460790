package fleet

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// MaxDataParallelSize bounds an engine's data_parallel_size: each rank is
// an engine of its own in the registry and the index, with its poller and
// KV subscription.
const MaxDataParallelSize = 256

// Rank is one data-parallel rank of an engine declared with
// data_parallel_size: a routing target of its own (its gauges, KV mirror
// and admission) behind the address it shares with its siblings.
type Rank struct {
	// Dial is the shared address reverse_proxy dials.
	Dial string
	// Index is the rank's global data-parallel rank, sent to the engine in
	// the X-data-parallel-rank header.
	Index int
}

// RankKey is the engine key of rank r of the engine at dial: "dial#r". It
// names the rank in the registry, the index, the admin API and metrics.
func RankKey(dial string, r int) string { return dial + "#" + strconv.Itoa(r) }

// rankTable maps each address declared with data_parallel_size to its
// ranks' keys, and each key back to its rank. Built once per config and
// read without locks.
type rankTable struct {
	keys  map[string][]string
	ranks map[string]Rank
}

// newRankTable is the ranks of engines.
func newRankTable(engines []*EngineConfig) *rankTable {
	t := &rankTable{keys: map[string][]string{}, ranks: map[string]Rank{}}
	for _, e := range engines {
		if e == nil || e.DataParallelSize <= 1 {
			continue
		}
		for r := range e.DataParallelSize {
			k := RankKey(e.Dial, r)
			t.keys[e.Dial] = append(t.keys[e.Dial], k)
			t.ranks[k] = Rank{Dial: e.Dial, Index: r}
		}
	}
	return t
}

// Ranks returns the engine keys of the data-parallel ranks behind dial,
// rank 0 first, or nil when dial was not declared with a
// data_parallel_size above 1 (it is one engine, keyed by dial itself).
// The slice must not be modified.
func (f *Fleet) Ranks(dial string) []string {
	if t := f.ranks.Load(); t != nil {
		return t.keys[dial]
	}
	return nil
}

// RankOf returns the rank an engine key names, and false for an engine
// that is not a rank of a data-parallel engine.
func (f *Fleet) RankOf(key string) (Rank, bool) {
	if t := f.ranks.Load(); t != nil {
		r, ok := t.ranks[key]
		return r, ok
	}
	return Rank{}, false
}

// offsetEndpoint is a tcp://host:port endpoint with its port increased by
// r, as vLLM's data-parallel rank r publishes on (offset_endpoint_port);
// "" stays "".
func offsetEndpoint(ep string, r int) (string, error) {
	if ep == "" || r == 0 {
		return ep, nil
	}
	hostPort, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("endpoint %q is not tcp://host:port", ep)
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", ep, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p+r > 65535 {
		return "", fmt.Errorf("endpoint %q: port of rank %d out of range", ep, r)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+r)), nil
}

// EngineKeys is dials with every address declared with data-parallel
// ranks replaced by its ranks' keys, in order: the engines behind dials.
// It returns dials itself when none has ranks.
func (f *Fleet) EngineKeys(dials []string) []string {
	t := f.ranks.Load()
	if t == nil || len(t.keys) == 0 || !slices.ContainsFunc(dials, func(d string) bool { return t.keys[d] != nil }) {
		return dials
	}
	out := make([]string, 0, len(dials)+len(t.keys))
	for _, d := range dials {
		if ks := t.keys[d]; ks != nil {
			out = append(out, ks...)
		} else {
			out = append(out, d)
		}
	}
	return out
}
