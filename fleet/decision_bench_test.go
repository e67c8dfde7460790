package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/admission"
)

// BenchmarkDecision is one request's whole routing decision, body in to
// upstream chosen, as the gateway makes it per request: admission's
// ParseRequest of the body, Route, and Routed (the approximate tree's
// insert, the speculative entries). The fleet is subscribed to n simulated
// engines on loopback whose mirrors, filled from their own KV events, hold
// the prompt's whole prefix (every block has every engine's bit: the most
// work for the index). Every body is new (a counter in the last message),
// as in the overhead bench, so the tokenize cache never hits.
//
//   - tokenize: the prompt's ids come from a /tokenize round trip to one
//     of the engines (the simulator's own tokenizing runs in this process
//     and is counted too);
//   - known: the ids are given (Query.Tokens), the decision without the
//     round trip.
func BenchmarkDecision(b *testing.B) {
	for _, prompt := range []int{2 << 10, 8 << 10, 32 << 10, 128 << 10} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("prompt=%dk/engines=%d", prompt>>10, n), func(b *testing.B) {
				ss := newSimSetup(b, n, prompt)
				head, tail := splitBody(b, simChat(simWords("bench", prompt), "and now the question #"))
				for _, variant := range []struct {
					name   string
					tokens []uint64
				}{{"tokenize", nil}, {"known", ss.tokens}} {
					b.Run(variant.name, func(b *testing.B) {
						benchDecision(b, ss, head, tail, variant.tokens)
					})
				}
			})
		}
	}
}

// splitBody splits body around its one '#', where each request's counter
// goes.
func splitBody(tb testing.TB, body string) (head, tail []byte) {
	tb.Helper()
	h, t, ok := strings.Cut(body, "#")
	if !ok {
		tb.Fatal("no # in the body")
	}
	return []byte(h), []byte(t)
}

func benchDecision(b *testing.B, ss *simSetup, head, tail []byte, tokens []uint64) {
	ctx := context.Background()
	body := make([]byte, 0, len(head)+len(tail)+20)
	ds := make([]time.Duration, 0, 1<<16)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		body = append(strconv.AppendInt(append(body[:0], head...), int64(i), 10), tail...)
		t0 := time.Now()
		req, err := admission.ParseRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		d := ss.f.Route(ctx, Query{Request: req, Dials: ss.dials, Settings: ss.s, Tokens: tokens})
		if d.Index < 0 || d.Tokenize.Err != nil || d.Tokenize.Cached {
			b.Fatalf("decision %+v, tokenize %+v", d.Decision, d.Tokenize)
		}
		ss.f.Routed(req, d, ss.dials[d.Index])
		ds = append(ds, time.Since(t0))
	}
	reportPercentiles(b, ds)
}
