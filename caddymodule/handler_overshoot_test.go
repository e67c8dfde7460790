package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// TestAdmissionSoftCapOvershoot measures how far a burst overshoots
// max_inflight between two scrapes, with local accounting (requests
// dispatched since the last scrape count against the limit) and without it
// (`local_accounting off`: the gauges alone). One engine, max_inflight 4,
// poll_interval 500ms, 40 concurrent requests; the peak running+waiting the
// engine itself reports is the figure. Both are logged (the README quotes
// them: go test -run '^TestAdmissionSoftCapOvershoot$' -v ./caddymodule).
//
// The bounds asserted are generous, the figures being counts that timing
// moves. With local accounting the engine holds at most two requests over
// the limit. By design it holds none over it for long: a slot is freed only
// when the gateway sees its request end, after the engine did. But the
// figure is sampled from the engine's own counts every 2ms, and two
// windows let a sample see more: a request whose answer is out but which
// the engine has not yet taken off its counts, beside the one admitted in
// its place; and a request the engine has not registered when it renders
// its gauges although it was sent before the scrape's epoch began (at
// least markLead before the scrape: two of the engine's 10ms steps plus
// 5ms, capped at 12.5ms by this test's 50ms interval),
// which that scrape then counts neither as running nor as dispatched until
// it ends (see upstreams' Reservation.Sent). On an idle machine the figure
// is +0; under the whole suite's load on 2 cores it reached +2 once in CI
// (the bound was +1 before). Without local accounting the burst
// overshoots to at least twice the limit (it admits all 40 on an idle
// machine: the first scrape after the burst is up to 500ms away).
func TestAdmissionSoftCapOvershoot(t *testing.T) {
	const limit, burst = 4, 40
	peak := map[string]int{}
	for _, mode := range []string{"on", "off"} {
		t.Run("local_accounting_"+mode, func(t *testing.T) {
			e := startEngines(t, 1, vllmsim.Config{TimeScale: 1, DecodeStepTime: 10 * time.Millisecond, MaxNumSeqs: 64})[0]
			gateway{
				engines:   noKVEngines(e),
				appExtra:  "\t\tpoll_interval 500ms\n",
				admission: fmt.Sprintf("\t\tmax_inflight %d\n\t\tmax_park 60s\n\t\tqueue_size 100\n\t\tlocal_accounting %s\n", limit, mode),
			}.load(t)
			testwait.For(t, 10*time.Second, "engine known", func() bool { return getEngineReport(t, e.Addr()).Known })

			var max atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					st := e.Stats()
					if n := int64(st.Running + st.Waiting); n > max.Load() {
						max.Store(n)
					}
					select {
					case <-stop:
						return
					case <-time.After(2 * time.Millisecond):
					}
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			chans := make([]<-chan reply, burst)
			for i := range chans {
				chans[i] = sendAsync(ctx, "", fmt.Sprintf(`{"model":"sim-model","max_tokens":20,"messages":[{"role":"user","content":"burst %d"}]}`, i), nil)
			}
			for i, ch := range chans {
				if r := waitReply(t, ch, 120*time.Second); r.status != http.StatusOK {
					t.Errorf("request %d: %d %v %s", i, r.status, r.err, r.body)
				}
			}
			close(stop)
			<-sampled
			peak[mode] = int(max.Load())
			t.Logf("local_accounting %s: peak running+waiting %d with max_inflight %d, burst %d, poll_interval 500ms", mode, peak[mode], limit, burst)
		})
	}
	if t.Failed() {
		return
	}
	t.Logf("overshoot over max_inflight %d: with local accounting %+d, without %+d", limit, peak["on"]-limit, peak["off"]-limit)
	if peak["on"] > limit+2 {
		t.Errorf("with local accounting the engine ran %d requests at once, want at most %d (max_inflight %d)", peak["on"], limit+2, limit)
	}
	if peak["off"] < 2*limit {
		t.Errorf("without local accounting the engine ran at most %d requests at once, want a burst of %d to reach %d: did the setting take effect?", peak["off"], burst, 2*limit)
	}
}
