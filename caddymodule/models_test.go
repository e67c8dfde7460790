package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
)

// modelsSite serves the model list of every engine at /v1/models and pool
// b's at /b/v1/models, in front of the usual admission and proxy.
const modelsSite = "\thandle /v1/models {\n\t\tllm_models\n\t}\n" +
	"\thandle /b/v1/models {\n\t\tllm_models {\n\t\t\tpool b\n\t\t}\n\t}\n"

// wireModelList is the gateway's answer, with pointers to tell null apart.
type wireModelList struct {
	Object string `json:"object"`
	Data   []struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
	} `json:"data"`
}

// getModels sends method to the gateway's path and returns the answer.
func getModels(t *testing.T, method, path string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+gatewayAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

// TestModelsList: the gateway's /v1/models is the union of what its engines
// serve, as their pollers learned it: two engines serving A (one with
// adapters a1 and a2, and a longer context) and one serving B in pool b.
func TestModelsList(t *testing.T) {
	forgetEngines(t) // engines of earlier tests would join the union
	t.Cleanup(func() { resetGateway(t) })
	withLoRA := startEngines(t, 1, vllmsim.Config{Model: "A", LoRAModules: []string{"a2", "a1"}, MaxModelLen: 8192})[0]
	plainA := startEngines(t, 1, vllmsim.Config{Model: "A", MaxModelLen: 4096})[0]
	engB := startEngines(t, 1, vllmsim.Config{Model: "B", MaxModelLen: 2048})[0]
	engines := noKVEngines(withLoRA, plainA, engB)
	engines[2].extra = "\t\t\tpool b\n"
	gateway{engines: engines, upstreams: []string{withLoRA.Addr(), plainA.Addr()}, siteExtra: modelsSite}.load(t)

	var engs []fleet.EngineReport
	testwait.For(t, 20*time.Second, "the pollers to learn every engine's models", func() bool {
		if adminJSON(t, http.MethodGet, "/llm/engines", "", &engs) != http.StatusOK || len(engs) != 3 {
			return false
		}
		for _, e := range engs {
			if e.ModelsSource != "discovered" {
				return false
			}
		}
		return true
	})

	res, body := getModels(t, http.MethodGet, "/v1/models")
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/models: %d %q %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	want := []modelEntry{
		{"A", "A", "", 4096}, // the smaller context of A's two engines
		{"B", "B", "", 2048},
		{"a1", "/sim/lora/a1", "A", 8192}, // the parent's on the one engine serving it
		{"a2", "/sim/lora/a2", "A", 8192},
	}
	if got := decodeModels(t, body); !reflect.DeepEqual(got, want) {
		t.Errorf("models:\n got %+v\nwant %+v\nbody %s", got, want, body)
	}
	if res, body := getModels(t, http.MethodHead, "/v1/models"); res.StatusCode != http.StatusOK || body != "" {
		t.Errorf("HEAD /v1/models: %d %q", res.StatusCode, body)
	}
	_, body = getModels(t, http.MethodGet, "/b/v1/models")
	if got := decodeModels(t, body); !reflect.DeepEqual(got, want[1:2]) {
		t.Errorf("pool b's models: %+v, want %+v", got, want[1:2])
	}
}

// modelEntry is what a test checks of a list entry.
type modelEntry struct {
	id, root, parent string
	maxLen           int // 0: null
}

// forgetEngines starts the shared Caddy if no test has yet, then waits until
// the fleet has forgotten the engines of earlier tests.
func forgetEngines(t *testing.T) {
	t.Helper()
	gateway{respond: "reset"}.load(t)
	resetGateway(t)
}

// decodeModels checks the list's shape and returns its entries.
func decodeModels(t *testing.T, body string) []modelEntry {
	t.Helper()
	var l wireModelList
	if err := json.Unmarshal([]byte(body), &l); err != nil || l.Object != "list" {
		t.Fatalf("not a model list (%v): %s", err, body)
	}
	out := make([]modelEntry, len(l.Data))
	for i, m := range l.Data {
		if m.Object != "model" || m.OwnedBy != "vllm" || m.Created == 0 {
			t.Errorf("entry %q: object %q owned_by %q created %d", m.ID, m.Object, m.OwnedBy, m.Created)
		}
		out[i].id, out[i].root = m.ID, m.Root
		if m.Parent != nil {
			out[i].parent = *m.Parent
		}
		if m.MaxModelLen != nil {
			out[i].maxLen = *m.MaxModelLen
		}
	}
	return out
}

// TestModelsUnknownAndMethods: before any engine's models are known the
// list is a 503 to retry, not an empty list; methods other than GET and
// HEAD get 405 with Allow; both are OpenAI errors.
func TestModelsUnknownAndMethods(t *testing.T) {
	forgetEngines(t) // engines of earlier tests may know their models
	t.Cleanup(func() { resetGateway(t) })
	// Nothing listens on the engine's port: its models stay unknown.
	dead := "127.0.0.1:" + strconv.Itoa(mustFreePort(t))
	gateway{engines: dialEngines(dead), siteExtra: modelsSite}.load(t)

	res, body := getModels(t, http.MethodGet, "/v1/models")
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "1" || !isOpenAIError(body, "server_error") {
		t.Errorf("unknown models: %d Retry-After %q %s", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	for _, method := range []string{http.MethodPost, http.MethodDelete} {
		res, body := getModels(t, method, "/v1/models")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET, HEAD" || !isOpenAIError(body, "invalid_request_error") {
			t.Errorf("%s: %d Allow %q %s", method, res.StatusCode, res.Header.Get("Allow"), body)
		}
	}
}

// isOpenAIError reports whether body is an OpenAI error of type typ.
func isOpenAIError(body, typ string) bool {
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	return json.Unmarshal([]byte(body), &e) == nil && e.Error != nil && e.Error.Message != "" && e.Error.Type == typ
}

// TestModelsCaddyfileErrors: bad llm_models config names the line.
func TestModelsCaddyfileErrors(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, tc := range []struct{ name, caddyfile, want string }{
		{"argument", ":80 {\n\tllm_models /v1/models extra\n}\n", "wrong argument count"},
		{"unknown subdirective", ":80 {\n\tllm_models {\n\t\tpools x\n\t}\n}\n", "unrecognized llm_models subdirective 'pools'"},
		{"pool without name", ":80 {\n\tllm_models {\n\t\tpool\n\t}\n}\n", "wrong argument count"},
		{"pool with two names", ":80 {\n\tllm_models {\n\t\tpool a b\n\t}\n}\n", "wrong argument count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := adapter.Adapt([]byte(tc.caddyfile), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Caddyfile:") {
				t.Errorf("error %v, want one naming the line with %q", err, tc.want)
			}
		})
	}
}

// TestModelsCaddyfileExample: the demo config answers /v1/models itself.
func TestModelsCaddyfileExample(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, nil)
	if err != nil {
		t.Fatalf("Caddyfile.example: %v", err)
	}
	if !strings.Contains(string(out), `"handler":"llm_models"`) {
		t.Error("adapted Caddyfile.example lacks the llm_models handler")
	}
}
