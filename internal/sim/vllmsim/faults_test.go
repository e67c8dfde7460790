package vllmsim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestMetricsFaults(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100})
	c := newClient(t)
	get := func(timeout time.Duration) (*http.Response, []byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL()+"/metrics", nil)
		resp, err := c.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	parses := func(b []byte) bool {
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		return err == nil && fams["vllm:num_requests_running"] != nil
	}
	cases := []struct {
		mode  string
		check func(t *testing.T)
	}{
		{"", func(t *testing.T) {
			resp, b, err := get(5 * time.Second)
			if err != nil || resp.StatusCode != 200 || !parses(b) {
				t.Fatalf("ok mode: %v %v", resp, err)
			}
		}},
		{"error", func(t *testing.T) {
			resp, _, err := get(5 * time.Second)
			if err != nil || resp.StatusCode != 500 {
				t.Fatalf("error mode: %v %v", resp, err)
			}
		}},
		{"hang", func(t *testing.T) {
			_, _, err := get(300 * time.Millisecond)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("hang mode answered: %v", err)
			}
		}},
		{"garbage", func(t *testing.T) {
			resp, b, err := get(5 * time.Second)
			if err != nil || resp.StatusCode != 200 || parses(b) {
				t.Fatalf("garbage mode: %v %v parses=%v", resp, err, parses(b))
			}
		}},
		{"html", func(t *testing.T) {
			resp, b, err := get(5 * time.Second)
			if err != nil || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !bytes.Contains(b, []byte("<html>")) || parses(b) {
				t.Fatalf("html mode: %v %v", resp, err)
			}
		}},
		{"huge", func(t *testing.T) {
			resp, err := c.Get(e.URL() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || n != 50<<20 {
				t.Fatalf("huge mode: %d bytes, %v", n, err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run("metrics="+tc.mode, func(t *testing.T) {
			e.SetFaults(Faults{Metrics: tc.mode})
			tc.check(t)
		})
	}
}

func TestTokenizeFaults(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100})
	c := newClient(t)
	// Durations are accepted as Go duration strings over the control API.
	if st, out := postJSON(t, c, e.URL()+"/sim/faults", map[string]any{"tokenize_delay": "300ms"}); st != 200 {
		t.Fatalf("set faults: %d %s", st, out)
	}
	if got := e.Faults().TokenizeDelay; got != 300*time.Millisecond {
		t.Fatalf("tokenize_delay %v", got)
	}
	if st, _ := postJSON(t, c, e.URL()+"/sim/faults", map[string]any{"tokenize_delay": "soon"}); st != 400 {
		t.Errorf("bad duration accepted: %d", st)
	}
	e.SetFaults(Faults{TokenizeDelay: 300 * time.Millisecond})
	start := time.Now()
	tokenizeReq(t, c, e, map[string]any{"prompt": "slow"})
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("tokenize answered after %v with a 300ms delay", d)
	}
	e.SetFaults(Faults{TokenizeFail: true})
	if st, out := postJSON(t, c, e.URL()+"/tokenize", map[string]any{"prompt": "x"}); st != 500 || !bytes.Contains(out, []byte(`"code":500`)) {
		t.Errorf("tokenize fail: %d %s", st, out)
	}
}

func TestError500Fault(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100})
	c := newClient(t)
	// Over the control API, as a gateway test would.
	if st, out := postJSON(t, c, e.URL()+"/sim/faults", map[string]any{"error_500": true}); st != 200 {
		t.Fatalf("set faults: %d %s", st, out)
	}
	for _, url := range []string{"/v1/completions", "/v1/chat/completions"} {
		st, out := postJSON(t, c, e.URL()+url, map[string]any{"prompt": "x", "messages": []any{map[string]any{"role": "user", "content": "x"}}})
		var er apiError
		if st != 500 || json.Unmarshal(out, &er) != nil || er.Error.Code != 500 || er.Error.Type != "InternalServerError" {
			t.Errorf("%s: %d %s", url, st, out)
		}
	}
	resp, err := c.Get(e.URL() + "/sim/faults")
	if err != nil {
		t.Fatal(err)
	}
	var f Faults
	_ = json.NewDecoder(resp.Body).Decode(&f)
	resp.Body.Close()
	if !f.Error500 {
		t.Errorf("GET /sim/faults = %+v", f)
	}
	if st, _ := postJSON(t, c, e.URL()+"/sim/faults", map[string]any{"metrics": "bogus"}); st != 400 {
		t.Errorf("bad fault accepted: %d", st)
	}
	if st, _ := postJSON(t, c, e.URL()+"/sim/faults", map[string]any{}); st != 200 {
		t.Error("clearing faults failed")
	}
	if st, out := postJSON(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": "x"}); st != 200 {
		t.Errorf("after clearing: %d %s", st, out)
	}
}

func TestDropStreamAfter(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100})
	c := newClient(t)
	e.SetFaults(Faults{DropStreamAfter: 3})
	b, _ := json.Marshal(map[string]any{"prompt": "cut me", "max_tokens": 10, "stream": true})
	resp, err := c.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events, err := sseEvents(t, resp.Body)
	if err == nil {
		t.Errorf("stream ended cleanly; want an abrupt close")
	}
	if len(events) != 3 {
		t.Errorf("%d events before the cut, want 3: %q", len(events), events)
	}
	for _, ev := range events {
		if ev == "[DONE]" {
			t.Error("[DONE] in a dropped stream")
		}
	}
	// The engine dropped the request too.
	deadline := time.Now().Add(10 * time.Second)
	for e.Stats().Running+e.Stats().Waiting > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("request still scheduled after the cut: %+v", e.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSeqGapFault(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0"}})
	c := newClient(t)
	sub := dialSub(t, e.KVEndpoint(), "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for i, p := range []string{"first prompt", "second prompt", "third prompt"} {
		if i == 1 {
			e.SetFaults(Faults{SeqGap: 5})
		}
		complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat(p+" ", 10), "max_tokens": 1})
		seqs = append(seqs, binary.BigEndian.Uint64(sub.next(t, 5*time.Second)[1]))
	}
	if seqs[0] != 0 || seqs[1] != 6 || seqs[2] != 7 {
		t.Errorf("seqs %v, want [0 6 7]", seqs)
	}
	if e.Faults().SeqGap != 0 {
		t.Error("SeqGap is not one-shot")
	}
}

func TestRestartOverControlAPI(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100})
	c := newClient(t)
	complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": "before", "max_tokens": 1})
	resp, err := c.Post(e.URL()+"/sim/restart", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, bufio.NewReader(resp.Body))
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("restart status %d", resp.StatusCode)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.Stats().Restarts != 1 {
		if time.Now().After(deadline) {
			t.Fatal("restart did not happen")
		}
		time.Sleep(5 * time.Millisecond)
	}
	complete(t, c, e.URL()+"/v1/completions", map[string]any{"prompt": "after", "max_tokens": 1})
	if st := e.Stats(); st.RequestsServed != 1 {
		t.Errorf("stats after restart %+v", st)
	}
}
