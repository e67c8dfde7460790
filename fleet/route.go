package fleet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"slices"
	"strconv"
	"time"
	"unsafe"

	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/remotetok"
	"github.com/llmgw/caddy-llmgw/routing"
	"github.com/llmgw/caddy-llmgw/upstreams"
)

// Settings are one pool's routing knobs: its llm policy's.
type Settings struct {
	Cost      routing.Config
	BlockSize int  // tokens per KV block for engines that have not reported theirs
	Tokenize  bool // call /tokenize for prompts that are not token ids
	// CacheKeyHeader is the policy's cache_key_header: requests carrying
	// it are pinned by the policy, so admission does not place them.
	CacheKeyHeader string
}

// DefaultSettings are a pool's settings before its policy registered any.
func DefaultSettings() Settings {
	s := Settings{BlockSize: 16, Tokenize: true}
	s.Cost.SetDefaults()
	return s
}

// Query is one routing question: where should this request go among these
// engines?
type Query struct {
	// Request is the parsed request; nil routes on load alone. Its raw
	// fields must be valid JSON, as openai.ParseRequest leaves them:
	// they are sent to /tokenize verbatim.
	Request *openai.Request
	// Dials are the candidate engines, in the proxy's order.
	Dials    []string
	Settings Settings
	// Own is the engine the request's admission reservation counts against
	// ("" for none). That reservation is left out of Own's load, or the
	// engine admission happened to reserve on would look busier than its
	// peers by this very request and never win a tie.
	Own string
	// CacheKey, when set, pins the request by rendezvous hashing over Dials.
	CacheKey string
	// Pin, when set, is the engine the request must go to, whatever its
	// prefix and load: the one that stored its previous_response_id (see
	// PreviousResponse). It outranks CacheKey. The decision's Index is
	// -1 when Pin is not among Dials.
	Pin string
	// Tokens are the prompt's token ids when the caller has them already;
	// nil: taken from a prompt given as ids, else from /tokenize.
	Tokens []uint64
	// Explain scores every candidate and marks those a policy leaves out
	// before routing (drained, breaker open).
	Explain bool

	// media are the prompt's media parts once tokenized (promptMedia).
	media mmPrompt
}

// Decision is a routing decision with what it was made from. Index is into
// Query.Dials, -1 when no candidate may take the request (the caller falls
// back to least-connections).
type Decision struct {
	routing.Decision
	Tokens    int // prompt tokens (0 when not tokenized)
	BlockSize int
	Tokenize  TokenizeResult
	// Multimodal says how the prompt's media entered its block keys ("" for
	// a text prompt; see mmKeys.describe).
	Multimodal string
	key        string // the approximate tier's key, once computed
	// keys are the prompt's block keys at BlockSize, kept for routed to
	// predict while speculative entries are on; nil otherwise.
	keys []uint64
	// match is what the index said each engine holds of keys when the
	// decision was made: routed predicts only past a run of stored blocks.
	match matches
	// lora is the LoRA adapter the request asks for ("" for a base
	// model), once the decision looked: routed tells its engine.
	lora string
	// slotWait is the part of Predicted the request is expected to wait
	// for a batch slot where admission placed it beyond the batch (see
	// slotWait), beyond the work ahead of it (Ahead); 0 otherwise.
	slotWait float64
}

// TokenizeResult says how the prompt's token ids were had.
type TokenizeResult struct {
	Local  bool          // by the model's local tokenizer (Took is its time)
	Called bool          // a /tokenize call was made or answered from the cache
	Cached bool          // answered from the tokenize cache
	Took   time.Duration // the call's duration (not for cache hits)
	Err    error         // the call failed: routed on the approximate tier

	// remote holds a /tokenize answer's ids until releaseTokens hands
	// their buffer back (remotetok.DerivedAnswer.Release).
	remote remotetok.DerivedAnswer
	// media are the prompt's media parts, found when it was tokenized
	// remotely: only the engines render media (mmkeys.go).
	media mmPrompt
}

// Route decides where a request goes: for each candidate the prefix it
// holds (precise tier from its KV mirror when its events are live and the
// prompt's tokens are known, approximate tier otherwise) and its load, and
// routing.Pick decides. It changes nothing: the returned [Pick] is the
// rest of the request's life, and its Commit records the outcome, so the
// explain API uses Route as is.
func (f *Fleet) Route(ctx context.Context, q Query) *Pick {
	return &Pick{Decision: f.route(ctx, q), f: f, req: q.Request, dials: q.Dials}
}

// route is Route's decision.
func (f *Fleet) route(ctx context.Context, q Query) Decision {
	if q.Pin != "" {
		d := Decision{Decision: routing.Decision{Index: slices.Index(q.Dials, q.Pin), Tier: routing.CacheKey, Outcome: routing.Hit}}
		if d.Index < 0 {
			d.Tier, d.Outcome = routing.LoadOnly, routing.Miss
		}
		return d
	}
	if q.CacheKey != "" && len(q.Dials) > 0 {
		return f.pinned(q)
	}
	if q.Request == nil || q.Request.PrefillOnly {
		// A pooling request (embeddings, score...) shares no prefix
		// worth routing on: pooling models mostly run without a prefix
		// cache, and their inputs are short. It goes by load alone.
		return Decision{Decision: routing.Decision{Index: -1, Tier: routing.LoadOnly, Outcome: routing.Miss}}
	}
	v := f.queryView(q)
	tokens, keys, tr := f.promptTokens(ctx, q, v)
	q.media = f.promptMedia(q, tr)
	d := f.decide(q, v, tokens, keys)
	d.Tokenize = releaseTokens(tokens, tr)
	return d
}

// pinned is the decision for a request with a cache key: rendezvous
// hashing over the candidates that may serve its model, so that the key
// keeps its engine while engines of other models come and go; -1 when
// none may.
func (f *Fleet) pinned(q Query) Decision {
	dials := q.Dials
	if q.Request != nil {
		dials, _ = f.Serving(q.Request.Model, q.Dials)
	}
	d := Decision{Decision: routing.Decision{Index: -1, Tier: routing.LoadOnly, Outcome: routing.Miss}}
	if len(dials) == 0 {
		return d
	}
	pinned := dials[routing.Rendezvous(q.CacheKey, dials)]
	d.Index, d.Tier, d.Outcome = slices.Index(q.Dials, pinned), routing.CacheKey, routing.Hit
	return d
}

// routed records that a request went to dial ([Pick.Commit]): the
// approximate tree learns its prefix there, and when the prompt's tokens were known and dial's KV
// events are live, the index predicts dial holds the prompt's blocks (a
// speculative entry, see [kvindex.Index.Predict]) until its events confirm
// them, its TTL (Config.SpeculativeTTL) ends, or a failure there is
// reported ([Attempt.Failed]), so that the requests sharing the prefix that
// follow before its events do are routed there too. That holds whatever
// tier the decision rested on: the first request of a new prefix matched
// nothing. d is the request's Decision from Route, or the zero Decision
// when it was not routed on its prompt (every candidate excluded, or no
// Route at all: [Fleet.Unrouted]).
//
// When dial's matched run was all stored blocks, only the blocks past it
// are predicted: Predict would look each block of the run up again only
// to find it stored and skip it, the larger part of routed's cost on a
// long prompt that an engine already holds. A block of that run that the
// engine drops while the request waits in admission is thus not
// predicted; the engine stores it again when it serves the request, and
// its event says so a prefill later. A run with predicted blocks in it is
// looked up whole, as a prediction may end before routed. Predict's bound
// per engine (kvindex.IndexConfig.MaxPredictedPerEngine, 32768 blocks by
// default) then counts from the run's end rather than the prompt's start:
// a prompt that long would have its blocks past the bound predicted.
func (f *Fleet) routed(req *openai.Request, d Decision, dial string) {
	if req == nil {
		return
	}
	lora := cmp.Or(d.lora, f.loraOf(req)) // the index's word when not routed
	if lora != "" {
		f.registry.Ensure(dial).SentAdapter(lora)
	}
	if d.keys != nil && f.live(dial) {
		keys := d.keys
		if d.match.predicted[dial] == 0 {
			keys = keys[min(d.match.precise[dial], len(keys)):]
		}
		if len(keys) > 0 {
			f.index.Predict(dial, d.BlockSize, 0, keys)
		}
	}
	key := d.key
	if key == "" {
		// Keyed exactly as a routed request would be.
		key, _ = approxKey(req, lora)
	}
	f.approx.Insert(key, dial)
}

// view is the candidates' engines and loads as one decision sees them.
type view struct {
	engines   []*upstreams.Engine
	loads     []upstreams.Load
	blockSize int
	// serving says, by candidate, whether it may serve the request's
	// model (Fleet.Serving); nil when all may.
	serving []bool
	// lora is the LoRA adapter the request asks for, "" for a base model
	// (see adapterOf).
	lora string
}

// queryView is the view of q's candidates, with what the request's model
// makes of them: who serves it, and whether it is a LoRA adapter.
func (f *Fleet) queryView(q Query) view {
	v := f.view(q.Dials, q.Settings)
	v.serving = f.servingMask(q.Request.Model, q.Dials)
	v.lora = f.adapterOf(q.Request.Model, v.engines)
	return v
}

// adapterOf returns model when it names a LoRA adapter, "" when it names a
// base model (or is unknown): an adapter is a name the index has seen
// blocks stored under (their lora_name), or one the first of engines to
// list model in its /v1/models lists with a parent. /v1/models makes an
// adapter known before its first block is stored, so its first requests
// are hashed under its name, as vLLM hashes them.
func (f *Fleet) adapterOf(model string, engines []*upstreams.Engine) string {
	if model == "" {
		return ""
	}
	if f.index.IsLoRA(model) {
		return model
	}
	for _, e := range engines {
		for _, m := range e.Models().List {
			if m.ID == model {
				if m.Parent != "" {
					return model
				}
				return ""
			}
		}
	}
	return ""
}

// adapterOn is where engine e stands for adapter lora, as routing.Pick
// weighs it; AdapterNone for a base model's request.
func adapterOn(e *upstreams.Engine, lora string) routing.Adapter {
	if lora == "" {
		return routing.AdapterNone
	}
	switch st := e.Adapter(lora); {
	case st.Running:
		return routing.AdapterRunning
	case st.Waiting:
		return routing.AdapterWaiting
	case st.FreeSlot:
		return routing.AdapterFreeSlot
	}
	return routing.AdapterNoSlot
}

// serves reports whether candidate i may serve the request's model.
func (v view) serves(i int) bool { return v.serving == nil || v.serving[i] }

// exclude marks c, candidate i, unavailable when it does not serve the
// request's model: sending the request there would only earn the engine's
// 404, however much of the prompt it holds.
func (v view) exclude(i int, c *routing.Candidate) {
	if !v.serves(i) {
		c.Unavailable = ReasonModelNotServed
	}
}

// view snapshots the candidates' loads and the fleet's block size: what the
// engines' events say, else their gauges, else the policy's setting.
func (f *Fleet) view(dials []string, s Settings) view {
	v := view{engines: make([]*upstreams.Engine, len(dials)), loads: make([]upstreams.Load, len(dials)), blockSize: s.BlockSize}
	for i, d := range dials {
		v.engines[i] = f.registry.Ensure(d)
		v.loads[i] = v.engines[i].Load()
		if v.loads[i].BlockSize > 0 && v.blockSize == s.BlockSize {
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

// matches are what the index and the tree say each engine holds of one
// prompt.
type matches struct {
	precise   map[string]int // blocks, by engine; nil when tokens are unknown
	predicted map[string]int // of those, the speculative ones
	// offloaded are the blocks past precise an engine keeps in its CPU,
	// then storage tier; nil when no engine offloads any.
	offloaded map[string][2]int
	approx    map[string]int // bytes of the key past its namespace, by engine
}

// decide is the decision proper, given the prompt's token ids (nil when
// they are unknown: the approximate tier only) and, when the tokenize
// cache had them, its block keys at v.blockSize (else nil).
func (f *Fleet) decide(q Query, v view, tokens, keys []uint64) Decision {
	d, rr, cands := f.prefixes(q, v, tokens, keys)
	d.Decision = routing.Pick(rr, cands, q.Settings.Cost, q.Explain)
	return d
}

// prefixes is what a decision weighs: for each candidate its load and the
// blocks of the prompt it holds, and the prompt as routing.Pick sees it.
func (f *Fleet) prefixes(q Query, v view, tokens, keys []uint64) (Decision, routing.Request, []routing.Candidate) {
	req := q.Request
	lora := v.lora
	key, nsLen := approxKey(req, lora)
	d := Decision{key: key, BlockSize: v.blockSize, lora: lora}
	textLen := len(req.Messages) + len(req.Prompt) // one of them is empty
	promptTokens := textLen / 4                    // rough bytes-per-token when untokenized
	var m matches
	if tokens != nil {
		d.Tokens, promptTokens = len(tokens), len(tokens)
		m = f.promptMatches(&d, q, tokens, keys)
	}
	total := promptTokens / v.blockSize
	live, unapplied := make([]bool, len(q.Dials)), make([]bool, len(q.Dials))
	allPrecise := tokens != nil
	for i, dial := range q.Dials {
		if tokens != nil {
			live[i], unapplied[i] = f.kvState(dial)
		}
		allPrecise = allPrecise && live[i]
	}
	if !allPrecise {
		// Only candidates on the approximate tier read the tree: a
		// fleet whose events are all live never walks it.
		f.approxMatches.Add(1)
		// The tree sees at most the key's first approxMaxBytes; its
		// match is a share of the whole prompt.
		approxList, _ := f.approx.Match(key)
		m.approx = make(map[string]int, len(approxList))
		for _, x := range approxList {
			m.approx[x.Engine] = max(x.Bytes-nsLen, 0) // the namespace is no part of the prompt
		}
	}
	cands := make([]routing.Candidate, len(q.Dials))
	for i, dial := range q.Dials {
		c := f.candidate(q, v.loads[i], dial)
		v.exclude(i, &c)
		c.Adapter = adapterOn(v.engines[i], lora)
		if live[i] {
			c.Tier, c.MatchedBlocks, c.Speculative = routing.Precise, m.precise[dial], m.predicted[dial]
			c.CPUBlocks, c.StorageBlocks = m.offloaded[dial][0], m.offloaded[dial][1]
		} else {
			c.Tier = routing.Approximate
			if unapplied[i] {
				c.TierReason = routing.ReasonKVUnapplied
			}
			if textLen > 0 {
				c.MatchedBlocks = int(float64(m.approx[dial]) / float64(textLen) * float64(total))
			}
		}
		cands[i] = c
	}
	rr := routing.Request{
		PromptTokens: promptTokens,
		BlockSize:    v.blockSize,
		TotalBlocks:  total,
		Key:          spreadKey(tokens, v.blockSize, key),
	}
	return d, rr, cands
}

// promptMatches is preciseMatches for q's prompt with tokens (and its keys
// at d.BlockSize, when known), under d's adapter: it records on d the keys
// routed predicts from and how the prompt's media were keyed.
func (f *Fleet) promptMatches(d *Decision, q Query, tokens, keys []uint64) matches {
	req := q.Request
	iq := kvindex.Query{Tokens: tokens, LoRAName: d.lora, CacheSalt: req.CacheSalt, Model: req.Model}
	mm := q.media.keys(tokens)
	d.Multimodal = mm.describe()
	m, predict := f.preciseMatches(iq, keys, d.BlockSize, mm)
	d.match, d.keys = m, predict
	if mm.media && !mm.keyed() {
		d.keys = nil // its keys past the first item name every image alike: no prediction
	}
	return m
}

// preciseMatches asks the index what each engine holds of the prompt, and
// returns the prompt's keys at blockSize when speculative entries are on,
// for routed. The Decision keeps them (8 bytes a block, 64 KiB for a
// 128Ki-token prompt) rather than a pooled buffer: it lives until routed,
// which may come after admission parked the request, so no owner could
// give the buffer back safely; they are hashed once for Match and Predict.
// keys, when not nil, are those keys already (from the tokenize cache).
// q is the prompt without keys.
// mm are the prompt's media: keyed ones must be in its keys.
func (f *Fleet) preciseMatches(q kvindex.Query, keys []uint64, blockSize int, mm mmKeys) (matches, []uint64) {
	m := matches{precise: make(map[string]int)} // predicted: made when needed, as most prompts have none
	predicting := f.index.PredictTTL() > 0
	if keys == nil && (predicting || mm.keyed()) {
		// Hashed once, for Match and for Predict.
		keys = f.keys.mmBlockKeys(q.Tokens, kvindex.KeySpec{BlockSize: blockSize, LoRAName: q.LoRAName, CacheSalt: q.CacheSalt}, mm)
	}
	if len(keys) > 0 {
		q.Keys, q.KeysBlockSize = keys, blockSize
	}
	q.MM = mm.items // for engines of other block sizes, and their orphans
	found, err := f.index.Match(q)
	if err == nil {
		for _, x := range found {
			m.precise[x.Engine] = x.Blocks
			if x.CPUBlocks+x.StorageBlocks > 0 {
				if m.offloaded == nil {
					m.offloaded = make(map[string][2]int)
				}
				m.offloaded[x.Engine] = [2]int{x.CPUBlocks, x.StorageBlocks}
			}
			if x.Predicted > 0 {
				if m.predicted == nil {
					m.predicted = make(map[string]int)
				}
				m.predicted[x.Engine] = x.Predicted
			}
		}
	}
	if !predicting {
		return m, nil
	}
	return m, q.Keys
}

// candidate is one engine's load as routing.Pick weighs it.
func (f *Fleet) candidate(q Query, l upstreams.Load, dial string) routing.Candidate {
	if dial == q.Own {
		l.Inflight, l.Dispatched = max(l.Inflight-1, 0), max(l.Dispatched-1, 0)
	}
	// The gauges less the requests seen finishing since the scrape, as
	// admission counts them, so both agree on which engines are full.
	running, waiting := l.Estimated()
	c := routing.Candidate{
		Dial:        dial,
		Running:     running,
		Waiting:     waiting,
		Inflight:    l.Inflight,
		Dispatched:  l.Dispatched,
		KVUsage:     l.KVUsage,
		MaxInflight: l.MaxInflight,
		LoadKnown:   l.Known,
		Work:        workOf(l),
	}
	if q.Explain {
		// What a policy leaves out before routing, shown as such.
		switch {
		case f.IsDrained(dial):
			c.Unavailable = "drained"
		case l.Asleep:
			c.Unavailable = "asleep"
		case f.Breaker().State(dial, time.Now()) == routing.StateOpen:
			c.Unavailable = "breaker_open"
		}
	}
	return c
}

// workOf is the engine's outstanding work and speeds as routing.Pick
// predicts a time to first token from them.
func workOf(l upstreams.Load) routing.Work {
	return routing.Work{
		OwnPrefill:    l.OwnPrefill,
		OwnPending:    l.OwnPending,
		OwnDecoding:   l.OwnDecoding,
		OwnDueSeconds: l.OwnDue.Seconds(),
		MeanUncached:  l.MeanUncached,
		PrefillRate:   l.PrefillRate,
		StepSeconds:   l.StepTime.Seconds(),
		SpeedAge:      l.SpeedAge.Seconds(),
		DrainRate:     l.DrainRate,
	}
}

// promptTokens are the prompt's token ids: the query's own, else a prompt
// given as ids, else (when the pool tokenizes) /tokenize's; nil when none
// could be had.
// The keys, when not nil, are the prompt's block keys at v.blockSize, from
// the tokenize cache.
func (f *Fleet) promptTokens(ctx context.Context, q Query, v view) (tokens, keys []uint64, tr TokenizeResult) {
	if q.Tokens != nil {
		return q.Tokens, nil, TokenizeResult{}
	}
	if ids := promptIDs(q.Request); ids != nil {
		return ids, nil, TokenizeResult{}
	}
	if !q.Settings.Tokenize {
		return nil, nil, TokenizeResult{}
	}
	return f.tokenizeKeyed(ctx, q.Request, v)
}

// tokenizeKeyed tokenizes the prompt with the model's local tokenizer
// when it has one, else asks the least busy healthy engine to tokenize the
// prompt exactly as it will render it (that engine also answers the local
// tokenizer's sampled checks), and has the prompt's block keys at
// v.blockSize when some candidate's events are live (nil otherwise, or
// when they cannot be had): they are kept in the tokenize cache entry
// with the ids, so that a repeated prompt is neither tokenized nor hashed
// again.
func (f *Fleet) tokenizeKeyed(ctx context.Context, req *openai.Request, v view) ([]uint64, []uint64, TokenizeResult) {
	pick := -1
	for i, l := range v.loads {
		if !v.serves(i) {
			continue // it cannot render the model's prompt
		}
		if pick < 0 || tokenizeRank(l) > tokenizeRank(v.loads[pick]) ||
			(tokenizeRank(l) == tokenizeRank(v.loads[pick]) && l.Inflight < v.loads[pick].Inflight) {
			pick = i
		}
	}
	if pick < 0 {
		return nil, nil, TokenizeResult{}
	}
	cfg := v.engines[pick].Config()
	tk, treq := f.tokenizer.Load(), tokenizeRequest(req)
	start := time.Now()
	if tokens, ok := f.localTokens(req, func(ctx context.Context) ([]uint64, error) {
		return tk.TokenizeFresh(ctx, cfg.TokenizeURL, cfg.Header, treq)
	}); ok {
		tr := TokenizeResult{Local: true, Took: time.Since(start)}
		if !f.anyLive(v) {
			return tokens, nil, tr
		}
		return tokens, f.keys.blockKeys(tokens, v.blockSize, v.lora, req.CacheSalt), tr
	}
	var tokens, keys []uint64
	var cached bool
	var err error
	var ans remotetok.DerivedAnswer
	mm := f.mmPromptOf(req) // only here: a local tokenizer refuses media
	if f.anyLive(v) {
		lora, salt, bs := v.lora, req.CacheSalt, v.blockSize
		// The media's identifiers are in the messages, which key the
		// cache; their spans depend on the image token too.
		tag := strconv.Itoa(bs) + "\x00" + lora + "\x00" + salt + "\x00" + strconv.FormatUint(mm.imageToken, 10)
		ans, err = tk.TokenizeDerived(ctx, cfg.TokenizeURL, cfg.Header, treq, tag,
			func(tokens []uint64) []uint64 {
				return f.keys.mmBlockKeys(tokens, kvindex.KeySpec{BlockSize: bs, LoRAName: lora, CacheSalt: salt}, mm.keys(tokens))
			})
		tokens, keys, cached = ans.Tokens, ans.Derived, ans.Cached
	} else {
		tokens, cached, err = tk.Tokenize(ctx, cfg.TokenizeURL, cfg.Header, treq)
	}
	tr := TokenizeResult{Called: true, Cached: cached, Err: err, remote: ans, media: mm}
	if err != nil {
		return nil, nil, tr
	}
	if !cached {
		tr.Took = time.Since(start)
	}
	return tokens, keys, tr
}

// tokenizeRequest is the /tokenize request for req: the fields that
// change the rendered prompt, copied from the client body as they are.
func tokenizeRequest(req *openai.Request) remotetok.TokenizeRequest {
	return remotetok.TokenizeRequest{
		Model:                req.Model,
		Prompt:               req.Prompt,
		Messages:             req.Messages,
		AddGenerationPrompt:  req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage,
		AddSpecialTokens:     req.AddSpecialTokens,
		ChatTemplate:         req.ChatTemplate,
		ChatTemplateKwargs:   req.ChatTemplateKwargs,
		Tools:                req.Tools,
		Verbatim:             true, // see Query.Request
	}
}

// anyLive reports whether some candidate of v has live KV events: only
// then are the prompt's block keys of use.
func (f *Fleet) anyLive(v view) bool {
	for _, e := range v.engines {
		if f.live(e.Dial()) {
			return true
		}
	}
	return false
}

// approxMaxBytes bounds the text the approximate tier keys on: the tree
// considers no more than its MaxChunks (4096) chunks of 64 bytes, so
// copying more of a long prompt would be wasted work per request.
const approxMaxBytes = 4096 * 64

// loraOf returns the LoRA adapter req asks for, or "" for the base model,
// as far as the index knows (adapterOf also asks the engines' model
// lists; this is for requests routed without a view of their engines).
// A request for an adapter is matched under the adapter's name, which vLLM
// hashes into every block; the base model's blocks are no hit for it.
func (f *Fleet) loraOf(req *openai.Request) string {
	if f.index.IsLoRA(req.Model) {
		return req.Model
	}
	return ""
}

// tokenizeRank orders engines for a /tokenize call: one whose last poll
// succeeded first, then one whose gauges are known although its last polls
// failed (a departed engine lingers so until stale, or until idle_ttl
// forgets it — right after a reload admission may still see it), unknown
// ones last.
func tokenizeRank(l upstreams.Load) int {
	switch {
	case l.Known && l.Failures == 0:
		return 2
	case l.Known:
		return 1
	}
	return 0
}

// approxKey is what the approximate tier keys req on: the start of the raw
// prompt, or of the raw messages array (a conversation's earlier turns are a
// byte prefix of its later requests), after a namespace of nsLen bytes so
// that requests whose KV blocks vLLM keeps apart although their text is
// equal — another LoRA adapter, another cache_salt — do not share a prefix
// in the tree. The namespace is empty for the base model without a salt,
// the common case.
func approxKey(req *openai.Request, lora string) (key string, nsLen int) {
	raw := req.Prompt
	if len(req.Messages) > 0 {
		raw = req.Messages
	}
	raw = raw[:min(len(raw), approxMaxBytes)]
	if lora == "" && req.CacheSalt == "" {
		if len(raw) == 0 {
			return "", 0
		}
		// The request's own bytes, not a copy (16 KiB per long request):
		// nothing writes to a parsed request's body, the tree hashes a
		// key and keeps none of it, and the key lives in the request's
		// Decision, no longer than the body it points into.
		return unsafe.String(unsafe.SliceData(raw), len(raw)), 0
	}
	ns := "\x00lora:" + lora + "\x00salt:" + req.CacheSalt + "\x00"
	return ns + string(raw), len(ns)
}

// promptIDs returns the prompt of a completion request given as token ids
// (vLLM hashes them as they are: no tokenizing needed), or nil.
func promptIDs(req *openai.Request) []uint64 {
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

// ContextLimit is the context length (max_model_len) a request for model
// must fit among dials: the smallest of the lengths the engines serving
// it report, since the request may go to any of them. It is 0, meaning
// unknown, when model is "" (the base model, whichever each engine has),
// when no engine of dials serves model, or when any engine that may serve
// it does not say: one whose models are unknown (it may serve anything,
// see Serving), one with configured names only, one whose /v1/models
// leaves the length out. A LoRA adapter runs with its base model's
// context, as /v1/models lists it on the same engine.
func (f *Fleet) ContextLimit(model string, dials []string) int {
	if model == "" {
		return 0
	}
	limit := 0
	for _, d := range dials {
		e, ok := f.registry.Get(d)
		if !ok {
			return 0
		}
		m := e.Models()
		if m.List == nil || m.Configured {
			return 0
		}
		n, serves := modelLen(m.List, model)
		switch {
		case !serves:
			continue
		case n <= 0:
			return 0
		case limit == 0 || n < limit:
			limit = n
		}
	}
	return limit
}

// modelLen is model's context length in one engine's model list (an
// adapter's is its parent's there), and whether the list has model.
func modelLen(list []upstreams.ServedModel, model string) (n int, serves bool) {
	i := slices.IndexFunc(list, func(m upstreams.ServedModel) bool { return m.ID == model })
	if i < 0 {
		return 0, false
	}
	m := list[i]
	if m.MaxModelLen > 0 || m.Parent == "" {
		return m.MaxModelLen, true
	}
	if p := slices.IndexFunc(list, func(p upstreams.ServedModel) bool { return p.ID == m.Parent }); p >= 0 {
		return list[p].MaxModelLen, true
	}
	return 0, true
}

// PromptTokens is how many tokens the prompt the placement was computed
// for has; 0 when they were not known (not tokenized, or tokenize failed).
func (p *Placement) PromptTokens() int { return p.decision.Tokens }
