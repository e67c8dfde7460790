package caddymodule

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmgw/caddy-llmgw/admission"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// routeSettings are one policy's knobs, kept by pool for the explain API.
type routeSettings struct {
	cost      routing.Config
	blockSize int
	tokenize  bool
}

// routeResult is a routing decision with what it was made from.
type routeResult struct {
	decision    routing.Decision
	text        string // the prompt text the approximate tier keys on
	tokens      int    // prompt tokens (0 when tokenizing failed)
	blockSize   int
	tokenizeErr error
}

// route gathers, for each candidate engine, the prefix it holds (precise
// tier from its KV mirror when its events are live and the prompt could be
// tokenized, approximate tier otherwise) and its load, and lets routing.Pick
// decide. It has no side effects, so the explain API uses it as is.
func (f *fleet) route(ctx context.Context, req *admission.Request, dials []string, s routeSettings, explain bool) routeResult {
	return f.routeFor(ctx, req, dials, s, explain, "")
}

// routeFor is route for a request that already counts against engine own
// (llm_admission reserved it there before routing): that reservation is
// left out of own's load, or the engine admission happened to reserve on
// would look busier than its peers by this very request and never win a
// tie.
func (f *fleet) routeFor(ctx context.Context, req *admission.Request, dials []string, s routeSettings, explain bool, own string) routeResult {
	v := f.view(dials, s)
	tokens := promptIDs(req)
	var err error
	if tokens == nil && s.tokenize {
		tokens, err = f.tokenize(ctx, req, v.engines, v.loads)
	}
	res := f.decide(req, dials, s, explain, own, v, tokens)
	res.tokenizeErr = err
	return res
}

// fleetView is the candidates' engines and loads as one decision sees them.
type fleetView struct {
	engines   []*upstreams.Engine
	loads     []upstreams.Load
	blockSize int
}

// view snapshots the candidates' loads and the fleet's block size: what the
// engines' events say, else their gauges, else the policy's setting.
func (f *fleet) view(dials []string, s routeSettings) fleetView {
	v := fleetView{engines: make([]*upstreams.Engine, len(dials)), loads: make([]upstreams.Load, len(dials)), blockSize: s.blockSize}
	for i, d := range dials {
		v.engines[i] = f.registry.Ensure(d)
		v.loads[i] = v.engines[i].Load()
		if v.loads[i].BlockSize > 0 && v.blockSize == s.blockSize {
			v.blockSize = v.loads[i].BlockSize
		}
	}
	for _, d := range dials {
		if m := f.index.Mirror(d); m != nil && m.BlockSize() > 0 {
			v.blockSize = m.BlockSize()
			break
		}
	}
	return v
}

// decide is the decision proper, given the prompt's token ids (nil when
// they are unknown: the approximate tier only).
func (f *fleet) decide(req *admission.Request, dials []string, s routeSettings, explain bool, own string, v fleetView, tokens []uint64) routeResult {
	lora := f.loraOf(req)
	text, nsLen := approxKey(req, lora)
	res := routeResult{text: text, blockSize: v.blockSize}
	textLen := len(req.Messages) + len(req.Prompt) // one of them is empty
	loads := v.loads
	bs := res.blockSize
	var precise map[string]int
	promptTokens := textLen / 4 // rough bytes-per-token when untokenized
	if tokens != nil {
		res.tokens, promptTokens = len(tokens), len(tokens)
		precise = make(map[string]int)
		matches, err := f.index.Match(kvindex.Query{Tokens: tokens, LoRAName: lora, CacheSalt: req.CacheSalt})
		if err == nil {
			for _, m := range matches {
				precise[m.Engine] = m.Blocks
			}
		}
	}
	total := promptTokens / bs
	// The tree sees at most the text's first approxMaxBytes; its match is a
	// share of the whole prompt.
	approxList, _ := f.approx.Match(res.text)
	approx := make(map[string]int, len(approxList))
	for _, m := range approxList {
		// The namespace is no part of the prompt.
		approx[m.Engine] = max(m.Bytes-nsLen, 0)
	}

	cands := make([]routing.Candidate, len(dials))
	for i, d := range dials {
		l := loads[i]
		if d == own {
			l.Inflight, l.Dispatched = max(l.Inflight-1, 0), max(l.Dispatched-1, 0)
		}
		// The gauges less the requests seen finishing since the scrape, as
		// llm_admission counts them, so both agree on which engines are
		// full.
		running, waiting := l.Estimated()
		c := routing.Candidate{
			Dial:        d,
			Running:     running,
			Waiting:     waiting,
			Inflight:    l.Inflight,
			Dispatched:  l.Dispatched,
			KVUsage:     l.KVUsage,
			MaxInflight: l.MaxInflight,
			LoadKnown:   l.Known,
		}
		if explain {
			// What Select leaves out before routing, shown as such.
			switch {
			case f.isDrained(d):
				c.Unavailable = "drained"
			case f.currentBreaker().State(d, time.Now()) == routing.StateOpen:
				c.Unavailable = "breaker_open"
			}
		}
		if tokens != nil && f.preciseFresh(d) {
			c.Tier, c.MatchedBlocks = routing.Precise, precise[d]
		} else {
			c.Tier = routing.Approximate
			if textLen > 0 {
				c.MatchedBlocks = int(float64(approx[d]) / float64(textLen) * float64(total))
			}
		}
		cands[i] = c
	}
	res.decision = routing.Pick(routing.Request{
		PromptTokens: promptTokens,
		BlockSize:    bs,
		TotalBlocks:  total,
		Key:          spreadKey(tokens, bs, res.text),
	}, cands, s.cost, explain)
	return res
}

// tokenize asks the least busy known engine to tokenize the prompt exactly
// as it will render it.
func (f *fleet) tokenize(ctx context.Context, req *admission.Request, engines []*upstreams.Engine, loads []upstreams.Load) ([]uint64, error) {
	pick := -1
	for i, l := range loads {
		if pick < 0 || (l.Known && !loads[pick].Known) || (l.Known == loads[pick].Known && l.Inflight < loads[pick].Inflight) {
			pick = i
		}
	}
	if pick < 0 {
		return nil, nil
	}
	cfg := engines[pick].Config()
	start := time.Now()
	tokens, cached, err := f.tokenizer.Load().Tokenize(ctx, cfg.TokenizeURL, cfg.Header, upstreams.TokenizeRequest{
		Model:                req.Model,
		Prompt:               req.Prompt,
		Messages:             req.Messages,
		AddGenerationPrompt:  req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage,
		AddSpecialTokens:     req.AddSpecialTokens,
		ChatTemplate:         req.ChatTemplate,
		ChatTemplateKwargs:   req.ChatTemplateKwargs,
		Tools:                req.Tools,
	})
	switch {
	case err != nil:
		tokenizeFailures.Inc()
		return nil, err
	case cached:
		tokenizeCacheHits.Inc()
	default:
		tokenizeSeconds.Observe(time.Since(start).Seconds())
	}
	return tokens, nil
}

// approxMaxBytes bounds the text the approximate tier keys on: the tree
// considers no more than its MaxChunks (4096) chunks of 64 bytes, so
// copying more of a long prompt would be wasted work per request.
const approxMaxBytes = 4096 * 64

// loraOf returns the LoRA adapter req asks for, or "" for the base model.
// A request for an adapter is matched under the adapter's name, which vLLM
// hashes into every block; the base model's blocks are no hit for it.
func (f *fleet) loraOf(req *admission.Request) string {
	if f.index.IsLoRA(req.Model) {
		return req.Model
	}
	return ""
}

// approxKey is what the approximate tier keys req on: the start of the raw
// prompt, or of the raw messages array (a conversation's earlier turns are a
// byte prefix of its later requests), after a namespace of nsLen bytes so
// that requests whose KV blocks vLLM keeps apart although their text is
// equal — another LoRA adapter, another cache_salt — do not share a prefix
// in the tree. The namespace is empty for the base model without a salt,
// the common case.
func approxKey(req *admission.Request, lora string) (key string, nsLen int) {
	raw := req.Prompt
	if len(req.Messages) > 0 {
		raw = req.Messages
	}
	text := string(raw[:min(len(raw), approxMaxBytes)])
	if lora == "" && req.CacheSalt == "" {
		return text, 0
	}
	ns := "\x00lora:" + lora + "\x00salt:" + req.CacheSalt + "\x00"
	return ns + text, len(ns)
}

// promptIDs returns the prompt of a completion request given as token ids
// (vLLM hashes them as they are: no tokenizing needed), or nil.
func promptIDs(req *admission.Request) []uint64 {
	p := bytes.TrimSpace(req.Prompt)
	if len(p) < 3 || p[0] != '[' || len(req.Messages) > 0 {
		return nil
	}
	var ids []uint64
	if err := json.Unmarshal(p, &ids); err != nil || len(ids) == 0 {
		return nil // strings, or a batch of prompts
	}
	return ids
}

// spreadKey derives the tie-break key from the prompt's first block, so that
// requests sharing a prefix agree on where a cold prefix goes.
func spreadKey(tokens []uint64, bs int, text string) uint64 {
	h := fnv.New64a()
	if len(tokens) > 0 {
		var b [8]byte
		for _, t := range tokens[:min(len(tokens), bs)] {
			binary.LittleEndian.PutUint64(b[:], t)
			h.Write(b[:])
		}
	} else {
		h.Write([]byte(text[:min(len(text), 256)]))
	}
	return h.Sum64()
}

// account moves the request's admission reservation to the chosen engine, or
// reserves there when llm_admission did not run (released when the request
// ends).
func (f *fleet) account(r *http.Request, dial string) {
	e := f.registry.Ensure(dial)
	if res, ok := caddyhttp.GetVar(r.Context(), varReservation).(*upstreams.Reservation); ok && res != nil {
		res.Move(e)
		// The request reaches the engine only now: keep it counted as
		// dispatched until a scrape that starts after this succeeds.
		res.Sent()
		return
	}
	res := e.Reserve()
	// Handed to the engine now, like an admission reservation above: once
	// a scrape counts it, its end frees the slot before the next one.
	res.Sent()
	caddyhttp.SetVar(r.Context(), varReservation, res)
	context.AfterFunc(r.Context(), res.Done)
}

func (f *fleet) setPolicy(pool string, s routeSettings) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.policies == nil {
		f.policies = make(map[string]routeSettings)
	}
	f.policies[pool] = s
}

// policySettings are the settings of the pool's policy, or the defaults.
func (f *fleet) policySettings(pool string) routeSettings {
	f.mu.Lock()
	s, ok := f.policies[pool]
	f.mu.Unlock()
	if !ok {
		s = routeSettings{blockSize: 16, tokenize: true}
		s.cost.SetDefaults()
	}
	return s
}

func (f *fleet) setBreaker(cfg routing.BreakerConfig) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.breaker == nil || f.breakerCfg != cfg {
		f.breakerCfg = cfg
		f.breaker = routing.NewBreaker(cfg)
	}
}

func (f *fleet) currentBreaker() *routing.Breaker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.breaker
}

func (f *fleet) breakerAllow(dial string, now time.Time) bool {
	return f.currentBreaker().Allow(dial, now)
}

func (f *fleet) breakerFailure(dial string) { f.currentBreaker().Failure(dial, time.Now()) }

func (f *fleet) breakerSuccess(dial string) { f.currentBreaker().Success(dial, time.Now()) }

// reportOutcome feeds the circuit breaker with the result of a proxied
// request: transport errors and 5xx count against the replica.
func (f *fleet) reportOutcome(dial string, err error, status int) {
	if dial == "" {
		return
	}
	if err != nil || status == 0 || status >= 500 {
		f.breakerFailure(dial)
		return
	}
	f.breakerSuccess(dial)
}

// breakerRelease returns a half-open probe claimed by Allow for a replica
// that was not picked.
func (f *fleet) breakerRelease(dial string) {
	b := f.currentBreaker()
	if b.State(dial, time.Now()) == routing.StateHalfOpen {
		b.Release(dial)
	}
}

// seedChanged reports whether a new hash_seed differs from the old one.
func seedChanged(old, new *string) bool {
	if old == nil || new == nil {
		return old != new
	}
	return *old != *new
}

// applyVerify brings the running mirrors in line with a changed hash_seed:
// subscriptions read the seed only when they start, and a reload that
// changes it keeps them running. Counters restart with the new seed.
func (f *fleet) applyVerify() {
	f.mu.Lock()
	var cfg kvindex.VerifyConfig
	if f.verifySeed != nil {
		cfg = kvindex.VerifyConfig{Seed: *f.verifySeed, Sample: 16}
	}
	f.mu.Unlock()
	for _, st := range f.index.Stats() {
		if m := f.index.Mirror(st.Engine); m != nil {
			m.SetVerify(cfg)
		}
	}
}
