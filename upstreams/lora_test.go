package upstreams

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestParseLoRAState: vllm:lora_requests_info's newest series is read, its
// adapter lists split, trimmed, de-duplicated and bounded; an absent or
// unusable series leaves the state unknown without failing the scrape.
func TestParseLoRAState(t *testing.T) {
	const info = "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"
	long := strings.Repeat("x", maxLoRANameLength+1)
	many := make([]string, maxLoRAAdapters+5)
	for i := range many {
		many[i] = "a" + strings.Repeat("b", i%7) + string(rune('A'+i%26)) + strings.Repeat("c", i/26)
	}
	tests := []struct {
		name  string
		lines string
		want  LoRAState
	}{
		{name: "absent (LoRA disabled)", lines: "", want: LoRAState{}},
		{
			name:  "vLLM's shape: one series, running and waiting",
			lines: info + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.7601234567e+09` + "\n",
			want:  LoRAState{MaxLoRA: 2, Running: []string{"a", "b"}, Waiting: []string{"c"}, Known: true},
		},
		{
			name: "several series: the newest value wins, wherever it is on the page",
			lines: info + `vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 100` + "\n" +
				`vllm:lora_requests_info{max_lora="4",running_lora_adapters="new1,new2",waiting_lora_adapters=""} 300` + "\n" +
				`vllm:lora_requests_info{max_lora="4",running_lora_adapters="middle",waiting_lora_adapters="w"} 200` + "\n",
			want: LoRAState{MaxLoRA: 4, Running: []string{"new1", "new2"}, Known: true},
		},
		{
			name:  "nothing in flight: empty lists",
			lines: info + `vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 5` + "\n",
			want:  LoRAState{MaxLoRA: 1, Known: true},
		},
		{
			name:  "labels missing, max_lora unparsable",
			lines: `vllm:lora_requests_info{max_lora="None"} 5` + "\n",
			want:  LoRAState{Known: true},
		},
		{
			name:  "blanks, empty entries and repeats",
			lines: `vllm:lora_requests_info{max_lora=" 3 ",running_lora_adapters=" a , ,b,a,, b ",waiting_lora_adapters=",,"} 5` + "\n",
			want:  LoRAState{MaxLoRA: 3, Running: []string{"a", "b"}, Known: true},
		},
		{
			name:  "an overlong name is dropped",
			lines: `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,` + long + `",waiting_lora_adapters=""} 5` + "\n",
			want:  LoRAState{MaxLoRA: 2, Running: []string{"a"}, Truncated: true, Known: true},
		},
		{
			name:  "too many adapters are cut",
			lines: `vllm:lora_requests_info{max_lora="2",running_lora_adapters="` + strings.Join(many, ",") + `",waiting_lora_adapters=""} 5` + "\n",
			want:  LoRAState{MaxLoRA: 2, Running: many[:maxLoRAAdapters], Truncated: true, Known: true},
		},
		{
			name: "a series with an unusable value is skipped",
			lines: `vllm:lora_requests_info{max_lora="2",running_lora_adapters="nan",waiting_lora_adapters=""} NaN` + "\n" +
				`vllm:lora_requests_info{max_lora="2",running_lora_adapters="ok",waiting_lora_adapters=""} 1` + "\n",
			want: LoRAState{MaxLoRA: 2, Running: []string{"ok"}, Known: true},
		},
		{
			name:  "only unusable values: unknown",
			lines: `vllm:lora_requests_info{max_lora="2",running_lora_adapters="x",waiting_lora_adapters=""} -1` + "\n",
			want:  LoRAState{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var scratch []byte
			g, err := parseGauges([]byte(prefillPage(tc.lines)), &scratch)
			if err != nil {
				t.Fatalf("the LoRA series must never fail a scrape: %v", err)
			}
			if !reflect.DeepEqual(g.LoRA, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", g.LoRA, tc.want)
			}
		})
	}
}

// TestEngineLoRA: the engine keeps the LoRA state of its last successful
// scrape, known only while its gauges are.
func TestEngineLoRA(t *testing.T) {
	r := NewRegistry(Options{ManualScrape: true, StaleAfter: 1})
	defer r.Close()
	e := r.Ensure("127.0.0.1:1")
	if s := e.LoRA(); s.Known {
		t.Fatalf("before any scrape: %+v", s)
	}
	e.StartScrape()(Gauges{LoRA: LoRAState{MaxLoRA: 2, Running: []string{"a"}, Known: true}})
	if s := e.LoRA(); !s.Known || s.MaxLoRA != 2 || len(s.Running) != 1 || s.Running[0] != "a" {
		t.Fatalf("after a scrape: %+v", s)
	}
	e.StartScrape()(Gauges{})
	if s := e.LoRA(); s.Known || s.Running != nil {
		t.Fatalf("after a scrape without the series: %+v", s)
	}
}

// TestEngineAdapter: where an engine stands for an adapter, from its last
// scrape and from the requests this gateway sent it since; a send counts
// as running until a scrape that began after it, and adapters sent but not
// yet scraped take slots.
func TestEngineAdapter(t *testing.T) {
	type step struct {
		scrape *LoRAState // a scrape recorded with this state (nil: none)
		send   []string   // adapters sent after it
		ask    string
		want   AdapterStanding
	}
	full := &LoRAState{MaxLoRA: 2, Running: []string{"a", "b"}, Waiting: []string{"c"}, Known: true}
	cases := []struct {
		name  string
		steps []step
	}{
		{"unknown: a free slot", []step{{ask: "a", want: AdapterStanding{FreeSlot: true}}}},
		{"from the scrape", []step{
			{scrape: full, ask: "a", want: AdapterStanding{Running: true}},
			{ask: "c", want: AdapterStanding{Waiting: true}},
			{ask: "d", want: AdapterStanding{}},
		}},
		{"a slot left", []step{
			{scrape: &LoRAState{MaxLoRA: 2, Running: []string{"a"}, Known: true}, ask: "d", want: AdapterStanding{FreeSlot: true}},
			{send: []string{"e"}, ask: "d", want: AdapterStanding{}},                                       // e took the slot
			{ask: "e", want: AdapterStanding{Running: true}},                                               // sent since the scrape
			{scrape: &LoRAState{MaxLoRA: 2, Known: true}, ask: "e", want: AdapterStanding{FreeSlot: true}}, // seen, and done
		}},
		{"max_lora unknown", []step{
			{scrape: &LoRAState{Running: []string{"a", "b", "c"}, Known: true}, ask: "d", want: AdapterStanding{FreeSlot: true}},
		}},
		{"the base model's name", []step{{send: []string{""}, ask: "", want: AdapterStanding{FreeSlot: true}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry(Options{ManualScrape: true})
			defer r.Close()
			e := r.Ensure("127.0.0.1:1")
			for i, s := range tc.steps {
				if s.scrape != nil {
					e.StartScrape()(Gauges{LoRA: *s.scrape})
				}
				for _, name := range s.send {
					e.SentAdapter(name)
				}
				if got := e.Adapter(s.ask); got != s.want {
					t.Errorf("step %d: %s: %+v, want %+v", i, s.ask, got, s.want)
				}
			}
		})
	}
}

// TestEngineSentAdapterBound: an engine remembers at most maxLoRAAdapters
// adapters sent to it; the sends a scrape has seen make room.
func TestEngineSentAdapterBound(t *testing.T) {
	r := NewRegistry(Options{ManualScrape: true})
	defer r.Close()
	e := r.Ensure("127.0.0.1:1")
	for i := range maxLoRAAdapters + 10 {
		e.SentAdapter(fmt.Sprint("adapter-", i))
	}
	if n := len(e.sentLoRA); n != maxLoRAAdapters {
		t.Fatalf("%d adapters remembered, want %d", n, maxLoRAAdapters)
	}
	if !e.Adapter("adapter-0").Running || e.Adapter(fmt.Sprint("adapter-", maxLoRAAdapters)).Running {
		t.Fatal("the first sends are kept, those past the bound dropped")
	}
	e.StartScrape()(Gauges{LoRA: LoRAState{MaxLoRA: 4, Known: true}})
	e.SentAdapter("late")
	if n := len(e.sentLoRA); n != 1 || !e.Adapter("late").Running {
		t.Fatalf("after a scrape: %d remembered, late running %v", n, e.Adapter("late").Running)
	}
}
