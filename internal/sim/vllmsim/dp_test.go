package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func startDP(t *testing.T, cfg Config) *DPServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := StartDataParallel(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

// postRank posts a one-token completion of prompt to d, with rank in
// RankHeader (none when ""), and returns the status.
func postRank(t *testing.T, c *http.Client, d *DPServer, prompt string, rank string) int {
	t.Helper()
	st, _ := postPath(t, c, d, "/v1/completions", prompt, rank)
	return st
}

// postPath posts prompt to path on d, with rank in RankHeader (none when
// ""), and returns the status and the ServedRankHeader of the answer.
func postPath(t *testing.T, c *http.Client, d *DPServer, path, prompt string, rank string) (int, string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
	req, err := http.NewRequest(http.MethodPost, d.URL()+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if rank != "" {
		req.Header.Set(RankHeader, rank)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = bytes.NewBuffer(nil).ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header.Get(ServedRankHeader)
}

func served(d *DPServer) []uint64 {
	var out []uint64
	for _, e := range d.Ranks() {
		out = append(out, e.Stats().RequestsByEndpoint["/v1/completions"])
	}
	return out
}

// TestDataParallel: three ranks behind one port. A pinned request runs on
// its rank, whose events name it on its own port, and is answered with
// the rank's ServedRankHeader; unpinned ones go round robin; a rank the
// server lacks is refused; tokenization is no rank request; /metrics is
// one valid page with every rank's series under its `engine` label.
func TestDataParallel(t *testing.T) {
	d := startDP(t, Config{TimeScale: 100, DataParallelSize: 3, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0"}})
	if len(d.Ranks()) != 3 {
		t.Fatalf("%d ranks", len(d.Ranks()))
	}
	c := newClient(t)
	sub := dialSub(t, d.Ranks()[2].KVEndpoint(), "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Ranks()[2].WaitKVSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if st := postRank(t, c, d, strings.Repeat("pinned to rank two ", 8), "2"); st != http.StatusOK {
		t.Fatalf("status %d", st)
	}
	if got := served(d); !slices.Equal(got, []uint64{0, 0, 1}) {
		t.Fatalf("served by rank %v, want rank 2 only", got)
	}
	if b := decodeBatch(t, sub.next(t, 5*time.Second)[2]); b.rank != 2 || len(b.events) == 0 {
		t.Fatalf("rank 2's batch names rank %d with %d events", b.rank, len(b.events))
	}
	for i := range 3 {
		if st := postRank(t, c, d, strings.Repeat("spread ", 8+i), ""); st != http.StatusOK {
			t.Fatalf("status %d", st)
		}
	}
	if got := served(d); !slices.Equal(got, []uint64{1, 1, 2}) {
		t.Fatalf("served by rank %v after three unpinned, want one more each", got)
	}
	for _, bad := range []string{"3", "-1", "x"} {
		if st := postRank(t, c, d, "no such rank", bad); st != http.StatusBadRequest {
			t.Fatalf("rank %q: status %d, want 400", bad, st)
		}
	}
	if st, served := postPath(t, c, d, "/v1/completions", "pinned to rank one", "1"); st != http.StatusOK || served != "1" {
		t.Fatalf("pinned to rank 1: status %d, served by rank %q", st, served)
	}
	// vLLM's API server tokenizes without a rank: not a rank request.
	if st, _ := postPath(t, c, d, "/tokenize", "count me not", ""); st != http.StatusOK {
		t.Fatalf("/tokenize: status %d", st)
	}
	if p, u, r := d.Pinned(), d.Unpinned(), d.Refused(); !slices.Equal(p, []uint64{0, 1, 1}) || u != 3 || r != 3 {
		t.Fatalf("pinned %v unpinned %d refused %d, want [0 1 1], 3 and 3", p, u, r)
	}

	resp, err := c.Get(d.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("merged page does not parse: %v", err)
	}
	var engines []string
	for _, m := range fams["vllm:num_requests_running"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "engine" {
				engines = append(engines, l.GetValue())
			}
		}
	}
	if !slices.Equal(engines, []string{"0", "1", "2"}) {
		t.Fatalf("engine labels %v", engines)
	}
	if n := len(fams["vllm:cache_config_info"].GetMetric()); n != 3 {
		t.Fatalf("%d cache_config_info series, want one per rank", n)
	}
}

// TestStartRefusesDataParallel: Start runs one engine only.
func TestStartRefusesDataParallel(t *testing.T) {
	if _, err := Start(context.Background(), Config{DataParallelSize: 2}); err == nil || !strings.Contains(err.Error(), "StartDataParallel") {
		t.Fatalf("err %v", err)
	}
}

// TestDataParallelSleep: POST /sleep and /wake_up on the shared port put
// every rank to sleep and wake them all, as vLLM's API server does; a
// bad level is refused and changes nothing.
func TestDataParallelSleep(t *testing.T) {
	d := startDP(t, Config{TimeScale: 100, DataParallelSize: 2})
	c := newClient(t)
	levels := func() []int {
		var out []int
		for _, e := range d.Ranks() {
			out = append(out, e.SleepLevel())
		}
		return out
	}
	for _, step := range []struct {
		path string
		want []int
	}{{"/sleep?level=1", []int{1, 1}}, {"/wake_up", []int{0, 0}}} {
		resp, err := c.Post(d.URL()+step.path, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !slices.Equal(levels(), step.want) {
			t.Fatalf("POST %s: status %d, levels %v, want %v", step.path, resp.StatusCode, levels(), step.want)
		}
	}
	resp, err := c.Post(d.URL()+"/sleep?level=x", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !slices.Equal(levels(), []int{0, 0}) {
		t.Fatalf("bad level: status %d, levels %v", resp.StatusCode, levels())
	}
}
