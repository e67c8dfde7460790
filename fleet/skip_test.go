package fleet

import (
	"context"
	"slices"
	"testing"

	"github.com/llmgw/caddy-llmgw/routing"
)

// TestPreciseFleetSkipsApproximateMatch: when the prompt's ids are known
// and every candidate's events are live, no candidate is on the
// approximate tier, so the decision does not walk the tree; one
// candidate without live events, or unknown ids, and it does.
func TestPreciseFleetSkipsApproximateMatch(t *testing.T) {
	f, _, dials := specFleet(t, 4)
	s := DefaultSettings()
	req := chatRequest(t, nil, "a prompt")
	toks := tokens(1, 256, 1)
	f.Unrouted(req, nil).Commit(dials[0]) // the tree has something to match
	for range 3 {
		d := f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s, Tokens: toks, Explain: true})
		for i, c := range d.Scored {
			if c.Tier != routing.Precise {
				t.Fatalf("candidate %d on tier %v, want precise", i, c.Tier)
			}
		}
		d.Commit(dials[d.Index])
	}
	if n := f.approxMatches.Load(); n != 0 {
		t.Fatalf("a precise-only fleet walked the approximate tree %d times", n)
	}
	f.index.RemoveEngine(dials[3])
	if d := f.Route(context.Background(), Query{Request: req, Dials: dials, Settings: s, Tokens: toks, Explain: true}); d.Scored[3].Tier != routing.Approximate {
		t.Fatalf("the engine without events is on tier %v", d.Scored[3].Tier)
	}
	s.Tokenize = false
	f.Route(context.Background(), Query{Request: req, Dials: dials[:3], Settings: s})
	if n := f.approxMatches.Load(); n != 2 {
		t.Fatalf("the approximate tree was walked %d times, want 2 (a feedless candidate, unknown ids)", n)
	}
}

// TestTokenizeCacheHoldsBlockKeys: a repeated prompt is answered from the
// tokenize cache with its block keys, which are neither hashed again nor
// different from hashing the ids afresh, and the decision is the same.
func TestTokenizeCacheHoldsBlockKeys(t *testing.T) {
	ss := newSimSetup(t, 2, 2000)
	ctx := context.Background()
	q := Query{Request: ss.req, Dials: ss.dials, Settings: ss.s}
	first := ss.f.Route(ctx, q)
	before := ss.f.tokenizer.Load().Stats()
	d := ss.f.Route(ctx, q)
	after := ss.f.tokenizer.Load().Stats()
	if !d.Tokenize.Cached || after.Derived != before.Derived || after.Hits != before.Hits+1 {
		t.Fatalf("repeat: cached %v, derived %d -> %d, hits %d -> %d", d.Tokenize.Cached, before.Derived, after.Derived, before.Hits, after.Hits)
	}
	if d.Index != first.Index || d.Tier != first.Tier || d.Tier != routing.Precise {
		t.Fatalf("repeat decided %+v, first %+v", d.Decision, first.Decision)
	}
	want := blockKeys(ss.tokens, d.BlockSize, "", "")
	if len(want) == 0 || !slices.Equal(d.keys, want) {
		t.Fatalf("cached keys (%d) differ from the ids' keys (%d)", len(d.keys), len(want))
	}
}

// TestTokenizeCacheBlockKeysPerSalt: the same prompt under another
// cache_salt hits the same tokenize cache entry (the salt is not sent to
// /tokenize) but gets the block keys of its own salt, each time: the
// salt is part of what the cached keys are tagged with.
func TestTokenizeCacheBlockKeysPerSalt(t *testing.T) {
	ss := newSimSetup(t, 2, 2000)
	ctx := context.Background()
	for i, salt := range []string{"a", "b", "a"} {
		req := *ss.req
		req.CacheSalt = salt
		d := ss.f.Route(ctx, Query{Request: &req, Dials: ss.dials, Settings: ss.s})
		if !d.Tokenize.Cached {
			t.Fatalf("call %d (salt %q): not a tokenize cache hit", i, salt)
		}
		want := blockKeys(ss.tokens, d.BlockSize, "", salt)
		if len(want) == 0 || !slices.Equal(d.keys, want) {
			t.Fatalf("call %d (salt %q): keys (%d) are not that salt's (%d)", i, salt, len(d.keys), len(want))
		}
		if unsalted := blockKeys(ss.tokens, d.BlockSize, "", ""); slices.Equal(d.keys, unsalted) {
			t.Fatalf("call %d (salt %q): the salt changes no key", i, salt)
		}
	}
}
