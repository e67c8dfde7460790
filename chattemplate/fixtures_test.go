package chattemplate

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// fixtureCase is one conversation of testdata/conversations.json.
type fixtureCase struct {
	name  string
	only  []string
	input Input
}

// loadFixtureCases reads testdata/conversations.json with DecodeJSON, so
// messages and tools keep the key order the fixture gives them, as they
// do in the JavaScript and Python renders.
func loadFixtureCases(t testing.TB) (map[string]ContentFormat, []fixtureCase) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "conversations.json"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := DecodeJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	root := doc.(Object)
	formats := map[string]ContentFormat{}
	fo := root.Values["content_formats"].(Object)
	for _, k := range fo.Keys {
		formats[k] = ContentFormat(fo.Values[k].(string))
	}
	var cases []fixtureCase
	for _, c := range root.Values["cases"].([]any) {
		cases = append(cases, fixtureFromObject(c.(Object)))
	}
	return formats, cases
}

func fixtureFromObject(o Object) fixtureCase {
	fc := fixtureCase{name: o.Values["name"].(string)}
	in := Input{Now: func() time.Time { return time.Date(2025, 3, 7, 14, 5, 9, 0, time.UTC) }}
	in.Messages = o.Values["messages"].([]any)
	if tools, ok := o.Get("tools"); ok {
		in.Tools = tools.([]any)
	}
	in.AddGenerationPrompt, _ = o.Values["add_generation_prompt"].(bool)
	in.ContinueFinalMessage, _ = o.Values["continue_final_message"].(bool)
	if kw, ok := o.Get("kwargs"); ok {
		in.Kwargs = map[string]any{}
		for _, k := range kw.(Object).Keys {
			in.Kwargs[k] = kw.(Object).Values[k]
		}
	}
	if only, ok := o.Get("only"); ok {
		for _, m := range only.([]any) {
			fc.only = append(fc.only, m.(string))
		}
	}
	fc.input = in
	return fc
}

// expectation is one entry of testdata/expected/<model>.json.
type expectation struct {
	Output *string `json:"output"`
	Error  *string `json:"error"`
}

// TestFixtures renders every fixture conversation for every model and
// compares with @huggingface/jinja's render (made by testdata/gen/gen.mjs
// and cross-checked against Python's jinja2 by crosscheck.py).
func TestFixtures(t *testing.T) {
	formats, cases := loadFixtureCases(t)
	models, err := os.ReadDir(filepath.Join("testdata", "models"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range models {
		model := m.Name()
		cfg, err := LoadDir(filepath.Join("testdata", "models", model))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Templates["default"].ContentFormat(); got != formats[model] {
			t.Errorf("%s: detected content format %q, want %q", model, got, formats[model])
		}
		want := readExpectations(t, model)
		for _, c := range cases {
			if c.only != nil && !slices.Contains(c.only, model) {
				continue
			}
			t.Run(model+"/"+c.name, func(t *testing.T) {
				exp, ok := want[c.name]
				if !ok {
					t.Fatalf("no expectation; rerun testdata/gen/gen.mjs")
				}
				checkRender(t, cfg, c.input, exp)
			})
		}
	}
}

func readExpectations(t *testing.T, model string) map[string]expectation {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "expected", model+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]expectation
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	return want
}

func checkRender(t *testing.T, cfg *Config, in Input, exp expectation) {
	t.Helper()
	got, err := cfg.Render(in)
	if exp.Error != nil {
		if err == nil {
			t.Fatalf("rendered %q, want error %q", got, *exp.Error)
		}
		var raised *RaiseError
		if errors.As(err, &raised) && raised.Message != *exp.Error {
			t.Fatalf("raised %q, want %q", raised.Message, *exp.Error)
		}
		return
	}
	if err != nil {
		t.Fatalf("error %v, want output %q", err, *exp.Output)
	}
	if got != *exp.Output {
		t.Fatalf("output differs\n got: %q\nwant: %q", got, *exp.Output)
	}
}
