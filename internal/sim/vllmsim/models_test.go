package vllmsim

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
)

func TestModelAliasesConfig(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		wantErr string // "" = valid
	}{
		{"two aliases", Config{Model: "m", ModelAliases: []string{"m-v1", "org/m"}, LoRAModules: []string{"sql"}}, ""},
		{"empty", Config{ModelAliases: []string{""}}, "model alias name is empty"},
		{"twice", Config{ModelAliases: []string{"x", "x"}}, `model alias "x" is listed twice`},
		{"the model's own name", Config{Model: "m", ModelAliases: []string{"m"}}, `model alias "m" has the name of the base model`},
		{"an adapter's name", Config{ModelAliases: []string{"sql"}, LoRAModules: []string{"sql"}}, `lora module "sql" has the name of a model alias`},
		{"too many", Config{ModelAliases: manyNames(maxModelAliases + 1)}, "model aliases, at most"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.withDefaults()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("withDefaults: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("withDefaults error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	names := []string{"a1"}
	e := startEngine(t, Config{TimeScale: 100, ModelAliases: names})
	names[0] = "changed"
	if got := e.Config().ModelAliases; len(got) != 1 || got[0] != "a1" {
		t.Errorf("Config().ModelAliases = %q after the caller changed its slice", got)
	}
}

// TestModelAliasesServed: every served name of the base model is listed and
// accepted, and responses report the first, as vLLM's --served-model-name
// does.
func TestModelAliasesServed(t *testing.T) {
	e := startEngine(t, Config{Model: "m", ModelAliases: []string{"m-v1", "org/m"}, LoRAModules: []string{"sql"}, TimeScale: 100, MaxModelLen: 2048})
	c := newClient(t)

	resp, err := c.Get(e.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID          string  `json:"id"`
			Root        string  `json:"root"`
			Parent      *string `json:"parent"`
			MaxModelLen *int    `json:"max_model_len"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) != 4 {
		t.Fatalf("models %+v (%v)", models, err)
	}
	for i, id := range []string{"m", "m-v1", "org/m"} {
		if m := models.Data[i]; m.ID != id || m.Root != "m" || m.Parent != nil || m.MaxModelLen == nil || *m.MaxModelLen != 2048 {
			t.Errorf("card %d: %+v, want the base model as %q", i, m, id)
		}
	}
	if m := models.Data[3]; m.ID != "sql" || m.Parent == nil || *m.Parent != "m" {
		t.Errorf("adapter card %+v", m)
	}

	msgs := []any{map[string]any{"role": "user", "content": "hi"}}
	for _, tc := range []struct{ model, want string }{{"m", "m"}, {"m-v1", "m"}, {"org/m", "m"}, {"sql", "sql"}} {
		for _, url := range []string{"/v1/completions", "/v1/chat/completions"} {
			st, out := postJSON(t, c, e.URL()+url, map[string]any{"model": tc.model, "prompt": "hi", "messages": msgs, "max_tokens": 1})
			var r modelResp
			if st != http.StatusOK || json.Unmarshal(out, &r) != nil || r.Model != tc.want {
				t.Errorf("%s model %q: %d %s, want model %q", url, tc.model, st, out, tc.want)
			}
		}
		body := map[string]any{"model": tc.model, "prompt": "hi", "max_tokens": 1, "stream": true}
		for i, ch := range streamChunks(t, c, e.URL()+"/v1/completions", body) {
			var r modelResp
			if err := json.Unmarshal([]byte(ch), &r); err != nil || r.Model != tc.want {
				t.Errorf("stream for %q: chunk %d model %q, want %q", tc.model, i, r.Model, tc.want)
			}
		}
		if toks := tokenizeReq(t, c, e, map[string]any{"model": tc.model, "prompt": "hi"}); len(toks) == 0 {
			t.Errorf("tokenize with %q: no tokens", tc.model)
		}
	}
}

// TestUnknownModelIs404: the body is vLLM's, byte for byte.
func TestUnknownModelIs404(t *testing.T) {
	e := startEngine(t, Config{Model: "m", ModelAliases: []string{"m-v1"}, LoRAModules: []string{"sql"}, TimeScale: 100})
	c := newClient(t)
	for _, tc := range []struct{ url, model string }{
		{"/v1/completions", "other"},
		{"/v1/chat/completions", "M"},
		{"/tokenize", "m-v2"},
		{"/v1/completions", "a `quoted` \"name\""},
	} {
		body := map[string]any{"model": tc.model, "prompt": "x"}
		if tc.url == "/v1/chat/completions" {
			body = map[string]any{"model": tc.model, "messages": []any{map[string]any{"role": "user", "content": "x"}}}
		}
		st, out := postJSON(t, c, e.URL()+tc.url, body)
		msg, _ := json.Marshal("The model `" + tc.model + "` does not exist.")
		want := `{"error":{"message":` + string(msg) + `,"type":"NotFoundError","param":"model","code":404}}`
		if st != http.StatusNotFound || string(out) != want {
			t.Errorf("%s model %q: %d %s\nwant 404 %s", tc.url, tc.model, st, out, want)
		}
	}
}

// TestRequestsByModel counts what reached the engine, served or not.
func TestRequestsByModel(t *testing.T) {
	e := startEngine(t, Config{Model: "m", ModelAliases: []string{"m-v1"}, LoRAModules: []string{"sql"}, TimeScale: 100})
	c := newClient(t)
	send := []struct {
		url, model string
		status     int
	}{
		{"/v1/completions", "m", 200},
		{"/v1/completions", "m", 200},
		{"/v1/chat/completions", "m-v1", 200},
		{"/v1/completions", "sql", 200},
		{"/v1/completions", "", 200},
		{"/v1/completions", "other", 404},
		{"/v1/chat/completions", "other", 404},
		{"/tokenize", "m", 200}, // not a generation request
	}
	for _, s := range send {
		body := map[string]any{"prompt": "x", "max_tokens": 1}
		if s.url == "/v1/chat/completions" {
			body = map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}, "max_tokens": 1}
		}
		if s.model != "" {
			body["model"] = s.model
		}
		if st, out := postJSON(t, c, e.URL()+s.url, body); st != s.status {
			t.Fatalf("%s %q: %d %s", s.url, s.model, st, out)
		}
	}
	// A body that is not JSON names no model.
	if resp, err := c.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader("{")); err == nil {
		resp.Body.Close()
	}
	want := map[string]int{"m": 2, "m-v1": 1, "sql": 1, "": 1, "other": 2}
	got := e.RequestsByModel()
	if !maps.Equal(got, want) {
		t.Errorf("RequestsByModel %v, want %v", got, want)
	}
	got["m"] = 100 // a copy
	for model, n := range e.RequestsByModel() {
		if served := e.Serves(model); served == (model == "other") {
			t.Errorf("Serves(%q) = %v", model, served)
		} else if model == "m" && n != 2 {
			t.Errorf("RequestsByModel shares its map")
		}
	}
	// Over HTTP, for a simulator in another process.
	resp, err := c.Get(e.URL() + "/sim/requests_by_model")
	if err != nil {
		t.Fatal(err)
	}
	var remote map[string]int
	err = json.NewDecoder(resp.Body).Decode(&remote)
	resp.Body.Close()
	if err != nil || !maps.Equal(remote, want) {
		t.Errorf("/sim/requests_by_model %v (%v), want %v", remote, err, want)
	}
	// A restart is a new simulated process, not a new test: counts stay.
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := e.RequestsByModel(); !maps.Equal(got, want) {
		t.Errorf("after restart: %v", got)
	}
}

// TestRequestsByModelBounded: whatever names clients send, the map stays
// small; the rest count under OtherModels.
func TestRequestsByModelBounded(t *testing.T) {
	e := startEngine(t, Config{TimeScale: 100})
	e.countRequest(strings.Repeat("x", maxCountedName+1))
	for i := range maxCountedModels + 10 {
		e.countRequest(fmt.Sprintf("name-%d", i))
	}
	e.countRequest("name-0") // a name already kept still counts as itself
	got := e.RequestsByModel()
	if len(got) != maxCountedModels || got[OtherModels] != 12 || got["name-0"] != 2 {
		t.Errorf("%d names, %d under %s, name-0 %d", len(got), got[OtherModels], OtherModels, got["name-0"])
	}
}
