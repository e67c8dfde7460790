package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/llmgw/caddy-llmgw/internal/vllmsim"
)

// Helpers of the lb_policy llm integration tests (policy_*_test.go). They
// build on integration_helpers_test.go: one in-process Caddy reloaded by
// each test, simulated engines on loopback.

// policyGateway describes a gateway config for the policy tests. Unlike
// gatewayCaddyfile it sets KV endpoints per engine and can proxy to a
// different upstream list (or a dynamic source) than the llm app lists.
type policyGateway struct {
	engines   []*vllmsim.Engine // listed in the llm app (with kv_events unless kv overrides)
	kv        map[int]string    // per engine index: kv_events endpoint override; "-" = none
	app       string            // extra lines inside llm { }
	engine    string            // extra lines inside every engine { }
	admission string            // lines inside llm_admission { }; "-" omits the handler
	policy    string            // lines inside lb_policy llm { }; "-" uses round_robin
	proxy     string            // extra lines inside reverse_proxy { }
	upstreams []string          // upstream dials; default the engines' addresses
	dynamic   string            // when set, a `dynamic ...` block replaces the upstream list
}

func (g policyGateway) caddyfile() string {
	var b strings.Builder
	app := g.app
	if !strings.Contains(app, "tokenize_timeout") {
		// A loaded test machine must not time /tokenize out (500ms by
		// default) and push decisions the tests expect precise onto the
		// approximate tier.
		app += "\t\ttokenize_timeout 10s\n"
	}
	if !strings.Contains(app, "poll_timeout") {
		// Nor time scrapes out (the timeout defaults to the 50ms interval),
		// which makes gauges stale and load unknown.
		app += "\t\tpoll_timeout 2s\n"
	}
	fmt.Fprintf(&b, "{\n\tadmin %s\n\tskip_install_trust\n\thttp_port %d\n\thttps_port %d\n\tgrace_period 1ns\n\tllm {\n\t\tpoll_interval 50ms\n%s",
		adminAddr, httpPort, httpsPort, app)
	for i, e := range g.engines {
		fmt.Fprintf(&b, "\t\tengine %s {\n%s", e.Addr(), g.engine)
		ep, replay := e.KVEndpoint(), e.ReplayEndpoint()
		if o, ok := g.kv[i]; ok {
			ep, replay = o, ""
		}
		if ep != "" && ep != "-" {
			fmt.Fprintf(&b, "\t\t\tkv_events %s\n", ep)
			if replay != "" {
				fmt.Fprintf(&b, "\t\t\tkv_replay %s\n", replay)
			}
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}\n}\n\nhttp://" + gatewayAddr + " {\n")
	if g.admission != "-" {
		fmt.Fprintf(&b, "\tllm_admission {\n%s\t}\n", g.admission)
	}
	b.WriteString("\treverse_proxy")
	if g.dynamic == "" {
		ups := g.upstreams
		if ups == nil {
			for _, e := range g.engines {
				ups = append(ups, e.Addr())
			}
		}
		for _, u := range ups {
			b.WriteString(" " + u)
		}
	}
	b.WriteString(" {\n")
	if g.dynamic != "" {
		b.WriteString(g.dynamic)
	}
	if g.policy == "-" {
		b.WriteString("\t\tlb_policy round_robin\n")
	} else {
		fmt.Fprintf(&b, "\t\tlb_policy llm {\n%s\t\t}\n", g.policy)
	}
	fmt.Fprintf(&b, "\t\tflush_interval -1\n%s\t}\n}\n", g.proxy)
	return b.String()
}

// load reloads the shared Caddy with g.
func (g policyGateway) load(t testing.TB) {
	t.Helper()
	newTester(t, g.caddyfile())
	// The old config's server closes its idle connections: a request sent
	// on one as it closes fails with EOF (POSTs are not retried).
	client.CloseIdleConnections()
}

// words returns n distinct one-token words (" <tag><i>"), so a text of n
// words is about n tokens for the simulator's tokenizer.
func polWords(tag string, n int) string {
	var b strings.Builder
	b.Grow(n * (len(tag) + 7))
	for i := range n {
		fmt.Fprintf(&b, " %s%d", tag, i)
	}
	return b.String()
}

// polChat is a chat completion with a system prompt (the shared prefix)
// and a user message (the per-request suffix).
func polChat(system, user string, maxTokens int, stream bool) string {
	msgs := []map[string]string{}
	if system != "" {
		msgs = append(msgs, map[string]string{"role": "system", "content": system})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": user})
	b, _ := json.Marshal(map[string]any{
		"model":      "sim-model",
		"stream":     stream,
		"max_tokens": maxTokens,
		"messages":   msgs,
	})
	return string(b)
}

// polResult is one gateway response, read to the end.
type polResult struct {
	status   int
	upstream string // X-LLM-Upstream
	tier     string // X-LLM-Tier
	body     string
	err      error
}

// send posts body to url (the gateway when url is "") and reads the answer.
func polSend(ctx context.Context, url, body string, header map[string]string) polResult {
	if url == "" {
		url = "http://" + gatewayAddr + "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return polResult{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		return polResult{err: err}
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return polResult{status: res.StatusCode, upstream: res.Header.Get("X-LLM-Upstream"), tier: res.Header.Get("X-LLM-Tier"), body: string(raw), err: err}
}

// polMustSend is send that fails the test unless the answer is a 200.
func polMustSend(t testing.TB, url, body string, header map[string]string) polResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := polSend(ctx, url, body, header)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("POST %s: status %d, err %v, body %.300s", url, r.status, r.err, r.body)
	}
	return r
}

// direct sends a chat completion straight to an engine, bypassing the
// gateway (what another gateway or a direct caller would do).
func polDirect(t testing.TB, e *vllmsim.Engine, body string) polResult {
	t.Helper()
	return polMustSend(t, e.URL()+"/v1/chat/completions", body, nil)
}

// polWaitKV waits until the gateway's subscription to each engine is connected.
func polWaitKV(t testing.TB, engines ...*vllmsim.Engine) {
	t.Helper()
	for _, e := range engines {
		eventually(t, 15*time.Second, "KV subscription to "+e.Addr(), func() bool {
			r := getEngineReport(t, e.Addr())
			return r.KV != nil && r.KV.Connected
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := e.WaitKVSubscribers(ctx, 1)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// polWaitBlocks waits until /llm/engines shows at least n blocks held by dial.
func polWaitBlocks(t testing.TB, dial string, n int) engineReport {
	t.Helper()
	var r engineReport
	eventually(t, 15*time.Second, fmt.Sprintf("%d KV blocks on %s", n, dial), func() bool {
		r = getEngineReport(t, dial)
		return r.KV != nil && r.KV.Blocks >= n
	})
	return r
}

// polWaitGauges waits until the gateway's view of dial satisfies cond.
func polWaitGauges(t testing.TB, dial, what string, cond func(engineReport) bool) {
	t.Helper()
	eventually(t, 15*time.Second, what, func() bool { return cond(getEngineReport(t, dial)) })
}

// counts tallies results by upstream.
func polCounts(rs []polResult) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		m[r.upstream]++
	}
	return m
}

// polParallel runs n calls of fn with at most conc at once and returns
// their results in call order. fn runs on other goroutines: it must not
// call t.Fatal (use polSend and check the results).
func polParallel(n, conc int, fn func(i int) polResult) []polResult {
	out := make([]polResult, n)
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = fn(i)
		}()
	}
	wg.Wait()
	return out
}

// polDNSServer answers A queries for any name with ips (and nothing else), so
// `dynamic a` can discover several loopback engines under one name: this
// machine's /etc/hosts maps localhost to 127.0.0.1 only. It serves until the
// test ends and returns its "host:port".
func polDNSServer(t testing.TB, ips ...string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		pc.Close()
		<-done
	})
	var answers []dnsmessage.AResource
	for _, ip := range ips {
		a := net.ParseIP(ip).To4()
		if a == nil {
			t.Fatalf("not an IPv4 address: %s", ip)
		}
		answers = append(answers, dnsmessage.AResource{A: [4]byte(a)})
	}
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var q dnsmessage.Message
			if err := q.Unpack(buf[:n]); err != nil || len(q.Questions) != 1 {
				continue
			}
			res := dnsmessage.Message{
				Header:    dnsmessage.Header{ID: q.ID, Response: true, Authoritative: true, RecursionAvailable: true},
				Questions: q.Questions,
			}
			if qq := q.Questions[0]; qq.Type == dnsmessage.TypeA {
				for _, a := range answers {
					res.Answers = append(res.Answers, dnsmessage.Resource{
						Header: dnsmessage.ResourceHeader{Name: qq.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
						Body:   &a,
					})
				}
			}
			out, err := res.Pack()
			if err != nil {
				continue
			}
			_, _ = pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String()
}

// polTCPProxy forwards a local port to target until closed: a KV-event path
// the test can cut while the engine keeps running.
type polTCPProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newPolTCPProxy(t testing.TB, target string) *polTCPProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &polTCPProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(p.close)
	return p
}

// endpoint is the proxy's ZeroMQ endpoint.
func (p *polTCPProxy) endpoint() string { return "tcp://" + p.ln.Addr().String() }

// close stops accepting and cuts every forwarded connection.
func (p *polTCPProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// polExplain is /llm/explain's answer for body, for failure messages.
func polExplain(t testing.TB, body string) string {
	t.Helper()
	var v any
	adminJSON(t, http.MethodPost, "/llm/explain", body, &v)
	b, _ := json.Marshal(v)
	return string(b)
}

// polSortedKeys returns m's keys in order, for stable messages.
func polSortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
