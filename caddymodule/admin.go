package caddymodule

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI is the `admin.api.llm` module: the llm routes on Caddy's admin
// listener (loopback by default, never on the public listener). It keeps no
// state of its own and reads the running llm app at request time, because
// admin modules are provisioned before apps and survive failed reloads.
//
//	GET  /llm/engines                  every engine: gauges, local accounting, KV mirror state
//	GET  /llm/queue                    admission queues: depth and oldest wait per band
//	GET  /llm/tokenizers               local tokenizers: use, checks against the engines, mismatches
//	POST /llm/explain                  body: an inference request; the routing decision, without proxying
//	POST /llm/engines/{dial}/drain     no new requests to the engine (in-flight ones finish)
//	POST /llm/engines/{dial}/undrain
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.llm",
		New: func() caddy.Module { return adminAPI{} },
	}
}

// Routes returns the admin routes of the llm app.
func (a adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/llm/engines", Handler: caddy.AdminHandlerFunc(a.engines)},
		{Pattern: "/llm/engines/", Handler: caddy.AdminHandlerFunc(a.engineAction)},
		{Pattern: "/llm/queue", Handler: caddy.AdminHandlerFunc(a.queue)},
		{Pattern: "/llm/tokenizers", Handler: caddy.AdminHandlerFunc(a.tokenizers)},
		{Pattern: "/llm/explain", Handler: caddy.AdminHandlerFunc(a.explain)},
	}
}

func runningFleet() (*fleet.Fleet, error) {
	app := current.Load()
	if app == nil || app.fleet == nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errors.New("the llm app is not running")}
	}
	return app.fleet, nil
}

func method(r *http.Request, m string) error {
	if r.Method != m {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed: use %s", m)}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (adminAPI) engines(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodGet); err != nil {
		return err
	}
	f, err := runningFleet()
	if err != nil {
		return err
	}
	return writeJSON(w, f.EngineReports())
}

func (adminAPI) queue(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodGet); err != nil {
		return err
	}
	f, err := runningFleet()
	if err != nil {
		return err
	}
	return writeJSON(w, map[string]any{"pools": f.QueueReports()})
}

func (adminAPI) tokenizers(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodGet); err != nil {
		return err
	}
	f, err := runningFleet()
	if err != nil {
		return err
	}
	return writeJSON(w, map[string]any{"tokenizers": f.TokenizerStats()})
}

// explain routes a request body as the policy would and reports every
// candidate, without proxying, reserving or learning anything.
func (adminAPI) explain(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodPost); err != nil {
		return err
	}
	f, err := runningFleet()
	if err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20+1))
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("reading body: %w", err)}
	}
	if len(body) > 8<<20 {
		return caddy.APIError{HTTPStatus: http.StatusRequestEntityTooLarge, Err: errors.New("body over 8 MiB")}
	}
	// The body is parsed as its API's: ?path= names the API's path,
	// /v1/chat/completions by default (which parses completions too).
	ep := openai.EndpointOf(cmp.Or(r.URL.Query().Get("path"), "/v1/chat/completions"))
	if ep == openai.EndpointOther {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("path %q is no API the gateway routes", r.URL.Query().Get("path"))}
	}
	req, _, err := parseRequest(f, ep, body) // as routed: a model alias resolved
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	poolName := r.URL.Query().Get("pool")
	if poolName == "" {
		poolName = upstreams.DefaultPool
	}
	ex, err := f.Explain(r.Context(), req, poolName)
	if errors.Is(err, fleet.ErrNoEngines) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err}
	}
	if err != nil {
		return err
	}
	observeTokenize(ex.Tokenize)
	return writeJSON(w, ex)
}

// engineAction handles POST /llm/engines/{dial}/drain and /undrain.
func (adminAPI) engineAction(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, "/llm/engines/")
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("use /llm/engines/{dial}/drain or /undrain")}
	}
	dial, action := rest[:i], rest[i+1:]
	if d, err := url.PathUnescape(dial); err == nil {
		dial = d
	}
	if err := method(r, http.MethodPost); err != nil {
		return err
	}
	f, err := runningFleet()
	if err != nil {
		return err
	}
	switch action {
	case "drain":
		f.SetDrained(dial, true)
	case "undrain":
		f.SetDrained(dial, false)
	default:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown action %q", action)}
	}
	return writeJSON(w, map[string]any{"dial": dial, "drained": f.IsDrained(dial)})
}

// Interface guards
var _ caddy.AdminRouter = adminAPI{}
