package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/openai"
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
//   - canned: the /tokenize round trip goes to a loopback server that
//     reads the request whole and answers with the prompt's ids, encoded
//     once beforehand, as vLLM writes them: the gateway's share of the
//     round trip (building the request, the HTTP exchange, decoding the
//     ids) without the engine's tokenizing, which vLLM does in its own
//     API server process;
//   - canned-new: canned, but every answer's first id is new, so no
//     answer or prompt shares its start with an earlier one: what a prompt
//     never seen before costs (its blocks match nothing either, as a new
//     prompt's would not);
//   - known: the ids are given (Query.Tokens), the decision without the
//     round trip.
func BenchmarkDecision(b *testing.B) {
	for _, prompt := range []int{2 << 10, 8 << 10, 32 << 10, 128 << 10} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("prompt=%dk/engines=%d", prompt>>10, n), func(b *testing.B) {
				canned, fresh := newCannedTokenize(b), newCannedTokenize(b)
				fresh.newFirst = true
				sets := newSimSetups(b, n, prompt, "", canned.url, fresh.url)
				canned.answer(sets[0].tokens)
				fresh.answer(sets[0].tokens)
				head, tail := splitBody(b, simChat(simWords("bench", prompt), "and now the question #"))
				for _, variant := range []struct {
					name   string
					ss     *simSetup
					tokens []uint64
				}{{"tokenize", sets[0], nil}, {"canned", sets[1], nil}, {"canned-new", sets[2], nil}, {"known", sets[0], sets[0].tokens}} {
					b.Run(variant.name, func(b *testing.B) {
						benchDecision(b, variant.ss, head, tail, variant.tokens)
					})
				}
			})
		}
	}
}

// cannedTokenize is a loopback /tokenize that answers every request with
// the same ids, after reading the request's body as an engine would; with
// newFirst, every answer's first id is one no answer had before.
type cannedTokenize struct {
	url      string
	body     atomic.Pointer[[]byte]
	newFirst bool
	calls    atomic.Uint64
}

func newCannedTokenize(tb testing.TB) *cannedTokenize {
	c := &cannedTokenize{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, 64<<20)); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body := c.body.Load()
		if body == nil {
			http.Error(w, "no answer yet", http.StatusServiceUnavailable)
			return
		}
		head, id, rest := *body, []byte(nil), []byte(nil)
		if c.newFirst {
			// The first id (after "tokens":[) becomes 10^9 + the call's
			// number, the rest as it is, written without copying it.
			i := bytes.IndexByte(head, '[') + 1
			j := i + bytes.IndexByte(head[i:], ',')
			head, id, rest = head[:i], strconv.AppendUint(nil, 1e9+c.calls.Add(1), 10), head[j:]
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(head)+len(id)+len(rest)))
		for _, part := range [][]byte{head, id, rest} {
			_, _ = w.Write(part)
		}
	}))
	tb.Cleanup(srv.Close)
	c.url = srv.URL + "/tokenize"
	return c
}

// answer sets the ids the server answers with, in vLLM's answer shape.
func (c *cannedTokenize) answer(ids []uint64) {
	b := []byte(`{"count":` + strconv.Itoa(len(ids)) + `,"max_model_len":262144,"tokens":[`)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, id, 10)
	}
	b = append(b, `],"token_strs":null}`...)
	c.body.Store(&b)
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
		req, err := openai.ParseRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		d := ss.f.Route(ctx, Query{Request: req, Dials: ss.dials, Settings: ss.s, Tokens: tokens})
		if d.Index < 0 || d.Tokenize.Err != nil || d.Tokenize.Cached {
			b.Fatalf("decision %+v, tokenize %+v", d.Decision, d.Tokenize)
		}
		d.Commit(ss.dials[d.Index])
		ds = append(ds, time.Since(t0))
	}
	reportPercentiles(b, ds)
}
