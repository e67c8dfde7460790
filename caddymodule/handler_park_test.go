package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// parkGateway is the gateway in front of one slow engine with an admission
// limit of one request (the engine itself could run 16). It is patient:
// with scrapes timed out at the 50ms poll interval, a loaded machine can
// fail three in a row, the gauges go stale and admission fails open, so a
// request the test expects parked goes straight to the engine.
func parkGateway(e *vllmsim.Engine, admissionExtra string) gateway {
	return gateway{engines: noKVEngines(e), admission: "\t\tmax_inflight 1\n" + admissionExtra, patient: true}
}

// TestAdmissionParkAdmitLatency: with the engine at its limit (filled by a
// direct caller), a gateway request parks; once the engine frees its slot
// the request is admitted as soon as a poll shows it (poll_interval 50ms),
// woken by the poll reply rather than a sleep loop. The latency from the
// engine having room to the parked request arriving at the engine is
// logged; the bound asserted is generous because the machine is loaded.
func TestAdmissionParkAdmitLatency(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 30s\n").load(t)

	var lat []time.Duration
	for i := range 5 {
		occ := occupy(t, e, 1)
		waitBusy(t, e.Addr(), 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ch := sendAsync(ctx, "", chatBody(false, "parked request "+strconv.Itoa(i)), nil)
		waitQueueDepth(t, "normal", 1)
		if st := e.Stats(); st.Running+st.Waiting != 1 {
			t.Fatalf("parked request reached the engine: %+v", st)
		}

		occ[0].release()
		var freeAt time.Time
		why := lazy(func() string {
			return fmt.Sprintf("free seen: %v; queue %+v; engine %+v", !freeAt.IsZero(), getQueue(t), getEngineReport(t, e.Addr()))
		})
		w := newWait(t, 10*time.Second, fmt.Sprintf("round %d: the parked request at the engine", i)).pace(500 * time.Microsecond)
		for len(lat) == i {
			st := e.Stats()
			busy := st.Running + st.Waiting
			if freeAt.IsZero() && busy == 0 {
				freeAt = time.Now()
			}
			if !freeAt.IsZero() && busy > 0 {
				lat = append(lat, time.Since(freeAt))
				break
			}
			w.tick(why)
		}
		r := waitReply(t, ch, 30*time.Second)
		cancel()
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("round %d: parked request: %d %v %s", i, r.status, r.err, r.body)
		}
	}
	slices.Sort(lat)
	t.Logf("engine free -> parked request at the engine: min %v, median %v, max %v (poll_interval 50ms)", lat[0], lat[len(lat)/2], lat[len(lat)-1])
	if lat[len(lat)-1] > time.Second {
		t.Errorf("parked request admitted %v after the engine had room; want well under 1s", lat[len(lat)-1])
	}
}

// TestAdmissionMaxPark: a request parked longer than max_park gets 503 with
// an integer Retry-After of at least 1 and an OpenAI error body; a parked
// streaming request, whose 200 is already out, gets an in-band error event.
func TestAdmissionMaxPark(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 300ms\n\t\theartbeat 100ms\n").load(t)
	occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)
	before := metricValue(t, "llmgw_admission_rejected_total", `reason="max_park"`)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	r := waitReply(t, sendAsync(ctx, "", chatBody(false, "too late"), nil), 30*time.Second)
	took := time.Since(start)
	if r.err != nil || r.status != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %d %v %s", r.status, r.err, r.body)
	}
	if took < 300*time.Millisecond {
		t.Errorf("rejected after %v, before max_park", took)
	}
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want an integer >= 1", r.header.Get("Retry-After"))
	}
	if _, typ, code := openAIError(t, r.body); code != 503 || typ != "server_error" {
		t.Errorf("error body %s", r.body)
	}

	s := openStream(t, ctx, chat{user: "too late, streaming", maxTokens: 4, stream: true, usage: true}.body(), nil)
	if s.res.StatusCode != http.StatusOK || !strings.HasPrefix(s.res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("parked stream: %d %s", s.res.StatusCode, s.res.Header.Get("Content-Type"))
	}
	rest := s.rest(t, 30*time.Second)
	got := strings.Join(rest, "\n")
	if !strings.Contains(got, ": keep-alive") || !strings.Contains(got, "event: error") || strings.Contains(got, "data: {\"id\"") {
		t.Errorf("parked stream past max_park: %q", got)
	}
	if v := metricValue(t, "llmgw_admission_rejected_total", `reason="max_park"`); v < before+2 {
		t.Errorf("llmgw_admission_rejected_total{reason=max_park} = %v, want >= %v", v, before+2)
	}
	if d := queueDepth(t, ""); d != 0 {
		t.Errorf("queue depth %d after rejections", d)
	}
}

// TestAdmissionQueueFull: with queue_size 1 and one request parked, the next
// request of the same band is refused at once (not after max_park) with 503
// and Retry-After; another band still parks.
func TestAdmissionQueueFull(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 30s\n\t\tqueue_size 1\n").load(t)
	occ := occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)
	before := metricValue(t, "llmgw_admission_rejected_total", `reason="queue_full"`)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := sendAsync(ctx, "", chatBody(false, "first"), nil)
	waitQueueDepth(t, "normal", 1)
	start := time.Now()
	r := waitReply(t, sendAsync(ctx, "", chatBody(false, "second"), nil), 30*time.Second)
	if r.err != nil || r.status != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %d %v %s", r.status, r.err, r.body)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("queue-full refusal took %v; want immediate", took)
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q", r.header.Get("Retry-After"))
	}
	if msg, _, _ := openAIError(t, r.body); !strings.Contains(msg, "queue") {
		t.Errorf("message %q", msg)
	}
	high := sendAsync(ctx, "", chatBody(false, "high"), map[string]string{"X-Priority": "high"})
	waitQueueDepth(t, "high", 1)
	if v := metricValue(t, "llmgw_admission_rejected_total", `reason="queue_full"`); v != before+1 {
		t.Errorf("rejected{queue_full} = %v, want %v", v, before+1)
	}
	occ[0].release()
	for _, ch := range []<-chan reply{high, first} {
		if r := waitReply(t, ch, 30*time.Second); r.status != http.StatusOK {
			t.Errorf("parked request: %d %v %s", r.status, r.err, r.body)
		}
	}
}

// TestAdmissionClientGone: parked clients that disconnect (streaming or
// not) leave the queue at once: /llm/queue and llmgw_admission_queue_depth
// fall back to 0 without any capacity becoming free.
func TestAdmissionClientGone(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 60s\n\t\theartbeat 100ms\n").load(t)
	occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)
	before := metricValue(t, "llmgw_admission_rejected_total", `reason="client_gone"`)

	ctx, cancel := context.WithCancel(context.Background())
	plain := sendAsync(ctx, "", chatBody(false, "leaving"), nil)
	lowCh := sendAsync(ctx, "", chatBody(false, "leaving low"), map[string]string{"X-Priority": "low"})
	s := openStream(t, ctx, chat{user: "leaving stream", maxTokens: 4, stream: true, usage: true}.body(), nil)
	waitQueueDepth(t, "", 3)
	if v := metricValue(t, "llmgw_admission_queue_depth"); v != 3 {
		t.Errorf("llmgw_admission_queue_depth = %v with 3 parked", v)
	}
	cancel()
	<-plain
	<-lowCh
	s.res.Body.Close()
	gone := time.Now()
	testwait.For(t, 5*time.Second, "queue empty after clients left", func() bool {
		return queueDepth(t, "") == 0 && metricValue(t, "llmgw_admission_queue_depth") == 0
	})
	t.Logf("queue empty %v after the clients disconnected", time.Since(gone))
	testwait.For(t, 5*time.Second, "client_gone counted", func() bool {
		return metricValue(t, "llmgw_admission_rejected_total", `reason="client_gone"`) >= before+3
	})
	if st := e.Stats(); st.Running+st.Waiting != 1 {
		t.Errorf("a departed request reached the engine: %+v", st)
	}
}

// TestAdmissionPoolAfterReload: after a reload that replaces the engines,
// admission gates on the new engines from the first request, not on the
// pool the policy learned under the old config (which would fail open on
// the departed engines instead of parking).
func TestAdmissionPoolAfterReload(t *testing.T) {
	old := slowEngine(t)
	parkGateway(old, "\t\tmax_park 30s\n").load(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r := waitReply(t, sendAsync(ctx, "", chatBody(false, "teach the pool"), nil), 30*time.Second); r.status != http.StatusOK {
		t.Fatalf("warm-up: %d %s", r.status, r.body)
	}
	_ = old.Close()

	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 30s\n").load(t)
	occ := occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)
	failOpen := metricValue(t, "llmgw_admission_fail_open_total")
	ch := sendAsync(ctx, "", chatBody(false, "after reload"), nil)
	waitQueueDepth(t, "normal", 1)
	occ[0].release()
	if r := waitReply(t, ch, 30*time.Second); r.status != http.StatusOK {
		t.Fatalf("parked request: %d %s", r.status, r.body)
	}
	if v := metricValue(t, "llmgw_admission_fail_open_total"); v != failOpen {
		t.Errorf("fail-open admissions %v -> %v: admission gated on the old engines", failOpen, v)
	}
}

// TestAdmissionReservationFollowsProxy: with a selection policy other than
// llm, the reservation admission made on the engine with the most room
// moves to the engine reverse_proxy actually sends the request to, so local
// accounting counts it where it runs.
func TestAdmissionReservationFollowsProxy(t *testing.T) {
	a, b := slowEngine(t), slowEngine(t)
	// `first` always proxies to a; admission, seeing a busier, reserves on b.
	gateway{engines: dialEngines(a.Addr(), b.Addr()), admission: "\t\tmax_inflight 3\n", policy: "lb_policy first"}.load(t)
	occupy(t, a, 1)
	waitBusy(t, a.Addr(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openStream(t, ctx, `{"model":"sim-model","stream":true,"max_tokens":20000,"messages":[{"role":"user","content":"follow me"}]}`, nil)
	defer s.res.Body.Close()
	if l, _ := s.next(t, 10*time.Second); !strings.HasPrefix(l, "data: ") {
		t.Fatalf("stream: %q", l)
	}
	testwait.For(t, 10*time.Second, "the gateway's request running on engine a", func() bool {
		st := a.Stats()
		return st.Running+st.Waiting == 2
	})
	if ra, rb := getEngineReport(t, a.Addr()), getEngineReport(t, b.Addr()); ra.Inflight != 1 || rb.Inflight != 0 {
		t.Errorf("local in-flight: a %d, b %d; want the request counted on a", ra.Inflight, rb.Inflight)
	}
}

// TestAdmissionEngineQueue: with engine_queue 1 an engine at its
// max_inflight takes one more request, which waits in its own queue, and
// the request after that parks; without it the first extra request parks.
// The queued request is long, so that it holds its place until the test
// lets it go; then the parked request gets that place.
func TestAdmissionEngineQueue(t *testing.T) {
	e := slowEngine(t)
	parkGateway(e, "\t\tmax_park 30s\n\t\tengine_queue 1\n").load(t)
	occupy(t, e, 1)
	waitBusy(t, e.Addr(), 1)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	queuedCtx, leave := context.WithCancel(ctx)
	defer leave()
	queued := sendAsync(queuedCtx, "", chat{user: "waits in the engine's queue", maxTokens: 20000}.body(), nil)
	waitBusy(t, e.Addr(), 2) // at the engine, not parked
	parked := sendAsync(ctx, "", chatBody(false, "parks at the gateway"), nil)
	waitQueueDepth(t, "normal", 1)
	if st := e.Stats(); st.Running+st.Waiting != 2 {
		t.Fatalf("engine holds %d requests, want 2 (max_inflight 1 + engine_queue 1): %+v", st.Running+st.Waiting, st)
	}
	leave()
	waitReply(t, queued, 30*time.Second) // gone: its place is free
	if r := waitReply(t, parked, 30*time.Second); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("parked request: %d %v %s", r.status, r.err, r.body)
	}
}
