package fleet

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestRankConfigs: an engine with data_parallel_size 3 is three registry
// engines keyed dial#r, sharing the address's metrics and tokenize URLs,
// each reading its rank's `engine` label and subscribing to the KV-event
// and replay ports + r with its rank checked; an engine without it stays
// one engine keyed by its dial.
func TestRankConfigs(t *testing.T) {
	c := Config{KVReplayPort: 6000, Engines: []*EngineConfig{
		{Dial: "10.0.0.1:8000", DataParallelSize: 3, KVEvents: "tcp://10.0.0.1:5557", MaxInflight: 8},
		{Dial: "10.0.0.2:8000"},
	}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range c.engineConfigs() {
		kc := kvFromAttrs(e.Attrs)
		got = append(got, fmt.Sprintf("%s metrics=%s tokenize=%s label=%q kv=%s replay=%s rank=%v/%d max=%d",
			e.Dial, e.MetricsURL, e.TokenizeURL, e.EngineLabel, kc.Endpoint, kc.Replay, kc.HasRank, kc.Rank, e.MaxInflight))
	}
	want := []string{
		`10.0.0.1:8000#0 metrics=http://10.0.0.1:8000/metrics tokenize=http://10.0.0.1:8000/tokenize label="0" kv=tcp://10.0.0.1:5557 replay=tcp://10.0.0.1:6000 rank=true/0 max=8`,
		`10.0.0.1:8000#1 metrics=http://10.0.0.1:8000/metrics tokenize=http://10.0.0.1:8000/tokenize label="1" kv=tcp://10.0.0.1:5558 replay=tcp://10.0.0.1:6001 rank=true/1 max=8`,
		`10.0.0.1:8000#2 metrics=http://10.0.0.1:8000/metrics tokenize=http://10.0.0.1:8000/tokenize label="2" kv=tcp://10.0.0.1:5559 replay=tcp://10.0.0.1:6002 rank=true/2 max=8`,
		`10.0.0.2:8000 metrics= tokenize= label="" kv= replay= rank=false/0 max=0`, // no events: no replay,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("registry configs:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	f := New(zap.NewNop(), Options{ManualScrape: true})
	t.Cleanup(f.Close)
	g := f.NewGeneration(c, zap.NewNop())
	f.Start(g)
	t.Cleanup(func() { f.Stop(g) })
	if ks := f.Ranks("10.0.0.1:8000"); !slices.Equal(ks, []string{"10.0.0.1:8000#0", "10.0.0.1:8000#1", "10.0.0.1:8000#2"}) {
		t.Fatalf("Ranks = %v", ks)
	}
	if ks := f.Ranks("10.0.0.2:8000"); ks != nil {
		t.Fatalf("Ranks of an engine without ranks = %v, want nil", ks)
	}
	if r, ok := f.RankOf("10.0.0.1:8000#2"); !ok || r != (Rank{Dial: "10.0.0.1:8000", Index: 2}) {
		t.Fatalf("RankOf = %+v, %v", r, ok)
	}
	if _, ok := f.RankOf("10.0.0.2:8000"); ok {
		t.Fatal("an engine without ranks is a rank")
	}
	plain := []string{"10.0.0.2:8000", "10.0.0.9:8000"}
	if got := f.EngineKeys(plain); &got[0] != &plain[0] {
		t.Fatalf("EngineKeys of dials without ranks = %v, a copy", got)
	}
	if got := f.EngineKeys([]string{"10.0.0.2:8000", "10.0.0.1:8000"}); !slices.Equal(got, []string{"10.0.0.2:8000", "10.0.0.1:8000#0", "10.0.0.1:8000#1", "10.0.0.1:8000#2"}) {
		t.Fatalf("EngineKeys = %v", got)
	}
	for _, k := range []string{"10.0.0.1:8000#0", "10.0.0.1:8000#2", "10.0.0.2:8000"} {
		if _, ok := f.registry.Get(k); !ok {
			t.Fatalf("registry has no engine %s", k)
		}
	}
}

// TestRankConfigErrors: sizes out of range, a '#' in a dial, and a rank
// whose offset port would pass 65535 are refused at validation.
func TestRankConfigErrors(t *testing.T) {
	tests := []struct {
		e    EngineConfig
		want string
	}{
		{EngineConfig{Dial: "h:1", DataParallelSize: -1}, "data_parallel_size"},
		{EngineConfig{Dial: "h:1", DataParallelSize: MaxDataParallelSize + 1}, "data_parallel_size"},
		{EngineConfig{Dial: "h:1#2"}, "'#'"},
		{EngineConfig{Dial: "h:1", DataParallelSize: 4, KVEvents: "tcp://h:65534"}, "port of rank 2 out of range"},
		{EngineConfig{Dial: "h:1", DataParallelSize: 2, KVEvents: "tcp://h:5557", KVReplay: "tcp://h:x"}, "kv_replay"},
	}
	for _, tc := range tests {
		c := Config{Engines: []*EngineConfig{&tc.e}}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want one naming %q", tc.e, err, tc.want)
		}
	}
}
