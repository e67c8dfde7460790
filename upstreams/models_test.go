package upstreams

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// TestParseModels: /v1/models bodies as vLLM writes them parse into the
// served models; anything else is a clear error, never a panic and never
// an engine that seems to serve nothing.
func TestParseModels(t *testing.T) {
	const llama = "meta-llama/Llama-3.1-8B-Instruct"
	entry := func(fields string) string { return `{"object":"list","data":[{` + fields + `}]}` }
	tests := []struct {
		name    string
		body    string
		want    []ServedModel
		wantErr string
	}{
		{
			name: "vLLM with a LoRA adapter: parent set, max_model_len null",
			body: string(readFixture(t, "vllm_models_lora.json")),
			want: []ServedModel{{ID: llama, Root: llama, MaxModelLen: 131072}, {ID: "sql-lora", Root: "/adapters/sql-lora", Parent: llama}},
		},
		{
			name: "several served names for one model (--served-model-name a b)",
			body: `{"object":"list","data":[` +
				`{"id":"a","object":"model","created":1,"owned_by":"vllm","root":"/models/m","parent":null,"max_model_len":8192,"permission":[]},` +
				`{"id":"b","object":"model","created":1,"owned_by":"vllm","root":"/models/m","parent":null,"max_model_len":8192,"permission":[]}]}`,
			want: []ServedModel{{ID: "a", Root: "/models/m", MaxModelLen: 8192}, {ID: "b", Root: "/models/m", MaxModelLen: 8192}},
		},
		{
			name: "missing max_model_len, root and parent; object fields absent",
			body: `{"data":[{"id":"m"}]}`,
			want: []ServedModel{{ID: "m"}},
		},
		{name: "an empty list: serves nothing", body: `{"object":"list","data":[]}`, want: []ServedModel{}},
		{
			name: "a repeated id keeps the first entry",
			body: `{"data":[{"id":"m","max_model_len":1},{"id":"m","max_model_len":2}]}`,
			want: []ServedModel{{ID: "m", MaxModelLen: 1}},
		},
		{name: "invalid JSON", body: `{"object":"list","data":[{"id":"m"}`, wantErr: "parse models"},
		{name: "HTML", body: "<html>sign in</html>", wantErr: "looks like HTML"},
		{name: "trailing garbage", body: `{"data":[]} {}`, wantErr: "parse models"},
		{name: "no data", body: `{"object":"list"}`, wantErr: "no data array"},
		{name: "null data", body: `{"object":"list","data":null}`, wantErr: "no data array"},
		{name: "JSON null", body: `null`, wantErr: "no data array"},
		{name: "a top-level array", body: `[{"id":"m"}]`, wantErr: "cannot unmarshal"},
		{name: "not a list", body: `{"object":"error","data":[]}`, wantErr: `object "error"`},
		{name: "data not an array", body: `{"data":{"id":"m"}}`, wantErr: "cannot unmarshal"},
		{name: "an entry not an object", body: `{"data":["m"]}`, wantErr: "cannot unmarshal"},
		{name: "a null entry", body: `{"data":[null]}`, wantErr: "entry 0: no id"},
		{name: "id a number", body: entry(`"id":7`), wantErr: "cannot unmarshal"},
		{name: "empty id", body: entry(`"id":" "`), wantErr: "no id"},
		{name: "overlong id", body: entry(`"id":"` + strings.Repeat("x", maxModelIDLength+1) + `"`), wantErr: "at most"},
		{name: "object not a model", body: entry(`"id":"m","object":"file"`), wantErr: `object "file"`},
		{name: "max_model_len a string", body: entry(`"id":"m","max_model_len":"4096"`), wantErr: "cannot unmarshal"},
		{name: "max_model_len fractional", body: entry(`"id":"m","max_model_len":4096.5`), wantErr: "cannot unmarshal"},
		{name: "max_model_len negative", body: entry(`"id":"m","max_model_len":-1`), wantErr: "out of range"},
		{name: "max_model_len huge", body: entry(`"id":"m","max_model_len":1e12`), wantErr: "cannot unmarshal"},
		{name: "parent a number", body: entry(`"id":"m","parent":1`), wantErr: "cannot unmarshal"},
		{name: "root an object", body: entry(`"id":"m","root":{}`), wantErr: "cannot unmarshal"},
		{name: "too many models", body: `{"data":[` + strings.Repeat(`{"id":"m"},`, maxServedModels) + `{"id":"m"}]}`, wantErr: "at most 1024"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseModels([]byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q (got %+v)", err, tc.wantErr, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDefaultModelsURL(t *testing.T) {
	for metrics, want := range map[string]string{
		"http://10.0.0.1:8000/metrics":               "http://10.0.0.1:8000/v1/models",
		"https://u:p@engine.example/metrics/":        "https://u:p@engine.example/v1/models",
		"https://gw.example/pool-a/e1/metrics?x=1#f": "https://gw.example/pool-a/e1/v1/models",
		"http://10.0.0.1:9090/prometheus":            "http://10.0.0.1:9090/v1/models",
	} {
		if got := defaultModelsURL(metrics); got != want {
			t.Errorf("defaultModelsURL(%q) = %q, want %q", metrics, got, want)
		}
	}
	c := EngineConfig{Dial: "10.0.0.1:8000"}.withDefaults()
	if c.ModelsURL != "http://10.0.0.1:8000/v1/models" {
		t.Errorf("default ModelsURL %q", c.ModelsURL)
	}
}

func TestValidateModelNames(t *testing.T) {
	for _, bad := range [][]string{{""}, {" m"}, {"m", "m"}, {strings.Repeat("x", maxModelIDLength+1)}} {
		if err := (EngineConfig{Dial: "h:1", Models: bad}).Validate(); err == nil {
			t.Errorf("Models %q validated", bad)
		}
	}
	if err := (EngineConfig{Dial: "h:1", Models: []string{"base", "lora-a"}}).Validate(); err != nil {
		t.Error(err)
	}
	if err := (EngineConfig{Dial: "h:1", ModelsURL: "ftp://h/v1/models"}).Validate(); err == nil {
		t.Error("an ftp ModelsURL validated")
	}
}

// TestEngineModelsRecorded: a failed fetch keeps the last good list and
// shows its error; an engine without /v1/models falls back to configured
// names; Serving finds engines by base or adapter id.
func TestEngineModelsRecorded(t *testing.T) {
	r := NewRegistry(Options{ManualScrape: true})
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: "127.0.0.1:1", Models: []string{"cfg-model"}}, {Dial: "127.0.0.1:2"}}, Options{})
	a, _ := r.Get("127.0.0.1:1")
	b, _ := r.Get("127.0.0.1:2")
	if m := a.Models(); !m.Configured || !m.Serves("cfg-model") || m.Serves("base") {
		t.Fatalf("before discovery: %+v", m)
	}
	if m := b.Models(); m.List != nil || m.Configured {
		t.Fatalf("nothing known: %+v", m)
	}
	a.RecordModels(nil, errors.Join(ErrModelsUnavailable, errors.New("HTTP 404")))
	if m := a.Models(); !m.Unavailable || m.Error != "" || !m.Configured || m.CheckedAt.IsZero() {
		t.Fatalf("without /v1/models: %+v", m)
	}

	learned := []ServedModel{{ID: "base", MaxModelLen: 4096}, {ID: "lora-a", Parent: "base"}}
	a.RecordModels(learned, nil)
	b.RecordModels(learned[:1], nil)
	learned[0].ID = "mutated" // the engine keeps its own copy
	m := a.Models()
	if m.Configured || m.Unavailable || len(m.List) != 2 || m.List[0].ID != "base" || m.LearnedAt.IsZero() || m.Serves("cfg-model") {
		t.Fatalf("discovered: %+v", m)
	}
	a.RecordModels(nil, errors.New("parse models: boom"))
	if m := a.Models(); m.Error != "parse models: boom" || len(m.List) != 2 {
		t.Fatalf("after a bad body: %+v, want the last good list and the error", m)
	}
	if got := strings.Join(dials(r.Serving("base")), " "); got != "127.0.0.1:1 127.0.0.1:2" {
		t.Fatalf("Serving(base) = %s", got)
	}
	if got := strings.Join(dials(r.Serving("lora-a")), " "); got != "127.0.0.1:1" {
		t.Fatalf("Serving(lora-a) = %s", got)
	}
	if got := r.Serving("cfg-model"); len(got) != 0 {
		t.Fatalf("Serving(cfg-model) = %v: discovered names win", dials(got))
	}
	a.RecordModels([]ServedModel{{ID: "base", MaxModelLen: 4096}, {ID: "lora-a", Parent: "base"}}, nil)
	if m2 := a.Models(); &m2.List[0] != &m.List[0] || m2.Error != "" {
		t.Fatalf("an unchanged list must keep the shared slice and clear the error: %+v", m2)
	}
}

// FuzzParseModels: no body makes parseModels panic, and what it accepts
// keeps its bounds.
func FuzzParseModels(f *testing.F) {
	f.Add(readFixture(f, "vllm_models_lora.json"))
	f.Add([]byte(`{"data":[{"id":"m","max_model_len":1}]}`))
	f.Add([]byte(`{"data":[null]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		list, err := parseModels(body)
		if err != nil {
			return
		}
		if len(list) > maxServedModels {
			t.Fatalf("%d models", len(list))
		}
		for _, m := range list {
			if m.ID == "" || len(m.ID) > maxModelIDLength || m.MaxModelLen < 0 {
				t.Fatalf("accepted %+v", m)
			}
		}
	})
}

// TestModelsPending: an engine's models are pending only until something
// is known of them: a configured list, a fetch (answered, failed or not
// served), or a failed poll.
func TestModelsPending(t *testing.T) {
	cases := []struct {
		name string
		cfg  EngineConfig
		then func(e *Engine)
		want bool
	}{
		{"new", EngineConfig{}, func(*Engine) {}, true},
		{"scraped, not fetched yet", EngineConfig{}, func(e *Engine) { e.StartScrape()(Gauges{}) }, true},
		{"configured", EngineConfig{Models: []string{"m"}}, func(*Engine) {}, false},
		{"learned", EngineConfig{}, func(e *Engine) { e.RecordModels([]ServedModel{{ID: "m"}}, nil) }, false},
		{"not served", EngineConfig{}, func(e *Engine) { e.RecordModels(nil, ErrModelsUnavailable) }, false},
		{"fetch failed", EngineConfig{}, func(e *Engine) { e.RecordModels(nil, errors.New("boom")) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry(Options{ManualScrape: true})
			defer r.Close()
			tc.cfg.Dial = "127.0.0.1:1"
			r.Apply([]EngineConfig{tc.cfg}, Options{})
			e, _ := r.Get(tc.cfg.Dial)
			tc.then(e)
			if got := e.ModelStanding("m").Pending; got != tc.want {
				t.Errorf("pending %v, want %v", got, tc.want)
			}
		})
	}
	// An engine whose polls fail is not pending: nothing will be learned
	// of it soon.
	r := NewRegistry(Options{PollInterval: 10 * time.Millisecond, PollTimeout: 10 * time.Millisecond})
	defer r.Close()
	r.Apply([]EngineConfig{{Dial: "127.0.0.1:1", MetricsURL: "http://127.0.0.1:1/metrics"}}, Options{PollInterval: 10 * time.Millisecond, PollTimeout: 10 * time.Millisecond})
	e, _ := r.Get("127.0.0.1:1")
	testwait.For(t, 5*time.Second, "a failed poll", func() bool { return e.Load().Failures > 0 })
	if e.ModelStanding("m").Pending {
		t.Error("pending after a failed poll")
	}
}
