package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
)

// countingTokenizer is a /tokenize endpoint that counts its open
// connections and the calls it answered (with three fixed token ids: the
// tests here are about connections, not routing).
type countingTokenizer struct {
	srv   *httptest.Server
	open  atomic.Int64
	calls atomic.Int64
}

func newCountingTokenizer(t *testing.T) *countingTokenizer {
	c := &countingTokenizer{}
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"count":3,"max_model_len":8192,"tokens":[1,2,3]}`)
	}))
	c.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			c.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			c.open.Add(-1)
		}
	}
	c.srv.Start()
	t.Cleanup(c.srv.Close)
	return c
}

// TestFleetLifecycleClosesTokenizeConnections: the tokenizer's keep-alive
// connections to an engine's /tokenize do not outlive it. A reload that
// changes the tokenizer's settings closes the old one's connections, and a
// reload that removes the llm app (destroying the fleet) closes the
// current one's — rather than leaving them idle for the transport's 90s.
func TestFleetLifecycleClosesTokenizeConnections(t *testing.T) {
	relNoLLMApp(t)
	t.Cleanup(func() { resetGateway(t) })
	engine := startEngines(t, 1, vllmsim.Config{TimeScale: 100})[0]
	tok := newCountingTokenizer(t)
	g := gateway{
		engines:   []gatewayEngine{{dial: engine.Addr(), extra: "\t\t\ttokenize " + tok.srv.URL + "/tokenize\n"}},
		appExtra:  "\t\ttokenize_timeout 10s\n\t\tpoll_timeout 2s\n",
		admission: "-",
		policy:    "\t\t\tdebug_headers\n",
	}
	sendThree := func(what string) {
		t.Helper()
		before := tok.calls.Load()
		for i := range 3 {
			mustSend(t, "", chatBody(false, fmt.Sprintf("%s %d", what, i)), nil)
		}
		if tok.calls.Load() == before {
			t.Fatalf("%s: the policy did not call the tokenize endpoint", what)
		}
		if tok.open.Load() == 0 {
			t.Fatalf("%s: no connection to the tokenize endpoint is open: keep-alive off?", what)
		}
	}

	g.load(t)
	sendThree("first config")
	// New tokenizer settings take a new tokenizer: the old one's idle
	// connections go at once.
	g.appExtra = "\t\ttokenize_timeout 10s\n\t\tpoll_timeout 2s\n\t\ttokenize_concurrency 8\n"
	g.load(t)
	testwait.For(t, 10*time.Second, "the replaced tokenizer's connections closed", func() bool { return tok.open.Load() == 0 })
	sendThree("second config")
	// No config uses the llm app: the fleet is destroyed, its tokenizer's
	// connections with it.
	relNoLLMApp(t)
	testwait.For(t, 10*time.Second, "the destroyed fleet's tokenize connections closed", func() bool { return tok.open.Load() == 0 })
}
