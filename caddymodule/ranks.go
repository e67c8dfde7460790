package caddymodule

import (
	"net/http"
	"slices"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// rankHeader is the request header vLLM's API server reads to send a
// request to one data-parallel rank (its global rank) instead of choosing
// one with its internal load balancer.
const rankHeader = "X-Data-Parallel-Rank"

// expand is the routing targets of upstream u, an engine declared with
// data_parallel_size: one target per rank, keyed dial#r (the fleet's
// engine key); nil for any other upstream, which is its own target. A rank's target shares u's Host, so its requests in
// flight and passive health are u's; Select turns a picked rank back into
// u (realUpstream) before returning it, as only u is provisioned to dial.
func (p *Policy) expand(u *reverseproxy.Upstream) []*reverseproxy.Upstream {
	keys := p.fleet.Ranks(u.Dial)
	out := make([]*reverseproxy.Upstream, len(keys))
	for i, k := range keys {
		out[i] = &reverseproxy.Upstream{Host: u.Host, Dial: k, MaxRequests: u.MaxRequests}
	}
	return out
}

// engineDials are the fleet's engine keys of pool's upstreams: their dial
// addresses, each of a data-parallel engine replaced by its ranks' keys.
func (p *Policy) engineDials(pool reverseproxy.UpstreamPool) []string {
	dials := make([]string, 0, len(pool))
	for _, u := range pool {
		if u != nil {
			dials = append(dials, u.Dial)
		}
	}
	return p.fleet.EngineKeys(dials)
}

// quietestRank is, when least_conn's pick u is a rank, the rank of its
// address with the fewest of this gateway's requests in flight among
// cands and spare (where u is found): the ranks share u's Host and so its
// request count, which would send every request the fleet did not route
// to rank 0. Any other u is returned as it is.
func (p *Policy) quietestRank(u *reverseproxy.Upstream, cands, spare []*reverseproxy.Upstream) *reverseproxy.Upstream {
	if u == nil {
		return nil
	}
	r, ok := p.fleet.RankOf(u.Dial)
	if !ok {
		return u
	}
	from := cands
	if !slices.Contains(cands, u) {
		from = spare
	}
	best, bestN := u, p.inflight(u.Dial)
	for _, c := range from {
		if o, ok := p.fleet.RankOf(c.Dial); ok && o.Dial == r.Dial {
			if n := p.inflight(c.Dial); n < bestN {
				best, bestN = c, n
			}
		}
	}
	return best
}

// inflight is this gateway's requests in flight on engine key.
func (p *Policy) inflight(key string) int64 {
	if e, ok := p.fleet.Registry().Get(key); ok {
		return e.Load().Inflight
	}
	return 0
}

// realUpstream is the upstream of pool that chosen stands for: chosen
// itself, or for a rank's target the upstream of its address, with the
// rank (-1 for no rank). It is nil when the address has left the pool.
func (p *Policy) realUpstream(pool reverseproxy.UpstreamPool, chosen *reverseproxy.Upstream) (*reverseproxy.Upstream, int) {
	r, ok := p.fleet.RankOf(chosen.Dial)
	if !ok {
		return chosen, -1
	}
	for _, u := range pool {
		if u != nil && u.Dial == r.Dial {
			return u, r.Index
		}
	}
	return nil, -1
}

// setRank makes the proxied request r name the picked rank in rankHeader,
// or, when the pick is no rank (rank < 0), removes the header an earlier
// attempt of this request set: r is the clone reverse_proxy proxies, the
// same across its attempts. A header the client sent is left alone unless
// a rank was picked.
func (st *selectState) setRank(r *http.Request, rank int) {
	switch {
	case rank >= 0:
		r.Header.Set(rankHeader, strconv.Itoa(rank))
		st.rankSet = true
	case st.rankSet:
		r.Header.Del(rankHeader)
		st.rankSet = false
	}
}

// varRank holds the rankPick of a request's latest attempt when lb_policy
// llm sent it to a data-parallel rank, and is absent otherwise.
const varRank = "llm.rank"

// rankPick is the data-parallel rank a request was sent to: the address
// reverse_proxy dials and the rank's engine key behind it.
type rankPick struct{ addr, key string }

// noteRank records in r's vars the rank (rank < 0: none) the latest
// attempt picked behind address addr, whose engine key is key: reverse_proxy
// knows only the address, and servedBy must name the rank, or admission
// would move the request's reservation, its breaker outcome and its
// metrics from the rank to an engine keyed by the bare address.
func noteRank(r *http.Request, addr, key string, rank int) {
	if rank < 0 {
		caddyhttp.SetVar(r.Context(), varRank, nil)
		return
	}
	caddyhttp.SetVar(r.Context(), varRank, rankPick{addr: addr, key: key})
}
