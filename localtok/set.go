package localtok

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/openai"
)

// AnyModel is the model name of the entry that serves requests for models
// without an entry of their own.
const AnyModel = "*"

// Defaults of Options.
const (
	DefaultSample        = 0.01
	DefaultMismatchLimit = 5
	defaultQueue         = 16
	defaultCheckTimeout  = 5 * time.Second
)

// RemoteFunc asks an engine's /tokenize for one request's ids: the truth a
// local tokenization is checked against.
type RemoteFunc func(ctx context.Context) ([]uint64, error)

// Options configure a Set's checks against the engines.
type Options struct {
	// Sample is the share of local tokenizations checked against an
	// engine's /tokenize, 0 to 1; 0 disables the checks.
	Sample float64
	// MismatchLimit is the number of mismatches after which a model's
	// requests go to remote tokenization again (until the next config
	// load); 0 never falls back.
	MismatchLimit int
	// Timeout bounds one check. Default: 5s.
	Timeout time.Duration
	// Logger gets one warning per model at its first mismatch, and one when
	// it falls back. Default: none.
	Logger *zap.Logger
}

// Set is the local tokenizers of one config: models by name, each with its
// checks against the engines. It owns one goroutine, which Close stops.
type Set struct {
	models map[string]*entry
	opts   Options
	jobs   chan check
	stop   context.CancelFunc
	done   chan struct{}
}

// entry is one model name's tokenizer and what its checks found. The
// counters are carried from the Set a config reload replaces (NewSet's
// prev), so that the metrics made of them stay monotonic; fallback is not:
// a reload tries the local tokenizer again.
type entry struct {
	name     string
	model    *Model
	c        *counters
	fallback atomic.Bool
	warned   atomic.Bool
}

type counters struct {
	local, remote, failed, fellBack           atomic.Uint64
	checked, mismatches, checkErrors, dropped atomic.Uint64
	example                                   atomic.Pointer[Mismatch]
}

// check is one sampled local tokenization waiting for the engine's answer.
type check struct {
	e      *entry
	remote RemoteFunc
	local  []uint64
}

// NewSet returns the set of models (by model name; AnyModel for the rest)
// and starts its checker. prev, when not nil, is the set it replaces: its
// counters carry over for the names both have.
func NewSet(models map[string]*Model, o Options, prev *Set) *Set {
	if o.Timeout <= 0 {
		o.Timeout = defaultCheckTimeout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Set{models: make(map[string]*entry, len(models)), opts: o,
		jobs: make(chan check, defaultQueue), stop: cancel, done: make(chan struct{})}
	for name, m := range models {
		e := &entry{name: name, model: m, c: new(counters)}
		if prev != nil && prev.models[name] != nil {
			e.c = prev.models[name].c
		}
		s.models[name] = e
	}
	go s.run(ctx)
	return s
}

// Close stops the checker; checks in flight are abandoned.
func (s *Set) Close() {
	s.stop()
	<-s.done
}

// lookup is the entry for a request's model.
func (s *Set) lookup(model string) *entry {
	if e := s.models[model]; e != nil {
		return e
	}
	return s.models[AnyModel]
}

// Tokenize returns req's prompt token ids from the local tokenizer of its
// model; ok is false when the request goes to remote tokenization: no
// local tokenizer for the model, a request only the engine can render, a
// local error, or a model fallen back after mismatches. A sample of the
// local results is checked against remote, an engine's /tokenize for the
// same request, in the background; remote nil skips the check.
func (s *Set) Tokenize(req *openai.Request, remote RemoteFunc) (ids []uint64, ok bool) {
	return s.AppendTokenize(nil, req, remote)
}

// AppendTokenize is Tokenize appending the ids to dst, so that a caller
// can reuse a buffer (a sampled check keeps a copy of its own). Without
// local ids it returns dst as it was and false.
func (s *Set) AppendTokenize(dst []uint64, req *openai.Request, remote RemoteFunc) (ids []uint64, ok bool) {
	e := s.lookup(req.Model)
	if e == nil {
		return dst, false
	}
	if e.fallback.Load() {
		e.c.fellBack.Add(1)
		return dst, false
	}
	ids, err := e.model.AppendTokenize(dst, req)
	switch {
	case errors.Is(err, ErrRemote):
		e.c.remote.Add(1)
		return dst, false
	case err != nil:
		e.c.failed.Add(1)
		return dst, false
	}
	e.c.local.Add(1)
	if remote != nil && s.opts.Sample > 0 && rand.Float64() < s.opts.Sample {
		select {
		case s.jobs <- check{e: e, remote: remote, local: slices.Clone(ids[len(dst):])}:
		default:
			e.c.dropped.Add(1) // the checker is behind: a sample, not a queue
		}
	}
	return ids, true
}

// run is the checker: one check at a time, so that checks cost the
// engines at most one /tokenize in flight per gateway.
func (s *Set) run(ctx context.Context) {
	defer close(s.done)
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-s.jobs:
			s.check(ctx, c)
		}
	}
}

// check compares one local tokenization with the engine's.
func (s *Set) check(ctx context.Context, c check) {
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	remote, err := c.remote(cctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.e.c.checkErrors.Add(1)
		}
		return
	}
	c.e.c.checked.Add(1)
	mm, differ := compare(c.local, remote)
	if !differ {
		return
	}
	n := c.e.c.mismatches.Add(1)
	c.e.c.example.CompareAndSwap(nil, &mm)
	if c.e.warned.CompareAndSwap(false, true) {
		s.opts.Logger.Warn("local tokenization differs from the engine's",
			zap.String("model", c.e.name), zap.String("dir", c.e.model.Dir()),
			zap.Int("position", mm.Position), zap.Int64("local_id", mm.Local), zap.Int64("engine_id", mm.Engine),
			zap.Int("local_tokens", mm.LocalTokens), zap.Int("engine_tokens", mm.EngineTokens))
	}
	if lim := s.opts.MismatchLimit; lim > 0 && n >= uint64(lim) && c.e.fallback.CompareAndSwap(false, true) {
		s.opts.Logger.Warn("falling back to the engines' /tokenize for this model",
			zap.String("model", c.e.name), zap.Uint64("mismatches", n), zap.Int("mismatch_limit", lim))
	}
}

// Mismatch is one local tokenization that differed from the engine's.
type Mismatch struct {
	Position     int   `json:"position"`  // first differing token
	Local        int64 `json:"local_id"`  // the local id there, -1 past the end
	Engine       int64 `json:"engine_id"` // the engine's id there, -1 past the end
	LocalTokens  int   `json:"local_tokens"`
	EngineTokens int   `json:"engine_tokens"`
}

// compare finds the first position where a and b differ.
func compare(local, engine []uint64) (Mismatch, bool) {
	m := Mismatch{LocalTokens: len(local), EngineTokens: len(engine), Local: -1, Engine: -1}
	n := min(len(local), len(engine))
	i := 0
	for i < n && local[i] == engine[i] {
		i++
	}
	if i == len(local) && i == len(engine) {
		return m, false
	}
	m.Position = i
	if i < len(local) {
		m.Local = int64(local[i])
	}
	if i < len(engine) {
		m.Engine = int64(engine[i])
	}
	return m, true
}

// Stats is what one model's local tokenizer did.
type Stats struct {
	Model string `json:"model"`
	Dir   string `json:"dir"`
	// Local tokenizations made, requests sent to the engines' tokenizer
	// because only an engine can render them, and local errors.
	Local  uint64 `json:"local"`
	Remote uint64 `json:"remote"`
	Failed uint64 `json:"failed"`
	// FellBackRequests went to the engines because the model fell back.
	FellBackRequests uint64 `json:"fell_back_requests"`
	// Checks against the engines: completed, with a mismatch, failed (the
	// engine did not answer), and sampled but dropped (checker busy).
	Checked     uint64 `json:"checked"`
	Mismatches  uint64 `json:"mismatches"`
	CheckErrors uint64 `json:"check_errors"`
	Dropped     uint64 `json:"dropped"`
	// FellBack is set once MismatchLimit mismatches were seen: the model's
	// requests use remote tokenization until the next config load.
	FellBack bool `json:"fell_back"`
	// FirstMismatch is the first mismatch seen, nil before any.
	FirstMismatch *Mismatch `json:"first_mismatch,omitempty"`
}

// Stats reports every model's figures, sorted by model name.
func (s *Set) Stats() []Stats {
	out := make([]Stats, 0, len(s.models))
	for _, e := range s.models {
		c := e.c
		out = append(out, Stats{Model: e.name, Dir: e.model.Dir(),
			Local: c.local.Load(), Remote: c.remote.Load(), Failed: c.failed.Load(), FellBackRequests: c.fellBack.Load(),
			Checked: c.checked.Load(), Mismatches: c.mismatches.Load(), CheckErrors: c.checkErrors.Load(),
			Dropped: c.dropped.Load(), FellBack: e.fallback.Load(), FirstMismatch: c.example.Load()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}
