package caddymodule

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/goleak"

	"github.com/llmgw/caddy-llmgw/admission"
)

// TestAdmissionAccountingStress drives the handler directly (no Caddy)
// with many concurrent requests — streaming or not, in all bands, some
// clients leaving while parked, some timing out at max_park — against one
// engine whose gauges stay at zero after the first scrape, so local
// accounting alone enforces max_inflight. Invariants: no more than
// max_inflight requests are ever inside the next handler at once; every
// request ends admitted, refused or gone; afterwards nothing is parked,
// in flight or dispatched (no reservation leaked or released twice); no
// goroutine is left behind.
func TestAdmissionAccountingStress(t *testing.T) {
	running := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, running) }) // after the fleet's and server's cleanups
	const limit, clients = 3, 300
	page := new(benchGaugePage)
	f, dial := benchFleet(t, page)
	h := benchHandler(f, Admission{
		MaxInflight: limit,
		QueueSize:   clients,
		MaxPark:     caddy.Duration(150 * time.Millisecond),
		Heartbeat:   caddy.Duration(5 * time.Millisecond),
		Aging:       caddy.Duration(20 * time.Millisecond),
	})

	var inside, peak, served atomic.Int64
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		n := inside.Add(1)
		defer inside.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		served.Add(1)
		// The request holds its slot for up to 3ms, as an upstream's work
		// would: the sleep is the load under test, not a wait.
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		w.WriteHeader(http.StatusOK)
		_, err := w.Write(benchChatResponse)
		return err
	})

	var wg sync.WaitGroup
	var ok, refused, gone atomic.Int64
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{})
			var cancel context.CancelFunc = func() {}
			if i%5 == 0 { // leaves while (probably) parked
				ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(40))*time.Millisecond)
			}
			defer cancel()
			stream := i%3 == 0
			body := fmt.Sprintf(`{"model":"sim-model","stream":%v,"messages":[{"role":"user","content":"%d"}]}`, stream, i)
			r := benchRequest(ctx, []byte(body))
			r.Header.Set("X-Priority", []string{"high", "normal", "low"}[i%3])
			w := httptest.NewRecorder()
			if err := h.ServeHTTP(w, r, next); err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			switch {
			case w.Code == http.StatusServiceUnavailable || bytes.Contains(w.Body.Bytes(), []byte("event: error")):
				refused.Add(1)
			case ctx.Err() != nil:
				gone.Add(1)
			case w.Code == http.StatusOK:
				ok.Add(1)
			default:
				t.Errorf("request %d: %d %s", i, w.Code, w.Body)
			}
		}()
	}
	wg.Wait()

	if p := peak.Load(); p > limit {
		t.Errorf("%d requests inside next at once; max_inflight %d", p, limit)
	}
	e, _ := f.Registry().Get(dial)
	l := e.Load()
	st := f.Gates()["default"].Stats()
	t.Logf("admitted %d (served %d), refused or timed out %d, gone %d; peak inside %d; gate %+v", ok.Load(), served.Load(), refused.Load(), gone.Load(), peak.Load(), st)
	if l.Inflight != 0 || l.Dispatched != 0 {
		t.Errorf("after all requests: inflight %d, dispatched %d", l.Inflight, l.Dispatched)
	}
	if st.Depth != [admission.NumBands]int{} {
		t.Errorf("parked after all requests: %v", st.Depth)
	}
	if served.Load() == 0 || ok.Load() == 0 {
		t.Errorf("nothing served")
	}
}
