package upstreams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/internal/httpbody"
)

// Bounds on an engine's /v1/models answer. A vLLM engine lists its served
// names and adapters in a few hundred bytes each, so these only stop a
// misbehaving server from costing memory.
const (
	maxModelsBytes   = 1 << 20 // the body, as read
	maxServedModels  = 1024    // entries in one list
	maxModelIDLength = 1024    // bytes of one id (vLLM's default name is the model's path)
)

// modelsUnavailableFactor stretches the models interval for an engine whose
// /v1/models is missing (404 and kin): it is not going to appear soon, and
// asking every interval would only fill the engine's access log.
const modelsUnavailableFactor = 10

// ErrModelsUnavailable marks an engine that does not serve /v1/models (a
// proxy in front hides it, or the server is not vLLM): its models are
// unknown, which is not a failure of the engine. A fetch made by the
// caller ([Engine.RecordModels]) reports such an answer wrapping it.
var ErrModelsUnavailable = errors.New("/v1/models not served")

// ServedModel is one entry of an engine's GET /v1/models: a name the engine
// answers to, either a base model (one of its --served-model-name) or a
// LoRA adapter on top of one.
type ServedModel struct {
	// ID is the name requests use in their "model" field.
	ID string
	// Root is the model the entry is loaded from: the base model's path or
	// hub id, or the adapter's path; "" when the engine does not say.
	Root string
	// Parent is the base model's id for a LoRA adapter, "" for a base
	// model.
	Parent string
	// MaxModelLen is the context length the engine serves the model with;
	// 0 when the engine does not say (vLLM leaves it out for adapters).
	MaxModelLen int
}

// ServedModels is what an engine serves, as [Engine.Models] reports it.
type ServedModels struct {
	// List is the engine's /v1/models as last fetched successfully, or,
	// when no fetch has succeeded (the engine does not serve /v1/models,
	// or has not answered it yet), the configured [EngineConfig.Models];
	// nil when neither is known. Discovered names win over configured ones
	// because they are what the engine actually answers to. It is shared
	// by every snapshot until the list changes: callers must not modify
	// it.
	List []ServedModel
	// Configured: List holds the configured names, not discovered ones.
	Configured bool
	// LearnedAt is when a fetch last succeeded (zero if none has);
	// CheckedAt when one was last tried.
	LearnedAt, CheckedAt time.Time
	// Error is the last fetch's error; "" after a success, and while the
	// engine does not serve /v1/models (see Unavailable). A failed fetch
	// keeps the last good List.
	Error string
	// Unavailable: the engine answered /v1/models with 404, 405 or 501. It
	// is asked again ten times less often, and after it restarts.
	Unavailable bool
}

// Serves reports whether id is one of the listed models (a base model's
// or an adapter's id).
func (s ServedModels) Serves(id string) bool {
	return slices.ContainsFunc(s.List, func(m ServedModel) bool { return m.ID == id })
}

// modelsState is an engine's discovered models. e.mu guards it.
type modelsState struct {
	list                 []ServedModel // last good list; replaced, never modified
	ids                  map[string]struct{}
	learnedAt, checkedAt time.Time
	firstLearned         time.Time // the first successful fetch
	err                  string
	unavailable          bool
	failing              bool // the last fetch failed: log the next failure at debug
}

// Models returns what the engine serves: its discovered models, else its
// configured ones (see [ServedModels.List]). It allocates only to list
// configured names.
func (e *Engine) Models() ServedModels {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := &e.models
	s := ServedModels{List: m.list, LearnedAt: m.learnedAt, CheckedAt: m.checkedAt, Error: m.err, Unavailable: m.unavailable}
	if m.list == nil && len(e.cfg.Models) > 0 {
		s.Configured = true
		s.List = make([]ServedModel, len(e.cfg.Models))
		for i, id := range e.cfg.Models {
			s.List[i] = ServedModel{ID: id}
		}
	}
	return s
}

// ServesModel reports whether the engine serves id (a base model's, an
// alias's or an adapter's id) and whether its models are known at all:
// discovered, else configured. An engine whose models are unknown may
// serve anything, so callers routing by model keep it as a candidate. It
// allocates nothing, as routing asks it of every candidate per request.
func (e *Engine) ServesModel(id string) (serves, known bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	known = e.models.list != nil || len(e.cfg.Models) > 0
	return known && e.servesLocked(id), known
}

// ModelStanding is what an engine's models say of one model id.
type ModelStanding struct {
	// Serves: its models (discovered, else configured) list the id.
	Serves bool
	// Known: its models are known, discovered or configured.
	Known bool
	// Pending: its models are not known yet but soon will be: none
	// configured, /v1/models never asked, and no poll of the engine
	// failed. That is a new engine until its first poll, which fetches
	// /v1/models right after a successful scrape. An engine whose polls
	// fail, or whose /v1/models fails or is not served, is not pending:
	// its models stay unknown.
	Pending bool
	// KnownSince is, when Known, since when: its first /v1/models answer,
	// or when it was added for configured models.
	KnownSince time.Time
	// Added is when the registry created the engine.
	Added time.Time
}

// ModelStanding returns what the engine's models say of id. It allocates
// nothing, as routing asks it of every candidate per request.
func (e *Engine) ModelStanding(id string) ModelStanding {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := &e.models
	st := ModelStanding{Known: m.list != nil || len(e.cfg.Models) > 0, Added: e.added}
	switch {
	case m.list != nil:
		st.KnownSince = m.firstLearned
	case st.Known:
		st.KnownSince = e.added
	}
	st.Serves = st.Known && e.servesLocked(id)
	st.Pending = !st.Known && !m.unavailable && m.checkedAt.IsZero() && e.failures == 0
	return st
}

// servesLocked is Models().Serves(id) without the copy. e.mu held.
func (e *Engine) servesLocked(id string) bool {
	if e.models.list != nil {
		_, ok := e.models.ids[id]
		return ok
	}
	return slices.Contains(e.cfg.Models, id)
}

// RecordModels records a /v1/models answer fetched by the caller instead
// of a poller ([Options.ManualScrape]): list when err is nil (it is
// copied), else the failure, which keeps the last good list.
func (e *Engine) RecordModels(list []ServedModel, err error) {
	e.recordModels(slices.Clone(list), err, e.reg.options())
}

// recordModels applies a fetch's result. On success the list replaces the
// last one only when it differs, so snapshots keep sharing one slice.
func (e *Engine) recordModels(list []ServedModel, err error, o *Options) {
	log := o.Logger.With(zap.String("engine", e.dial))
	now := e.reg.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	m := &e.models
	m.checkedAt = now
	switch {
	case err == nil:
		if list == nil {
			list = []ServedModel{} // known to serve nothing, not unknown
		}
		if m.list == nil || !slices.Equal(m.list, list) {
			m.list, m.ids = list, modelIDs(list)
			log.Info("engine models learned", zap.Int("models", len(list)), zap.Strings("ids", firstIDs(list, 8)))
		} else if m.failing || m.unavailable {
			log.Info("engine models readable again")
		}
		if m.firstLearned.IsZero() {
			m.firstLearned = now
		}
		m.learnedAt, m.err, m.unavailable, m.failing = now, "", false, false
	case errors.Is(err, ErrModelsUnavailable):
		if !m.unavailable {
			log.Info("engine does not serve /v1/models: its models are the configured ones, if any",
				zap.String("models_url", redactURL(e.cfg.ModelsURL)), zap.Error(err))
		}
		m.err, m.unavailable, m.failing = "", true, false
	default:
		if !m.failing {
			log.Warn("engine models fetch failed; keeping the last list",
				zap.String("models_url", redactURL(e.cfg.ModelsURL)), zap.Error(err))
		} else {
			log.Debug("engine models fetch failed", zap.Error(err))
		}
		m.err, m.unavailable, m.failing = err.Error(), false, true
	}
}

func modelIDs(list []ServedModel) map[string]struct{} {
	ids := make(map[string]struct{}, len(list))
	for _, m := range list {
		ids[m.ID] = struct{}{}
	}
	return ids
}

// firstIDs is up to n of list's ids, for a log line of bounded size.
func firstIDs(list []ServedModel, n int) []string {
	out := make([]string, 0, min(n, len(list)))
	for _, m := range list[:min(n, len(list))] {
		out = append(out, m.ID)
	}
	return out
}

// fetchModels fetches and parses the engine's /v1/models within
// o.PollTimeout and maxModelsBytes. A 404, 405 or 501 wraps
// ErrModelsUnavailable.
func fetchModels(ctx context.Context, o *Options, url string, header http.Header) ([]ServedModel, error) {
	ctx, cancel := context.WithTimeout(ctx, o.PollTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("models request: %w", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "application/json")
	resp, err := o.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch models: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return nil, fmt.Errorf("%w: HTTP %d", ErrModelsUnavailable, resp.StatusCode)
	default:
		return nil, fmt.Errorf("fetch models: HTTP %d: %s", resp.StatusCode, httpbody.Snippet(resp.Body))
	}
	body, err := httpbody.ReadLimited(resp.Body, maxModelsBytes, nil)
	if err != nil {
		return nil, fmt.Errorf("fetch models: %w", err)
	}
	return parseModels(body)
}

// wireModels is the OpenAI model list as vLLM writes it. Pointers tell an
// absent or null field from an empty one; unknown fields are ignored, since
// vLLM adds some now and then.
type wireModels struct {
	Object *string      `json:"object"`
	Data   *[]wireModel `json:"data"`
}

type wireModel struct {
	ID          string  `json:"id"`
	Object      *string `json:"object"`
	Root        *string `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int64  `json:"max_model_len"`
}

// parseModels parses a /v1/models body. It is strict about what it reads —
// a field of the wrong type, an entry without an id or an object that is
// not a model list is an error — so that a page that is not what vLLM
// writes never passes for an engine serving nothing. Repeated ids keep the
// first entry.
func parseModels(body []byte) ([]ServedModel, error) {
	var w wireModels
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("parse models: %w (%s)", err, describePage(body))
	}
	if w.Object != nil && *w.Object != "list" {
		return nil, fmt.Errorf("parse models: object %q, want \"list\"", *w.Object)
	}
	if w.Data == nil {
		return nil, errors.New("parse models: no data array")
	}
	if len(*w.Data) > maxServedModels {
		return nil, fmt.Errorf("parse models: %d models, at most %d", len(*w.Data), maxServedModels)
	}
	out := make([]ServedModel, 0, len(*w.Data))
	seen := make(map[string]struct{}, len(*w.Data))
	for i, wm := range *w.Data {
		m, err := wm.served()
		if err != nil {
			return nil, fmt.Errorf("parse models: entry %d: %w", i, err)
		}
		if _, dup := seen[m.ID]; !dup {
			seen[m.ID] = struct{}{}
			out = append(out, m)
		}
	}
	return out, nil
}

// served checks one entry and converts it.
func (wm wireModel) served() (ServedModel, error) {
	switch {
	case strings.TrimSpace(wm.ID) == "":
		return ServedModel{}, errors.New("no id")
	case len(wm.ID) > maxModelIDLength:
		return ServedModel{}, fmt.Errorf("id of %d bytes, at most %d", len(wm.ID), maxModelIDLength)
	case wm.Object != nil && *wm.Object != "model":
		return ServedModel{}, fmt.Errorf("model %q: object %q, want \"model\"", wm.ID, *wm.Object)
	case wm.MaxModelLen != nil && (*wm.MaxModelLen < 0 || *wm.MaxModelLen > math.MaxInt32):
		return ServedModel{}, fmt.Errorf("model %q: max_model_len %d out of range", wm.ID, *wm.MaxModelLen)
	}
	m := ServedModel{ID: wm.ID}
	if wm.Root != nil {
		m.Root = *wm.Root
	}
	if wm.Parent != nil {
		m.Parent = *wm.Parent
	}
	if wm.MaxModelLen != nil {
		m.MaxModelLen = int(*wm.MaxModelLen)
	}
	return m, nil
}

// defaultModelsURL is /v1/models on the metrics endpoint's server: the same
// scheme, host and credentials in the URL, and the same path prefix when the
// metrics path ends in /metrics (an engine behind a path-routing proxy).
// The query is dropped: a metrics query selects metrics.
func defaultModelsURL(metricsURL string) string {
	u, err := url.Parse(metricsURL)
	if err != nil {
		return "" // Validate reports the metrics URL
	}
	p := strings.TrimSuffix(u.Path, "/")
	prefix, ok := strings.CutSuffix(p, "/metrics")
	if !ok {
		prefix = ""
	}
	u.Path, u.RawPath, u.RawQuery, u.ForceQuery, u.Fragment = prefix+"/v1/models", "", "", false, ""
	return u.String()
}
