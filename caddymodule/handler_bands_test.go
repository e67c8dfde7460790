package caddymodule

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// parkInOrder parks requests one after the other (each waits until the
// previous one is in its band, so arrival order is certain) and returns
// their result channels.
func parkInOrder(t *testing.T, ctx context.Context, reqs []bandReq) []<-chan reply {
	t.Helper()
	chans := make([]<-chan reply, len(reqs))
	for i, r := range reqs {
		before := queueDepth(t, r.band)
		chans[i] = sendAsync(ctx, "", chatBody(false, "band "+r.name), r.header)
		waitQueueDepth(t, r.band, before+1)
	}
	return chans
}

type bandReq struct {
	name   string
	band   string // where it must park
	header map[string]string
}

// admissionOrder waits for every request and returns their names in the
// order they reached the engine, as recorded in front of it: the order the
// gate admitted them. (Their completion order, as clients see it, says the
// same only while every client goroutine runs on time; on a loaded machine
// a reply read late could swap two.)
func admissionOrder(t *testing.T, rec *upstreamRecorder, reqs []bandReq, chans []<-chan reply) []string {
	t.Helper()
	for i, ch := range chans {
		r := waitReply(t, ch, 60*time.Second)
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("%s: %d %v %s", reqs[i].name, r.status, r.err, r.body)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []string
	for _, got := range rec.got {
		for _, r := range reqs {
			if bytes.Contains(got.body, []byte(`"band `+r.name+`"`)) {
				out = append(out, r.name)
			}
		}
	}
	return out
}

// bandGateway is parkGateway (max_inflight 1) with a recorder between the
// gateway and the engine, to tell the admission order, and an occupant
// streaming through the gateway, so that every request the test sends
// parks; ending it starts the admissions.
//
// The engine is scraped once, at the start (poll_interval 30s): the gate
// then admits one request at a time as each ends, from the gateway's own
// count. A scrape during the admissions could render the engine's gauges
// between the moment the gateway has sent a request and the moment it
// reaches the engine through the recorder's extra hop (tens of
// milliseconds on a loaded machine), free its slot a second time, and let
// the next request race it to the recorder: CI saw that reorder two
// requests.
func bandGateway(t *testing.T, e *vllmsim.Engine, admissionExtra string) (rec *upstreamRecorder, endOccupant func()) {
	t.Helper()
	rec = newUpstreamRecorder(t, e)
	gateway{engines: []gatewayEngine{{dial: rec.addr()}}, pollInterval: "30s", admission: "\t\tmax_inflight 1\n" + admissionExtra}.load(t)
	testwait.For(t, 15*time.Second, "engine gauges known", func() bool { return getEngineReport(t, rec.addr()).Known })
	occ, end := openOccupant(t)
	occ.next(t, 10*time.Second) // streaming from the engine
	return rec, end
}

// TestAdmissionBandOrder: under contention, parked requests are admitted
// high before normal before low (X-Priority), X-Warmup: true parks in low,
// and FIFO holds inside a band — whatever the arrival order.
func TestAdmissionBandOrder(t *testing.T) {
	e := slowEngine(t)
	rec, endOccupant := bandGateway(t, e, "\t\tmax_park 60s\n\t\taging 60s\n")

	reqs := []bandReq{
		{"low", "low", map[string]string{"X-Priority": "low"}},
		{"warmup", "low", map[string]string{"X-Warmup": "true"}},
		{"normal", "normal", nil},
		{"high", "high", map[string]string{"X-Priority": "high"}},
		{"high-numeric", "high", map[string]string{"X-Priority": "0"}},
		{"normal-unknown-priority", "normal", map[string]string{"X-Priority": "urgent!!"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	chans := parkInOrder(t, ctx, reqs)
	if d := [3]int{queueDepth(t, "high"), queueDepth(t, "normal"), queueDepth(t, "low")}; d != [3]int{2, 2, 2} {
		t.Fatalf("band depths high/normal/low = %v", d)
	}
	endOccupant()
	got := admissionOrder(t, rec, reqs, chans)
	want := []string{"high", "high-numeric", "normal", "normal-unknown-priority", "low", "warmup"}
	if !slices.Equal(got, want) {
		t.Errorf("admission order %v, want %v", got, want)
	}
}

// TestAdmissionAging: a low request parked longer than `aging` is served
// as high, ahead of a high request that arrived after it — low traffic
// progresses under sustained high load.
func TestAdmissionAging(t *testing.T) {
	e := slowEngine(t)
	rec, endOccupant := bandGateway(t, e, "\t\tmax_park 60s\n\t\taging 200ms\n")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reqs := []bandReq{{"low", "low", map[string]string{"X-Priority": "low"}}}
	chans := parkInOrder(t, ctx, reqs)
	testwait.For(t, 10*time.Second, "the low request parked longer than aging", func() bool {
		return getQueue(t).Pools["default"]["low"].OldestWait > 0.2
	})
	more := []bandReq{
		{"high", "high", map[string]string{"X-Priority": "high"}},
		{"normal", "normal", nil},
	}
	chans = append(chans, parkInOrder(t, ctx, more)...)
	reqs = append(reqs, more...)
	endOccupant()
	got := admissionOrder(t, rec, reqs, chans)
	if want := []string{"low", "high", "normal"}; !slices.Equal(got, want) {
		t.Errorf("admission order %v, want %v (aged low first)", got, want)
	}
}

// TestAdmissionBandHeaders: X-Priority and X-Warmup are removed before the
// request goes upstream, unless forward_band_headers; requests that are not
// inference calls pass through untouched.
func TestAdmissionBandHeaders(t *testing.T) {
	e := startEngines(t, 1, vllmsim.Config{})[0]
	rec := newUpstreamRecorder(t, e)
	hdr := map[string]string{"X-Priority": "high", "X-Warmup": "true"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, forward := range []bool{false, true} {
		adm := ""
		if forward {
			adm = "\t\tforward_band_headers\n"
		}
		gateway{engines: dialEngines(rec.addr()), admission: adm}.load(t)
		r := waitReply(t, sendAsync(ctx, "", chatBody(false, "band headers"), hdr), 30*time.Second)
		if r.status != http.StatusOK {
			t.Fatalf("forward %v: %d %s", forward, r.status, r.body)
		}
		got := rec.last(t)
		for k, v := range hdr {
			if fwd := got.header.Get(k); (fwd == v) != forward {
				t.Errorf("forward_band_headers %v: upstream saw %s=%q", forward, k, fwd)
			}
		}
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+gatewayAddr+"/v1/models", nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	gateway{engines: dialEngines(rec.addr())}.load(t)
	if r := do(nil, req, nil); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("GET /v1/models: %d %v %s", r.status, r.err, r.body)
	}
	got := rec.last(t)
	if got.path != "/v1/models" || got.header.Get("X-Priority") != "high" || got.header.Get("X-Warmup") != "true" {
		t.Errorf("non-inference request changed upstream: %s %v", got.path, got.header)
	}
}
