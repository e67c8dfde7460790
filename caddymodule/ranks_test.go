package caddymodule

import (
	"context"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/fleet"
)

// TestSetRank: a pick of a rank names it in the proxied request's header,
// a later attempt's pick of another rank rewrites it, and a pick of an
// engine without ranks removes the header an earlier attempt set but
// leaves one the client sent when no rank was ever picked.
func TestSetRank(t *testing.T) {
	steps := []struct {
		name   string
		client string // the client's header, on a fresh request; "" none
		picks  []int  // the attempts' ranks (-1: an engine without ranks)
		want   string // the header after the last attempt ("" absent)
	}{
		{name: "rank", picks: []int{2}, want: "2"},
		{name: "retry on another rank", picks: []int{2, 0}, want: "0"},
		{name: "retry on an engine without ranks", picks: []int{2, -1}, want: ""},
		{name: "client header, no rank picked", client: "5", picks: []int{-1, -1}, want: "5"},
		{name: "client header overwritten by a pick", client: "5", picks: []int{1}, want: "1"},
	}
	for _, tc := range steps {
		t.Run(tc.name, func(t *testing.T) {
			r, err := http.NewRequest(http.MethodPost, "http://gw/v1/completions", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.client != "" {
				r.Header.Set("x-data-parallel-rank", tc.client)
			}
			st := &selectState{}
			for _, rank := range tc.picks {
				st.setRank(r, rank)
			}
			if got := r.Header.Get(rankHeader); got != tc.want {
				t.Fatalf("header %q, want %q", got, tc.want)
			}
		})
	}
}

// TestServedByRank: the engine that served a request is the rank lb_policy
// llm picked behind the address reverse_proxy dialled, until an attempt
// picks no rank or reverse_proxy dials another address; without a pick it
// is the address.
func TestServedByRank(t *testing.T) {
	r, err := http.NewRequest(http.MethodPost, "http://gw/v1/completions", nil)
	if err != nil {
		t.Fatal(err)
	}
	repl := caddy.NewReplacer()
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	r = r.WithContext(context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{}))
	const addr, other = "10.0.0.1:8000", "10.0.0.2:8000"
	steps := []struct {
		name    string
		dialled string
		rank    int // the attempt's pick behind addr; -1 none
		want    string
	}{
		{name: "no pick yet", dialled: addr, rank: -1, want: addr},
		{name: "rank 2", dialled: addr, rank: 2, want: fleet.RankKey(addr, 2)},
		{name: "another address dialled", dialled: other, rank: 2, want: other},
		{name: "retry on an engine without ranks", dialled: addr, rank: -1, want: addr},
	}
	for _, s := range steps {
		noteRank(r, addr, fleet.RankKey(addr, s.rank), s.rank)
		repl.Set("http.reverse_proxy.upstream.hostport", s.dialled)
		if got := servedBy(r); got != s.want {
			t.Errorf("%s: served by %q, want %q", s.name, got, s.want)
		}
	}
}

// TestQuietestRank: least_conn's pick among ranks (which share one Host,
// so it always names the first) moves to the rank of its address with the
// fewest requests in flight through the gateway; any other pick stays.
func TestQuietestRank(t *testing.T) {
	f := fleet.New(zap.NewNop(), fleet.Options{ManualScrape: true})
	t.Cleanup(f.Close)
	g := f.NewGeneration(fleet.Config{Engines: []*fleet.EngineConfig{
		{Dial: "10.0.0.1:8000", DataParallelSize: 3}, {Dial: "10.0.0.2:8000"},
	}}, zap.NewNop())
	f.Start(g)
	t.Cleanup(func() { f.Stop(g) })
	p := &Policy{fleet: f}
	ranks := p.expand(&reverseproxy.Upstream{Dial: "10.0.0.1:8000"})
	plain := &reverseproxy.Upstream{Dial: "10.0.0.2:8000"}
	busy := func(key string, n int) {
		e, ok := f.Registry().Get(key)
		if !ok {
			t.Fatalf("no engine %s", key)
		}
		for range n {
			res := e.Reserve()
			t.Cleanup(res.Done)
		}
	}
	busy("10.0.0.1:8000#0", 2)
	busy("10.0.0.1:8000#1", 1)
	cands := append([]*reverseproxy.Upstream{plain}, ranks...)
	if got := p.quietestRank(ranks[0], cands, nil); got != ranks[2] {
		t.Fatalf("picked %s, want the idle rank %s", got.Dial, ranks[2].Dial)
	}
	if got := p.quietestRank(ranks[0], cands[:3], nil); got != ranks[1] {
		t.Fatalf("without rank 2: picked %s, want %s", got.Dial, ranks[1].Dial)
	}
	if got := p.quietestRank(ranks[0], []*reverseproxy.Upstream{plain}, ranks[:2]); got != ranks[1] {
		t.Fatalf("among spare ranks: picked %s, want %s", got.Dial, ranks[1].Dial)
	}
	if got := p.quietestRank(plain, cands, nil); got != plain {
		t.Fatalf("an engine without ranks became %s", got.Dial)
	}
	if p.quietestRank(nil, cands, nil) != nil {
		t.Fatal("no pick became one")
	}
}
