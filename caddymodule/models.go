package caddymodule

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmgw/caddy-llmgw/fleet"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

func init() {
	caddy.RegisterModule(new(Models))
}

// Models answers GET /v1/models from the fleet's own knowledge: the union
// of what the pool's engines serve, as their pollers last learned it from
// each engine's /v1/models (else the engines' configured names). It is a
// terminal handler: it never calls the next one. Only GET and HEAD are
// answered; other methods get 405.
//
// While no engine's models are known yet it answers 503 with Retry-After:
// an empty list would tell SDK model pickers that the gateway serves no
// model at all, which it does not know.
type Models struct {
	// Pool names the pool whose engines are listed (as `pool` of
	// llm_admission): the engines its policy routes to, else the ones
	// configured for it. Default: every engine of the llm app.
	Pool string `json:"pool,omitempty"`

	fleet *fleet.Fleet
}

// CaddyModule returns the Caddy module information.
func (*Models) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_models",
		New: func() caddy.Module { return new(Models) },
	}
}

// Provision gets the fleet from the llm app.
func (h *Models) Provision(ctx caddy.Context) error {
	app, err := appFromContext(ctx)
	if err != nil {
		return err
	}
	h.fleet = app.fleet
	return nil
}

// modelCard is one entry of the OpenAI model list, as vLLM writes it:
// parent and max_model_len are null when absent, so a client reading
// vLLM's answer reads the gateway's the same way.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

// ServeHTTP answers the pool's model list.
func (h *Models) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeModelsError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed on the model list; use GET")
		return nil
	}
	list, known := h.fleet.ListModels(h.Pool)
	if !known {
		w.Header().Set("Retry-After", "1")
		writeModelsError(w, http.StatusServiceUnavailable, "no engine's models are known yet; retry shortly")
		return nil
	}
	body := modelsJSON(list, time.Now().Unix())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	return nil
}

// modelsJSON is the OpenAI list of models. Engines do not say when a model
// was created (vLLM answers the current time), so created is now: the
// gateway does not invent a date. owned_by is "vllm", as the engines say.
func modelsJSON(list []upstreams.ServedModel, created int64) []byte {
	data := make([]modelCard, len(list))
	for i, m := range list {
		c := modelCard{ID: m.ID, Object: "model", Created: created, OwnedBy: "vllm", Root: m.Root}
		if m.Parent != "" {
			c.Parent = &m.Parent
		}
		if m.MaxModelLen > 0 {
			c.MaxModelLen = &m.MaxModelLen
		}
		data[i] = c
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // ids are paths and names, not HTML
	if err := enc.Encode(struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", data}); err != nil {
		// Strings and ints always encode; keep a valid body regardless.
		return []byte(`{"object":"list","data":[]}` + "\n")
	}
	return buf.Bytes()
}

// writeModelsError answers with an OpenAI-style JSON error.
func writeModelsError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(openai.ErrorJSON(msg, "", status))
}

func parseModelsHandler(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Models)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler. Syntax:
//
//	llm_models [<matcher>] {
//	    pool <name>
//	}
func (h *Models) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "llm_models"
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "pool":
			if err := parseString(d, &h.Pool); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized llm_models subdirective '%s'", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Models)(nil)
	_ caddyhttp.MiddlewareHandler = (*Models)(nil)
	_ caddyfile.Unmarshaler       = (*Models)(nil)
)
