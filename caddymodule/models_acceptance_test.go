package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Issue 37's acceptance test: several models and LoRA adapters behind one
// endpoint, in the smallest configuration, with nothing model-specific in
// it. Each engine is listed once, in the llm app; the gateway learns what
// each serves from its /v1/models.

// acceptancePoll is the llm app's poll_interval in the acceptance test. An
// engine's /v1/models is fetched at its poller's first successful scrape,
// so a new engine's models should be known about one interval after it
// joins.
const acceptancePoll = 100 * time.Millisecond

// acceptanceCaddyfile is the whole gateway: the engines (with their KV
// events) in the llm app, GET /v1/models answered by llm_models, and every
// other request through llm_admission to reverse_proxy, whose upstreams are
// the llm app's engines. Written out rather than built with the gateway
// helper so that the test shows the configuration it accepts.
func acceptanceCaddyfile(engines []*vllmsim.Engine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin %s\n\tskip_install_trust\n\thttp_port %d\n\thttps_port %d\n\tgrace_period 1ns\n", adminAddr, httpPort, httpsPort)
	fmt.Fprintf(&b, "\tllm {\n\t\tpoll_interval %s\n", acceptancePoll)
	for _, e := range engines {
		fmt.Fprintf(&b, "\t\tengine %s {\n\t\t\tkv_events %s\n\t\t}\n", e.Addr(), e.KVEndpoint())
	}
	fmt.Fprintf(&b, "\t}\n}\n\nhttp://%s {\n", gatewayAddr)
	b.WriteString("\thandle /v1/models {\n\t\tllm_models\n\t}\n")
	b.WriteString("\tllm_admission\n")
	b.WriteString("\treverse_proxy {\n\t\tdynamic llm\n\t\tlb_policy llm\n\t}\n}\n")
	return b.String()
}

// acceptanceFleet is the test's engines: three of model-a, the first also
// serving the adapters a-lora-1 and a-lora-2, and two of model-b.
type acceptanceFleet struct {
	a, b []*vllmsim.Engine
}

func startAcceptanceFleet(t *testing.T) acceptanceFleet {
	t.Helper()
	// TimeScale 200: a 2-token answer takes well under a millisecond of
	// simulated decode time.
	cfgA := vllmsim.Config{Model: "model-a", TimeScale: 200}
	loraA := cfgA
	loraA.LoRAModules, loraA.MaxLoRAs = []string{"a-lora-1", "a-lora-2"}, 2
	return acceptanceFleet{
		a: append(startEngines(t, 1, loraA), startEngines(t, 2, cfgA)...),
		b: startEngines(t, 2, vllmsim.Config{Model: "model-b", TimeScale: 200}),
	}
}

func (f acceptanceFleet) all() []*vllmsim.Engine {
	return append(slices.Clone(f.a), f.b...)
}

// acceptanceBody is request i for model: a chat or, every third, a
// completion; every fourth streamed.
func acceptanceBody(model string, i int) (url, body string) {
	stream := i%4 == 0
	if i%3 == 0 {
		return "http://" + gatewayAddr + "/v1/completions",
			fmt.Sprintf(`{"model":%q,"max_tokens":2,"stream":%t,"prompt":"acceptance %d"}`, model, stream, i)
	}
	return "", fmt.Sprintf(`{"model":%q,"max_tokens":2,"stream":%t,"messages":[{"role":"user","content":"acceptance %d"}]}`, model, stream, i)
}

// statusTally counts answers by model and status.
type statusTally struct {
	mu  sync.Mutex
	got map[string]map[int]int
}

func (s *statusTally) add(model string, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got == nil {
		s.got = map[string]map[int]int{}
	}
	if s.got[model] == nil {
		s.got[model] = map[int]int{}
	}
	s.got[model][status]++
}

// sendMixed sends n requests, request i for models[i%len(models)], from
// workers concurrent clients, and returns the answers' statuses. A 404's
// body is checked to be the gateway's model_not_found.
func sendMixed(t *testing.T, models []string, n, workers int) *statusTally {
	t.Helper()
	tally := &statusTally{}
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				model := models[i%len(models)]
				url, body := acceptanceBody(model, i)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				r := send(ctx, url, body, nil)
				cancel()
				status := r.status
				if r.err != nil || (status == http.StatusOK && strings.Contains(body, `"stream":true`) && !r.complete()) {
					status = -1 // failed, or a stream cut short
				}
				if status == http.StatusNotFound {
					checkModelNotFound(t, r.body, model)
				}
				tally.add(model, status)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return tally
}

// expectStatus fails the test unless each of models got exactly want
// answers, all with status.
func (s *statusTally) expectStatus(t *testing.T, models []string, status, want int) {
	t.Helper()
	for _, m := range models {
		if got := s.got[m]; got[status] != want || len(got) != 1 {
			t.Errorf("%s: statuses %v, want %d × %d", m, got, want, status)
		}
	}
}

// engineTotal is how many completion and chat requests e received.
func engineTotal(e *vllmsim.Engine) int {
	n := 0
	for _, c := range e.RequestsByModel() {
		n += c
	}
	return n
}

// gatewayModels is the gateway's GET /v1/models ids, or nil when it does
// not answer 200.
func gatewayModels(t *testing.T) []string {
	t.Helper()
	res, body := getModels(t, http.MethodGet, "/v1/models")
	if res.StatusCode != http.StatusOK {
		return nil
	}
	var ids []string
	for _, m := range decodeModels(t, body) {
		ids = append(ids, m.id)
	}
	return ids
}

// TestModelsAcceptance is issue 37's acceptance test, in two parts: a mixed
// load over a fixed fleet, then engines joining and leaving by reload.
func TestModelsAcceptance(t *testing.T) {
	forgetEngines(t) // the model list is the union over the fleet's engines
	t.Cleanup(func() { resetGateway(t) })
	f := startAcceptanceFleet(t)
	newTester(t, acceptanceCaddyfile(f.all()))
	waitModelsLearned(t, f.all()...)

	t.Run("mixed", func(t *testing.T) { acceptMixed(t, f) })
	if t.Failed() {
		return
	}
	t.Run("join and leave", func(t *testing.T) { acceptJoinLeave(t, f) })
}

// acceptMixed: 1,000 requests for the models and adapters, 16 at a time,
// are all answered 200 by engines serving their model; requests for a
// model nobody serves are answered 404 model_not_found by the gateway; the
// model list shows every model and adapter.
func acceptMixed(t *testing.T, f acceptanceFleet) {
	if got, want := gatewayModels(t), []string{"a-lora-1", "a-lora-2", "model-a", "model-b"}; !sameSet(got, want) {
		t.Errorf("GET /v1/models lists %v, want %v", got, want)
	}
	served := []string{"model-a", "model-b", "a-lora-1", "a-lora-2"}
	// Five rounds of the served models, then one no engine serves: 250
	// requests for each served model (1,000) and 50 for the unknown one.
	var models []string
	for range 5 {
		models = append(models, served...)
	}
	models = append(models, "no-such-model")
	const n = 1050
	start := time.Now()
	tally := sendMixed(t, models, n, 16)
	t.Logf("%d requests in %v: %v", n, time.Since(start).Round(time.Millisecond), tally.got)
	tally.expectStatus(t, served, http.StatusOK, 250)
	tally.expectStatus(t, []string{"no-such-model"}, http.StatusNotFound, 50)

	// Counted at the engines: every request reached an engine serving
	// its model, and none saw the unknown one.
	got := checkServedOnly(t, f.all())
	if got["no-such-model"] != 0 {
		t.Errorf("engines saw %d requests for the unknown model", got["no-such-model"])
	}
	for _, m := range served {
		if got[m] != 250 {
			t.Errorf("engines received %d requests for %s, want 250", got[m], m)
		}
	}
	for _, e := range f.all() {
		t.Logf("engine %s (%s) received %v", e.Addr(), e.Config().Model, e.RequestsByModel())
	}
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// acceptJoinLeave: an engine serving a new model joins the llm app by a
// reload, and its model is routable as soon as the gateway learned it,
// about one poll after the reload; engines left out by a later reload get
// no further requests, and a model only they served is answered 404.
func acceptJoinLeave(t *testing.T, f acceptanceFleet) {
	c := startEngines(t, 1, vllmsim.Config{Model: "model-c", TimeScale: 200})[0]
	joined := append(f.all(), c)
	// Other models' traffic goes on while the engine joins.
	stop := backgroundLoad([]string{"model-a", "model-b"}, 4)
	// Timed from before the reload: the new engine's poller starts as the
	// config is applied, before the load returns.
	reloading := time.Now()
	newTester(t, acceptanceCaddyfile(joined))
	loaded := time.Since(reloading)
	testwait.For(t, 10*time.Second, "GET /v1/models to list model-c", func() bool {
		return slices.Contains(gatewayModels(t), "model-c")
	})
	learned := time.Since(reloading)
	sent, failed := stop()
	t.Logf("model-c listed %v after the reload began (the load took %v; poll_interval %v)",
		learned.Round(time.Millisecond), loaded.Round(time.Millisecond), acceptancePoll)
	// Until its models are known, the new engine may be sent any model's
	// requests (fleet.Serving fails open on unknown engines): measured,
	// not asserted.
	t.Logf("meanwhile %d requests for model-a and model-b, not answered 200: %v; model-c's engine received %v",
		sent, failed, c.RequestsByModel())
	cBefore := c.RequestsByModel()["model-c"]
	if learned > 20*acceptancePoll {
		// Not a timing assertion: the bound is loose enough for a loaded
		// machine, yet far below the 30s models interval.
		t.Errorf("model-c took %v to be learned, more than 20 polls", learned)
	}

	models := []string{"model-c", "model-a", "model-b", "a-lora-1", "a-lora-2"}
	cOthers := engineTotal(c) - cBefore
	tally := sendMixed(t, models, 200, 16)
	tally.expectStatus(t, models, http.StatusOK, 40)
	checkServedOnly(t, f.all())
	if n := c.RequestsByModel()["model-c"] - cBefore; n != 40 || engineTotal(c)-cBefore-n != cOthers {
		t.Errorf("model-c's engine received %v, want 40 more requests, all for model-c", c.RequestsByModel())
	}

	// The third model-a engine and model-c's engine leave.
	gone := []*vllmsim.Engine{f.a[2], c}
	kept := slices.DeleteFunc(slices.Clone(joined), func(e *vllmsim.Engine) bool { return slices.Contains(gone, e) })
	goneBefore := []int{engineTotal(gone[0]), engineTotal(gone[1])}
	newTester(t, acceptanceCaddyfile(kept))
	// Routing follows the reload at once: model-c, served by no engine of
	// the new config, is answered 404, and GET /v1/models no longer lists
	// it, although the fleet keeps the removed engines, which served
	// requests recently, until idle_ttl.
	if got := gatewayModels(t); !slices.Equal(got, []string{"a-lora-1", "a-lora-2", "model-a", "model-b"}) {
		t.Errorf("GET /v1/models after the removal lists %v, want a-lora-1 a-lora-2 model-a model-b", got)
	}
	models = append(models, "model-a") // more of model-a, which lost an engine
	tally = sendMixed(t, models, 240, 16)
	tally.expectStatus(t, []string{"model-b", "a-lora-1", "a-lora-2"}, http.StatusOK, 40)
	tally.expectStatus(t, []string{"model-a"}, http.StatusOK, 80)
	tally.expectStatus(t, []string{"model-c"}, http.StatusNotFound, 40)
	for i, e := range gone {
		if n := engineTotal(e) - goneBefore[i]; n != 0 {
			t.Errorf("engine %s (%s) got %d requests after it was removed", e.Addr(), e.Config().Model, n)
		}
	}
	for _, e := range kept {
		t.Logf("engine %s (%s) received %v", e.Addr(), e.Config().Model, e.RequestsByModel())
	}
	checkServedOnly(t, f.all())
}

// backgroundLoad sends requests for models from workers clients until the
// returned stop is called, which returns how many were sent and the
// outcomes of those not answered 200: their status, or "reload race" for
// a request sent on a keep-alive connection the reload closed or reset by
// Caddy's listener handover (which clients retry), or "error".
func backgroundLoad(models []string, workers int) (stop func() (sent int, failed map[string]int)) {
	done := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	n, bad := 0, map[string]int{}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i += workers {
				select {
				case <-done:
					return
				default:
				}
				url, body := acceptanceBody(models[i%len(models)], i)
				r := send(context.Background(), url, body, nil)
				mu.Lock()
				n++
				switch {
				case r.keepAliveRace() || r.listenerReset():
					bad["reload race"]++
				case r.err != nil:
					bad["error"]++
				case r.status != http.StatusOK:
					bad[fmt.Sprint(r.status)]++
				}
				mu.Unlock()
			}
		}()
	}
	return func() (int, map[string]int) {
		close(done)
		wg.Wait()
		return n, bad
	}
}

// lengthMessages is the chat prompt of the context-length test.
const lengthMessages = `[{"role":"user","content":"how long is this prompt, in tokens?"}]`

// tokenCount is the prompt length e's /tokenize counts for model and
// body, a tokenize request's JSON fields after "model".
func tokenCount(t *testing.T, e *vllmsim.Engine, model, fields string) int {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,%s}`, model, fields)
	r := send(context.Background(), e.URL()+"/tokenize", body, nil)
	var v struct{ Count int }
	if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &v) != nil || v.Count == 0 {
		t.Fatalf("tokenize %s: %d %s", body, r.status, r.body)
	}
	return v.Count
}

// apiError is an OpenAI error body's fields, param as raw JSON.
type apiError struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Param   json.RawMessage `json:"param"`
	Code    json.RawMessage `json:"code"`
}

func decodeAPIError(t *testing.T, body string) apiError {
	t.Helper()
	var v struct{ Error apiError }
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("error body not JSON (%v): %q", err, body)
	}
	return v.Error
}

// TestContextLengthRefused: a request whose prompt plus budget does not
// fit the smallest max_model_len among the engines serving its model is
// answered vLLM's 400 by the gateway, word for word what that engine
// answers, and reaches no engine; one exactly at the limit is served.
// Behind llm_admission (which places, so tokenizes, the request) and
// with lb_policy llm alone.
func TestContextLengthRefused(t *testing.T) {
	t.Cleanup(func() { resetGateway(t) })
	short := startEngines(t, 1, vllmsim.Config{Model: "model-a", MaxModelLen: 128})[0]
	long := startEngines(t, 1, vllmsim.Config{Model: "model-a", MaxModelLen: 256, LoRAModules: []string{"a-lora"}})[0]
	b := startEngines(t, 1, vllmsim.Config{Model: "model-b"})[0]
	all := []*vllmsim.Engine{short, long, b}
	for _, tc := range []struct{ name, admission string }{{"admission", ""}, {"policy", "-"}} {
		t.Run(tc.name, func(t *testing.T) {
			gateway{engines: noKVEngines(all...), dynamic: dynamicLLM, patient: true, admission: tc.admission}.load(t)
			waitModelsLearned(t, all...)
			before := metricValue(t, "llmgw_admission_rejected_total", `reason="context_length"`)
			checkContextLengths(t, all, short)
			// Four refusals, counted as rejected with their reason.
			if n := metricValue(t, "llmgw_admission_rejected_total", `reason="context_length"`) - before; n != 4 {
				t.Errorf("llmgw_admission_rejected_total{reason=\"context_length\"} grew by %v, want 4", n)
			}
		})
	}
}

// checkContextLengths sends requests at and past the limits of the test's
// engines: model-a's smallest context is 128 (short's), its adapter's 256
// (on the one engine serving it), model-b's the default 32768.
func checkContextLengths(t *testing.T, all []*vllmsim.Engine, short *vllmsim.Engine) {
	p := tokenCount(t, short, "model-a", `"messages":`+lengthMessages)
	chat := func(model, budget string) string {
		return fmt.Sprintf(`{"model":%q,%s,"messages":%s}`, model, budget, lengthMessages)
	}
	ids := strings.TrimSuffix(strings.Repeat("7,", 128), ",")
	completions := "http://" + gatewayAddr + "/v1/completions"
	tests := []struct {
		name, url, body string
		want            string // the refusal's message; "" for a 200
		sameAsEngine    bool   // short answers the body with the same 400
	}{
		{"fits the smallest", "", chat("model-a", fmt.Sprintf(`"max_tokens":%d`, 128-p)), "", false},
		{"past the smallest", "", chat("model-a", fmt.Sprintf(`"max_tokens":%d`, 129-p)),
			fmt.Sprintf("This model's maximum context length is 128 tokens. However, you requested 129 tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", p, 129-p), true},
		{"max_completion_tokens first", "", chat("model-a", fmt.Sprintf(`"max_tokens":1,"max_completion_tokens":%d`, 200-p)),
			fmt.Sprintf("This model's maximum context length is 128 tokens. However, you requested 200 tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", p, 200-p), true},
		{"adapter fits its engine", "", chat("a-lora", fmt.Sprintf(`"max_tokens":%d`, 256-p)), "", false},
		{"adapter past its engine", "", chat("a-lora", fmt.Sprintf(`"max_tokens":%d`, 257-p)),
			fmt.Sprintf("This model's maximum context length is 256 tokens. However, you requested 257 tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", p, 257-p), false},
		{"token ids without a budget", completions, fmt.Sprintf(`{"model":"model-a","prompt":[%s]}`, ids),
			"This model's maximum context length is 128 tokens. However, you requested 128 tokens in the messages, Please reduce the length of the messages.", false},
		{"another model's context", "", chat("model-b", `"max_tokens":1000`), "", false},
	}
	for _, tt := range tests {
		before := checkServedOnly(t, all)
		r := send(context.Background(), tt.url, tt.body, nil)
		after := checkServedOnly(t, all)
		if tt.want == "" {
			if r.status != http.StatusOK {
				t.Errorf("%s: status %d %s, want 200", tt.name, r.status, r.body)
			}
			continue
		}
		e := decodeAPIError(t, r.body)
		if r.status != http.StatusBadRequest || e.Message != tt.want || e.Type != "BadRequestError" ||
			string(e.Param) != "null" || string(e.Code) != "400" {
			t.Errorf("%s: status %d %s, want 400 %q", tt.name, r.status, r.body, tt.want)
		}
		if !maps.Equal(before, after) {
			t.Errorf("%s: engines received it: %v, then %v", tt.name, before, after)
		}
		if tt.sameAsEngine {
			direct := send(context.Background(), short.URL()+"/v1/chat/completions", tt.body, nil)
			if d := decodeAPIError(t, direct.body); direct.status != r.status || !reflect.DeepEqual(d, e) {
				t.Errorf("%s: the gateway answered %d %+v, the engine %d %+v", tt.name, r.status, e, direct.status, d)
			}
		}
	}
}

// TestPolicyRefusalsHandBackProbes: lb_policy llm without llm_admission
// answers a model no engine serves (404) and a prompt past its model's
// context (400) itself; either way it hands back the half-open breaker
// probe its candidate claimed, and a later attempt of the same request
// writes nothing more.
func TestPolicyRefusalsHandBackProbes(t *testing.T) {
	f := testFleet()
	defer f.Close()
	p := testPolicy(f, &Policy{BreakerFailures: 1, BreakerCooldown: caddy.Duration(time.Millisecond)})
	dial := deadDials[0]
	f.Registry().Ensure(dial).RecordModels([]upstreams.ServedModel{{ID: "model-a", MaxModelLen: 8}}, nil)
	pool, b := testPool(dial), f.Breaker()
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"unknown model", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound},
		{"too long", `{"model":"model-a","prompt":[1,2,3,4,5,6],"max_tokens":3}`, http.StatusBadRequest},
	} {
		b.Failure(dial, time.Now())
		testwait.For(t, 5*time.Second, "the breaker to be half-open", func() bool {
			return b.State(dial, time.Now()) == routing.StateHalfOpen
		})
		r, _, cancel := testRequest(t, tc.body)
		w := httptest.NewRecorder()
		if u := p.Select(pool, r, w); u != nil || w.Code != tc.status {
			t.Errorf("%s: picked %v, answered %d %s; want nil and %d", tc.name, u, w.Code, w.Body, tc.status)
		}
		if ok, probe := b.Admits(dial, time.Now()); !ok || !probe {
			t.Errorf("%s: the half-open probe was not handed back (admits %t, probe %t)", tc.name, ok, probe)
		}
		n := w.Body.Len()
		if u := p.Select(pool, r, w); u != nil || w.Body.Len() != n {
			t.Errorf("%s: a later attempt picked %v or wrote %q", tc.name, u, w.Body.String()[n:])
		}
		cancel()
	}
}

// mutableDNS answers A queries for any name with the addresses last set,
// and counts the queries, so a test can change what `dynamic a` resolves.
type mutableDNS struct {
	addr    string
	mu      sync.Mutex
	answers []dnsmessage.AResource
	queries int
}

// newMutableDNS serves until the test ends.
func newMutableDNS(t *testing.T) *mutableDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &mutableDNS{addr: pc.LocalAddr().String()}
	done := make(chan struct{})
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out, ok := d.answer(buf[:n]); ok {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return d
}

// set replaces the addresses answered.
func (d *mutableDNS) set(ips ...string) {
	answers := make([]dnsmessage.AResource, len(ips))
	for i, ip := range ips {
		answers[i] = dnsmessage.AResource{A: [4]byte(net.ParseIP(ip).To4())}
	}
	d.mu.Lock()
	d.answers = answers
	d.mu.Unlock()
}

// answer is the response to one query packet.
func (d *mutableDNS) answer(pkt []byte) ([]byte, bool) {
	var q dnsmessage.Message
	if err := q.Unpack(pkt); err != nil || len(q.Questions) != 1 {
		return nil, false
	}
	res := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: q.ID, Response: true, Authoritative: true, RecursionAvailable: true},
		Questions: q.Questions,
	}
	d.mu.Lock()
	d.queries++
	answers := d.answers
	d.mu.Unlock()
	if qq := q.Questions[0]; qq.Type == dnsmessage.TypeA {
		for _, a := range answers {
			res.Answers = append(res.Answers, dnsmessage.Resource{
				Header: dnsmessage.ResourceHeader{Name: qq.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1},
				Body:   &a,
			})
		}
	}
	out, err := res.Pack()
	return out, err == nil
}

func (d *mutableDNS) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queries
}

// TestModelsAcceptanceDNS is the acceptance test's dynamic part with
// engines found by DNS (`dynamic a`, re-resolved every 100ms) instead of
// listed in the llm app: an engine serving model-c appears in DNS.
//
// A gap it shows (logged, not asserted): requests for model-c alone do
// not make it routable behind llm_admission, which answers them 404
// model_not_found before reverse_proxy, so nothing resolves the name
// again or shows the pool the new engine. The first request of another
// model that reaches reverse_proxy does; model-c is then routable at
// once (admission fails open on the engine until its models are known).
func TestModelsAcceptanceDNS(t *testing.T) {
	forgetEngines(t)
	t.Cleanup(func() { resetGateway(t) })
	ips := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	port := mustFreePort(t, ips...)
	var engines []*vllmsim.Engine
	for i, model := range []string{"model-a", "model-b", "model-c"} {
		e, err := vllmsim.Start(context.Background(), vllmsim.Config{Model: model, Addr: fmt.Sprintf("%s:%d", ips[i], port), TimeScale: 200})
		if err != nil {
			t.Fatalf("engine on %s: %v (port taken meanwhile?)", ips[i], err)
		}
		engines = append(engines, e)
		t.Cleanup(func() { _ = e.Close() })
	}
	dns := newMutableDNS(t)
	dns.set(ips[:2]...)
	gateway{patient: true, pollInterval: acceptancePoll.String(), siteExtra: "\thandle /v1/models {\n\t\tllm_models\n\t}\n",
		dynamic: fmt.Sprintf("\t\tdynamic a sims.llmgw.test %d {\n\t\t\tresolvers %s\n\t\t\tversions ipv4\n\t\t\trefresh 100ms\n\t\t}\n", port, dns.addr),
	}.load(t)

	// A request without a model (any engine serves it) makes the policy
	// meet the engines; then their models are learned.
	anyModel := `{"max_tokens":1,"messages":[{"role":"user","content":"anyone?"}]}`
	mustSend(t, "", anyModel, nil)
	waitModelsLearned(t, engines[:2]...)
	tally := sendMixed(t, []string{"model-a", "model-b", "model-c"}, 150, 8)
	tally.expectStatus(t, []string{"model-a", "model-b"}, http.StatusOK, 50)
	tally.expectStatus(t, []string{"model-c"}, http.StatusNotFound, 50)
	checkServedOnly(t, engines)

	// For three re-resolve intervals, requests for model-c alone.
	dns.set(ips...)
	// Measured, not asserted: the 404s are a gap, not a promise.
	changed, queries := time.Now(), dns.count()
	statuses := map[int]int{}
	for i := 0; time.Since(changed) < 3*100*time.Millisecond; i++ {
		url, body := acceptanceBody("model-c", i)
		statuses[send(context.Background(), url, body, nil).status]++
	}
	t.Logf("for %v after the DNS change, model-c alone: statuses %v; DNS queries meanwhile: %d",
		time.Since(changed).Round(time.Millisecond), statuses, dns.count()-queries)

	// Then other traffic: each round one request any engine serves, then
	// one for model-c.
	first := time.Now()
	rounds := 0
	testwait.For(t, 10*time.Second, "model-c to be answered 200", func() bool {
		rounds++
		mustSend(t, "", anyModel, nil)
		url, body := acceptanceBody("model-c", rounds)
		return send(context.Background(), url, body, nil).status == http.StatusOK
	})
	t.Logf("with other traffic, model-c answered 200 %v (%d rounds) after its first request; %d DNS queries since the change (re-resolve every 100ms, poll_interval %v)",
		time.Since(first).Round(time.Millisecond), rounds, dns.count()-queries, acceptancePoll)
	tally = sendMixed(t, []string{"model-a", "model-b", "model-c"}, 150, 8)
	tally.expectStatus(t, []string{"model-a", "model-b", "model-c"}, http.StatusOK, 50)
	checkServedOnly(t, engines)
}
