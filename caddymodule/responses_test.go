package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// responsesBody is a /v1/responses request, following prev when set.
func responsesBody(input, prev string, stream bool, extra map[string]any) string {
	m := map[string]any{"model": "sim-model", "input": input, "max_output_tokens": 4, "stream": stream}
	if prev != "" {
		m["previous_response_id"] = prev
	}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// responseIDOf is the response id of a /v1/responses answer: the JSON
// body's id, or a stream's response.created event's response.id.
func responseIDOf(t testing.TB, r reply) string {
	t.Helper()
	var v struct {
		ID       string `json:"id"`
		Response struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	for _, ev := range sseDataOrBody(r.body) {
		if json.Unmarshal([]byte(ev), &v) == nil && v.ID+v.Response.ID != "" {
			return v.ID + v.Response.ID
		}
	}
	t.Fatalf("no response id in %.300s", r.body)
	return ""
}

// sseDataOrBody is the data payloads of an SSE body, or the body itself.
func sseDataOrBody(body string) []string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "data: "); ok {
			out = append(out, d)
		}
	}
	if out == nil {
		out = []string{body}
	}
	return out
}

// responsesCounts are the /v1/responses requests each engine received.
func responsesCounts(engines []*vllmsim.Engine) []uint64 {
	out := make([]uint64, len(engines))
	for i, e := range engines {
		out[i] = e.Stats().RequestsByEndpoint["/v1/responses"]
	}
	return out
}

// TestPreviousResponseAffinity is issue 38's previous_response_id figure:
// 20 chained follow-ups, streamed and not, all reach the engine that
// stored the response they follow, and all succeed; a response stored
// with store:false is not recorded (its follow-up is routed as unknown);
// while the storing engine is drained, and once it restarts, a follow-up
// gets the gateway's own 404, vLLM's body, without reaching any engine.
func TestPreviousResponseAffinity(t *testing.T) {
	engines := startEngines(t, 3, vllmsim.Config{TimeScale: 50})
	gateway{patient: true, engines: kvEngines(engines...), policy: "\t\t\tdebug_headers\n"}.load(t)
	waitKV(t, engines...)
	url := "http://" + gatewayAddr + "/v1/responses"
	pinnedBefore := metricValue(t, "llmgw_previous_response_total", `outcome="pinned"`)
	first := mustSend(t, url, responsesBody("Tell me about the sea. "+words("wave", 50), "", false, nil), nil)
	if first.status != http.StatusOK {
		t.Fatalf("first: status %d: %.300s", first.status, first.body)
	}
	holder, id := first.upstream, responseIDOf(t, first)
	const n = 20
	for i := range n {
		r := send(context.Background(), url, responsesBody(fmt.Sprintf("and then %d? %s", i, words(fmt.Sprint("t", i), 20)), id, i%2 == 0, nil), nil)
		if r.status != http.StatusOK || r.errEvent != "" || r.upstream != holder {
			t.Fatalf("follow-up %d of %s: status %d from %s (stored on %s), error event %q: %.300s",
				i, id, r.status, r.upstream, holder, r.errEvent, r.body)
		}
		id = responseIDOf(t, r)
	}
	counts := responsesCounts(engines)
	for i, e := range engines {
		want, stored := uint64(0), 0
		if e.Addr() == holder {
			want, stored = n+1, n+1
		}
		if counts[i] != want || e.Stats().ResponsesStored != stored {
			t.Errorf("engine %s: %d /v1/responses requests, %d stored; want %d and %d (holder %s)",
				e.Addr(), counts[i], e.Stats().ResponsesStored, want, stored, holder)
		}
	}
	if d := metricValue(t, "llmgw_previous_response_total", `outcome="pinned"`) - pinnedBefore; d != n {
		t.Errorf("%v follow-ups counted pinned, want %d", d, n)
	}

	// store:false: nothing to record, so its follow-up is unknown.
	unknownBefore := metricValue(t, "llmgw_previous_response_total", `outcome="unknown"`)
	unstored := mustSend(t, url, responsesBody("forget this", "", false, map[string]any{"store": false}), nil)
	r := send(context.Background(), url, responsesBody("what did I say?", responseIDOf(t, unstored), false, nil), nil)
	if d := metricValue(t, "llmgw_previous_response_total", `outcome="unknown"`) - unknownBefore; d != 1 || r.status != http.StatusNotFound {
		t.Errorf("follow-up of a store:false response: status %d, %v counted unknown; want the engine's 404, 1", r.status, d)
	}

	id = drainHolder(t, engines, holder, url, id)
	restartHolder(t, engines, holder, url, id)
}

// drainHolder drains holder, which stored id: a follow-up of id gets the
// gateway's 404 without reaching an engine; undrained, the next gets its
// answer there. It returns that answer's id.
func drainHolder(t *testing.T, engines []*vllmsim.Engine, holder, url, id string) string {
	t.Helper()
	if code := adminJSON(t, http.MethodPost, "/llm/engines/"+holder+"/drain", "", nil); code != http.StatusOK {
		t.Fatalf("drain: %d", code)
	}
	before := responsesCounts(engines)
	r := send(context.Background(), url, responsesBody("are you there?", id, false, nil), nil)
	if msg, _, _ := openAIError(t, r.body); r.status != http.StatusNotFound || msg != "Response with id '"+id+"' not found." {
		t.Errorf("follow-up while its engine is drained: status %d: %.300s", r.status, r.body)
	}
	if after := responsesCounts(engines); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("an engine was asked: /v1/responses counts %v, then %v", before, after)
	}
	if code := adminJSON(t, http.MethodPost, "/llm/engines/"+holder+"/undrain", "", nil); code != http.StatusOK {
		t.Fatalf("undrain: %d", code)
	}
	r = send(context.Background(), url, responsesBody("back?", id, true, nil), nil)
	if r.status != http.StatusOK || r.errEvent != "" || r.upstream != holder {
		t.Fatalf("follow-up after undrain: status %d from %s (stored on %s): %.300s", r.status, r.upstream, holder, r.body)
	}
	return responseIDOf(t, r)
}

// restartHolder restarts the engine holder that stored id and checks that,
// once the gateway has noticed (its next scrape), a follow-up of id gets
// the gateway's 404 without reaching an engine, streamed or not.
func restartHolder(t *testing.T, engines []*vllmsim.Engine, holder, url, id string) {
	t.Helper()
	var e *vllmsim.Engine
	for _, x := range engines {
		if x.Addr() == holder {
			e = x
		}
	}
	// The registry tells a restart by the engine's counters going down:
	// it must have seen them up first.
	waitScraped(t, holder)
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	goneBefore := metricValue(t, "llmgw_previous_response_total", `outcome="gone"`)
	wantMsg := "Response with id '" + id + "' not found."
	for w := newWait(t, 10*time.Second, "the gateway to notice the restart"); ; {
		before := responsesCounts(engines)
		r := send(context.Background(), url, responsesBody("still there?", id, false, nil), nil)
		if msg, typ, code := openAIError(t, r.body); r.status != http.StatusNotFound || msg != wantMsg || typ != "invalid_request_error" || code != 404 {
			t.Fatalf("follow-up after the restart: status %d: %.300s", r.status, r.body)
		}
		if fmt.Sprint(responsesCounts(engines)) == fmt.Sprint(before) {
			break // the gateway answered: no engine was asked
		}
		w.tick(lazy(func() string { return fmt.Sprintf("the engine still answers; report %+v", getEngineReport(t, holder)) })) // its scrape has not come yet
	}
	r := send(context.Background(), url, responsesBody("still there?", id, true, nil), nil)
	if r.status != http.StatusNotFound || !strings.Contains(r.body, `"param":"response_id"`) {
		t.Errorf("streamed follow-up after the restart: status %d: %.300s", r.status, r.body)
	}
	if d := metricValue(t, "llmgw_previous_response_total", `outcome="gone"`) - goneBefore; d < 2 {
		t.Errorf("%v follow-ups counted gone, want at least 2", d)
	}
}

// TestPreviousResponseParked: a follow-up waits for the engine that stored
// its previous response, full, while another engine is idle (admission
// reserves on that engine only); when that engine restarts as the
// follow-up waits, the follow-up is let out and answered the gateway's
// 404 rather than waiting on, or going to an engine that never held the
// response.
func TestPreviousResponseParked(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{TimeScale: 50})
	gateway{patient: true, engines: kvEngines(engines...), engineExtra: "\t\t\tmax_inflight 1\n", policy: "\t\t\tdebug_headers\n"}.load(t)
	waitKV(t, engines...)
	url := "http://" + gatewayAddr + "/v1/responses"
	first := mustSend(t, url, responsesBody("Remember the number 7.", "", false, nil), nil)
	holder, id := first.upstream, responseIDOf(t, first)
	var e *vllmsim.Engine
	for _, x := range engines {
		if x.Addr() == holder {
			e = x
		}
	}
	occupy(t, e, 1)
	waitBusy(t, holder, 1)
	before := responsesCounts(engines)
	ch := sendAsync(context.Background(), url, responsesBody("Which number?", id, false, nil), nil)
	waitQueueDepth(t, "", 1)
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	r := waitReply(t, ch, 10*time.Second)
	if msg, _, _ := openAIError(t, r.body); r.status != http.StatusNotFound || msg != "Response with id '"+id+"' not found." {
		t.Fatalf("parked follow-up after the restart: status %d: %.300s", r.status, r.body)
	}
	for i, x := range engines {
		if x == e {
			before[i] = 0 // the restart reset its counts
		}
	}
	if after := responsesCounts(engines); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("an engine was asked: /v1/responses counts %v (the holder's reset), then %v", before, after)
	}
}

// waitScraped waits for a scrape of dial taken from now on, so that the
// gateway has seen the counters of every request answered so far.
func waitScraped(t *testing.T, dial string) {
	t.Helper()
	since := time.Now()
	testwait.For(t, 10*time.Second, "a scrape of "+dial, func() bool {
		r := getEngineReport(t, dial)
		return r.Known && r.ScrapedAt.After(since)
	})
}
