package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The late-join scenario (issue 35). A gateway that drops the KV events
// whose parent block it never saw is blind, once it starts after the
// engines (a restart, a deploy, a second instance), to every prefix the
// engines already hold and to every block extending one. The scenario
// warms the engines through one gateway, then starts another, and asks
// both, request by request on the same engine state, what they would
// match and pick (admin POST /llm/explain) while one of them routes the
// requests. Requests go one at a time and the next is explained only once
// both gateways have applied every event the last one caused, so the two
// answers always describe the same engines.

// LateJoinOptions make a scenario plan a late-join plan.
type LateJoinOptions struct {
	// WarmPerGroup is how many requests of each group the warm-up sends,
	// open loop at WarmRate × cap₀, through the gateway present from the
	// start: the engines then hold every group's prefix, some groups on
	// more than one engine, as load placed them.
	WarmPerGroup int     `json:"warm_per_group"`
	WarmRate     float64 `json:"warm_rate_x"`
	// Compared is how many requests after the warm-up are compared, one
	// at a time.
	Compared int `json:"compared"`
	// AppBody holds llm app options every gateway of the plan gets (what
	// lets a gateway recognise the engines' own block hashes). Lines the
	// built Caddy rejects as unknown are left out and reported, so the
	// plan also runs on a build from before they existed.
	AppBody string `json:"app_body,omitempty"`
	// NoReplay leaves the engines' replay endpoints out of the gateways'
	// config, so a new gateway cannot backfill from the engines' replay
	// buffers and learns what they hold from live events alone.
	NoReplay bool `json:"no_replay,omitempty"`
}

// LateJoinResult is one late-join plan's outcome.
type LateJoinResult struct {
	Workload string `json:"workload"`
	// AppBody is the app options the gateways ran with; Rejected, the
	// plan's options this build did not know.
	AppBody  string         `json:"app_body"`
	Rejected []string       `json:"rejected,omitempty"`
	Warm     int            `json:"warm"`
	Cases    []LateJoinCase `json:"cases"`
}

// LateJoinCase is one way of arriving late, on a fresh fleet.
type LateJoinCase struct {
	Name string `json:"name"`
	// NewRoutes: the new gateway routed the compared requests (else the
	// reference did, and the new one only answered explain). Restart:
	// the new gateway replaced the one that routed the warm-up, and the
	// reference is a third gateway, subscribed since before the warm-up,
	// that routes nothing.
	NewRoutes bool          `json:"new_routes"`
	Restart   bool          `json:"restart"`
	Rows      []LateJoinRow `json:"rows"`
	// NewBlocks and RefBlocks are the blocks each gateway mirrored, over
	// every engine, after the last compared request.
	NewBlocks int     `json:"new_blocks"`
	RefBlocks int     `json:"ref_blocks"`
	Wall      float64 `json:"wall_seconds"`
}

// LateJoinRow is one compared request.
type LateJoinRow struct {
	Group string `json:"group"`
	// New and Ref are the new and the reference gateway's explain of the
	// request, just before it was routed.
	New PickedBlocks `json:"new"`
	Ref PickedBlocks `json:"ref"`
	// The routed request as the load generator saw it: TTFT in simulated
	// seconds, the engine's usage, the gateway's X-LLM-Upstream.
	TTFT     float64 `json:"ttft"`
	Prompt   int     `json:"prompt_tokens"`
	Cached   int     `json:"cached_tokens"`
	Upstream string  `json:"upstream,omitempty"`
	Err      string  `json:"err,omitempty"`
}

// PickedBlocks is what one gateway's explain says of one request.
type PickedBlocks struct {
	// Prompt is the prompt's full blocks; Picked, the blocks its pick
	// holds on the precise tier, confirmed by events (speculative ones
	// left out); Best, the most any candidate holds that way.
	Prompt int    `json:"prompt"`
	Picked int    `json:"picked"`
	Best   int    `json:"best"`
	Pick   string `json:"pick,omitempty"`
	Err    string `json:"err,omitempty"`
}

// lateJoinCases are the ways of arriving late the scenario measures.
var lateJoinCases = []LateJoinCase{
	{Name: "late, observing"},
	{Name: "late, routing", NewRoutes: true},
	{Name: "restart", NewRoutes: true, Restart: true},
}

// lateJoin reports whether the plan is a late-join plan.
func (sc *ScenarioOptions) lateJoin() bool { return sc != nil && sc.LateJoin != nil }

// runLateJoin runs every late-join case of the plan with the section's
// "llm" policy; nil when the run's policies leave it out.
func runLateJoin(ctx context.Context, env *Env, p QualityParams, qw QualityWorkload, sessions []Session) (*LateJoinResult, error) {
	pol, ok := policyNamed(p.Policies, "llm")
	if !ok || !qw.Scenario.runs(pol.Name) {
		log.Printf("scenario %s: the run's policies leave out llm; skipped", qw.Spec.Name)
		return nil, nil
	}
	opts := qw.Scenario.LateJoin
	dir := filepath.Join(env.Out, "runs", qw.Spec.Name)
	kept, rejected, err := appOptionsAccepted(ctx, env.Caddy, dir, opts.AppBody)
	if err != nil {
		return nil, err
	}
	for _, r := range rejected {
		log.Printf("scenario %s: this Caddy build rejects the app option %q; the gateways run without it", qw.Spec.Name, r)
	}
	pol.AppBody = strings.TrimSpace(pol.AppBody + "\n" + kept)
	warm, compared := splitWarm(sessions, opts.WarmPerGroup, opts.Compared)
	res := &LateJoinResult{Workload: qw.Spec.Name, AppBody: kept, Rejected: rejected, Warm: len(warm)}
	for _, c := range lateJoinCases {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		run := lateJoinRun{env: env, p: p, qw: qw, pol: pol, warm: warm, compared: compared, noReplay: opts.NoReplay,
			dir: filepath.Join(dir, strings.NewReplacer(",", "", " ", "-").Replace(c.Name))}
		out, err := run.run(ctx, c)
		if err != nil {
			return res, fmt.Errorf("%s: %w", c.Name, err)
		}
		logLateJoin(qw.Spec.Name, out)
		res.Cases = append(res.Cases, out)
	}
	return res, nil
}

// policyNamed finds the policy called name.
func policyNamed(pols []PolicySpec, name string) (PolicySpec, bool) {
	for _, pol := range pols {
		if pol.Name == name {
			return pol, true
		}
	}
	return PolicySpec{}, false
}

// splitWarm keeps, in order, each group's first perGroup sessions for the
// warm-up and at most compared of the others for the comparison.
func splitWarm(sessions []Session, perGroup, compared int) (warm, rest []Session) {
	seen := map[string]int{}
	for _, s := range sessions {
		if seen[s.Key] < perGroup {
			seen[s.Key]++
			warm = append(warm, s)
		} else if len(rest) < compared {
			rest = append(rest, s)
		}
	}
	return warm, rest
}

// logLateJoin logs a case's figures as the report states them.
func logLateJoin(workload string, c LateJoinCase) {
	nw, ref := summarizeHits(c.Rows, newSide, nil), summarizeHits(c.Rows, refSide, nil)
	rt := summarizeRouted(c)
	log.Printf("scenario %s %-16s precise hit rate new %.3f ref %.3f (ratio %s), engine hit %.3f, ttft p50 %.2fs p90 %.2fs, failed %d, wall %.1fs",
		workload, c.Name, nw.rate(), ref.rate(), ratio(nw.rate(), ref.rate()), rt.EngineHit, rt.TTFT.P50, rt.TTFT.P90, rt.Failed, c.Wall)
}

// appOptionsAccepted splits the llm app option lines of body into those
// the built Caddy accepts and those it rejects as unknown, by adapting a
// Caddyfile with each line alone. Any other failure is an error.
func appOptionsAccepted(ctx context.Context, bin, dir, body string) (kept string, rejected []string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	path := filepath.Join(dir, "probe.Caddyfile")
	var keep []string
	for _, line := range strings.Split(body, "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		if err := os.WriteFile(path, []byte("{\n\tllm {\n\t\t"+line+"\n\t}\n}\n"), 0o644); err != nil {
			return "", nil, fmt.Errorf("writing %s: %w", path, err)
		}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := exec.CommandContext(actx, bin, "adapt", "--config", path, "--adapter", "caddyfile").CombinedOutput()
		cancel()
		switch {
		case err == nil:
			keep = append(keep, line)
		case unknownOption(string(out)):
			rejected = append(rejected, line)
		default:
			return "", nil, fmt.Errorf("caddy adapt with %q: %w\n%s", line, err, out)
		}
	}
	return strings.Join(keep, "\n"), rejected, nil
}

// unknownOption reports whether caddy adapt's output says an llm app
// option is unknown (caddymodule's UnmarshalCaddyfile).
func unknownOption(out string) bool {
	return strings.Contains(out, "unrecognized llm subdirective")
}

// lateJoinRun is what every case of a plan shares.
type lateJoinRun struct {
	env      *Env
	p        QualityParams
	qw       QualityWorkload
	pol      PolicySpec
	warm     []Session
	compared []Session
	noReplay bool
	dir      string
}

// run runs one case on a fresh fleet: the reference gateway (and, for a
// restart, the one to be restarted) subscribe, the warm-up goes through
// the gateway present from the start, the new gateway subscribes (after
// the restarted one left), and the compared requests go one at a time.
func (r lateJoinRun) run(ctx context.Context, c LateJoinCase) (LateJoinCase, error) {
	start := time.Now()
	fleet, err := startSimFleet(ctx, r.p.Engines, r.p.Model, r.qw.KVBlocks, r.p.TimeScale, r.p.tok)
	if err != nil {
		return c, err
	}
	defer fleet.Close()
	gc := r.p.gatewayConfig(fleet, r.pol)
	if r.noReplay {
		for i := range gc.Engines {
			gc.Engines[i].KVReplay = ""
		}
	}
	st := newStage(r.env.Caddy, fleet, gc, r.p.TimeScale)
	defer st.close()
	ref, err := st.join(ctx, filepath.Join(r.dir, "reference"))
	if err != nil {
		return c, err
	}
	warmer := ref
	if c.Restart {
		if warmer, err = st.join(ctx, filepath.Join(r.dir, "before-restart")); err != nil {
			return c, err
		}
	}
	if err := st.warmUp(ctx, r.env, warmer, r.warm, r.qw.Scenario.LateJoin.WarmRate*r.qw.CapMiss, r.qw.Spec.Seed+7); err != nil {
		return c, err
	}
	if c.Restart {
		if err := st.leave(ctx, warmer); err != nil {
			return c, err
		}
	}
	nw, err := st.join(ctx, filepath.Join(r.dir, "new"))
	if err != nil {
		return c, err
	}
	router := ref
	if c.NewRoutes {
		router = nw
	}
	if c.Rows, err = st.compare(ctx, r.compared, nw, ref, router); err != nil {
		return c, err
	}
	if err := st.record(ctx, &c, nw, ref, r.dir); err != nil {
		return c, err
	}
	c.Wall = time.Since(start).Seconds()
	return c, nil
}

// record notes the blocks each gateway mirrors after the comparison, and
// saves what each says of its event streams into dir, for digging.
func (st *stage) record(ctx context.Context, c *LateJoinCase, nw, ref *Gateway, dir string) error {
	for name, gw := range map[string]*Gateway{"new": nw, "reference": ref} {
		if err := st.saveEngines(ctx, gw, filepath.Join(dir, name+"-engines.json")); err != nil {
			log.Printf("saving %s's engines: %v", name, err)
		}
	}
	var err error
	if c.NewBlocks, err = st.mirrored(ctx, nw); err != nil {
		return err
	}
	c.RefBlocks, err = st.mirrored(ctx, ref)
	return err
}

// stage is one case's fleet and the gateways subscribed to it.
type stage struct {
	bin       string
	fleet     *SimFleet
	cfg       GatewayConfig
	timeScale float64
	client    *http.Client // requests through the gateways
	admin     *http.Client // admin API calls
	gws       []*Gateway
	// base holds, per gateway, the batches each engine had published
	// when the gateway subscribed: those it cannot have seen.
	base map[*Gateway][]uint64
}

func newStage(bin string, fleet *SimFleet, cfg GatewayConfig, timeScale float64) *stage {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	return &stage{bin: bin, fleet: fleet, cfg: cfg, timeScale: timeScale,
		client: &http.Client{Transport: tr}, admin: &http.Client{Timeout: 10 * time.Second},
		base: map[*Gateway][]uint64{}}
}

// close stops every gateway still running.
func (st *stage) close() {
	stopGateways(st.gws)
	st.client.CloseIdleConnections()
}

// join starts a gateway and returns once every engine publishes to it:
// ZeroMQ drops what a PUB socket sends before a subscription arrives, and
// a gateway's "connected" precedes that.
func (st *stage) join(ctx context.Context, dir string) (*Gateway, error) {
	gw, err := startGateway(ctx, st.bin, dir, st.cfg, true)
	if err != nil {
		return nil, err
	}
	st.gws = append(st.gws, gw)
	if err := st.waitSubscribers(ctx); err != nil {
		return nil, err
	}
	st.base[gw] = st.published()
	return gw, nil
}

// leave stops a gateway and returns once no engine counts it as a
// subscriber.
func (st *stage) leave(ctx context.Context, gw *Gateway) error {
	gw.Stop()
	for i, g := range st.gws {
		if g == gw {
			st.gws = append(st.gws[:i], st.gws[i+1:]...)
			break
		}
	}
	delete(st.base, gw)
	return st.waitSubscribers(ctx)
}

// waitSubscribers waits until every engine has exactly the running
// gateways as KV subscribers.
func (st *stage) waitSubscribers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, e := range st.fleet.Engines {
		if err := e.WaitKVSubscribers(ctx, len(st.gws)); err != nil {
			return fmt.Errorf("engine %s: %w", e.Addr(), err)
		}
	}
	return nil
}

// published is how many event batches each engine has published.
func (st *stage) published() []uint64 {
	out := make([]uint64, len(st.fleet.Engines))
	for i, e := range st.fleet.Engines {
		out[i] = e.Stats().BatchesPublished
	}
	return out
}

// dials are the engines' addresses, as the gateways name them.
func (st *stage) dials() []string {
	out := make([]string, len(st.fleet.Engines))
	for i, e := range st.fleet.Engines {
		out[i] = e.Addr()
	}
	return out
}

// warmUp sends the warm-up sessions through gw, open loop at rate
// requests per simulated second, and waits until every gateway has
// applied the events they caused. Every request must succeed: a group
// the engines do not hold would be no late-join test.
func (st *stage) warmUp(ctx context.Context, env *Env, gw *Gateway, sessions []Session, rate float64, seed uint64) error {
	cfg := LoadConfig{Rate: rate, Concurrency: 256, TimeScale: st.timeScale, Deadline: env.RunDeadline,
		RequestTimeout: env.RunDeadline, Stream: true, Seed: seed}
	recs := Run(ctx, Target{URL: gw.URL, Model: "sim-model", Client: st.client}, sessions, cfg)
	if len(recs) != len(sessions) {
		return fmt.Errorf("warm-up: %d of %d requests ran", len(recs), len(sessions))
	}
	for _, r := range recs {
		if !r.OK() {
			return fmt.Errorf("warm-up: %s", r.Err)
		}
	}
	return st.settle(ctx)
}

// compare sends the sessions one at a time through router, each after
// both gateways' explain of it, and waits after each until every gateway
// has applied the events it caused.
func (st *stage) compare(ctx context.Context, sessions []Session, nw, ref, router *Gateway) ([]LateJoinRow, error) {
	load := LoadConfig{Stream: true, RequestTimeout: time.Minute}
	target := Target{URL: router.URL, Model: "sim-model", Client: st.client}
	start := time.Now()
	rows := make([]LateJoinRow, 0, len(sessions))
	for _, s := range sessions {
		if len(s.Turns) != 1 {
			return rows, fmt.Errorf("session %s: %d turns; the comparison sends one-turn sessions", s.Key, len(s.Turns))
		}
		msgs := []chatMsg{{Role: "system", Content: s.System}, {Role: "user", Content: s.Turns[0].User}}
		body, err := json.Marshal(chatRequest{Model: target.Model, Messages: msgs, MaxTokens: s.Turns[0].MaxTokens,
			Stream: true, StreamOptions: &streamOptions{IncludeUsage: true}})
		if err != nil {
			return rows, err
		}
		row := LateJoinRow{Group: s.Key, New: st.explain(ctx, nw, body), Ref: st.explain(ctx, ref, body)}
		rec, _ := target.do(ctx, msgs, s.Key, s.Turns[0].MaxTokens, load, start)
		row.TTFT = rec.TTFT.Seconds() * st.timeScale
		row.Prompt, row.Cached, row.Upstream, row.Err = rec.PromptTokens, rec.CachedTokens, rec.Upstream, rec.Err
		rows = append(rows, row)
		if err := st.settle(ctx); err != nil {
			return rows, err
		}
	}
	return rows, ctx.Err()
}

// explainAnswer is the part of POST /llm/explain the scenario reads.
type explainAnswer struct {
	Candidates    []explainCandidate `json:"candidates"`
	Tokens        int                `json:"tokens"`
	BlockSize     int                `json:"block_size"`
	Pick          *string            `json:"pick"`
	TokenizeError string             `json:"tokenize_error"`
}

// explainCandidate is one engine in an explain.
type explainCandidate struct {
	Dial              string `json:"dial"`
	Tier              string `json:"tier"`
	MatchedBlocks     int    `json:"matched_blocks"`
	SpeculativeBlocks int    `json:"speculative_blocks"`
}

// picked condenses an explain: only blocks on the precise tier that the
// engine's events confirmed count, so a gateway's own speculative entries
// (what it routed itself in the last speculative_ttl) are no knowledge of
// the engines.
func (a explainAnswer) picked() PickedBlocks {
	var p PickedBlocks
	if a.BlockSize > 0 {
		p.Prompt = a.Tokens / a.BlockSize
	}
	if a.TokenizeError != "" {
		p.Err = "tokenize: " + a.TokenizeError
	}
	if a.Pick != nil {
		p.Pick = *a.Pick
	}
	for _, c := range a.Candidates {
		if c.Tier != "precise" {
			continue
		}
		n := max(0, c.MatchedBlocks-c.SpeculativeBlocks)
		p.Best = max(p.Best, n)
		if c.Dial == p.Pick {
			p.Picked = n
		}
	}
	return p
}

// explain asks gw where it would route the request body and what its pick
// holds.
func (st *stage) explain(ctx context.Context, gw *Gateway, body []byte) PickedBlocks {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, gw.AdminBase+"/llm/explain", bytes.NewReader(body))
	if err != nil {
		return PickedBlocks{Err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := st.admin.Do(req)
	if err != nil {
		return PickedBlocks{Err: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return PickedBlocks{Err: fmt.Sprintf("explain: status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))}
	}
	var a explainAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&a); err != nil {
		return PickedBlocks{Err: fmt.Sprintf("explain: %v", err)}
	}
	return a.picked()
}

// kvState is the part of GET /llm/engines the scenario reads: per engine
// the last event batch the gateway applied and the blocks it mirrors.
type kvState struct {
	Dial string `json:"dial"`
	KV   *struct {
		LastSeq *uint64 `json:"last_seq"`
		Blocks  int     `json:"blocks"`
	} `json:"kv"`
}

// kvStates reads gw's view of the engines' event streams.
func (st *stage) kvStates(ctx context.Context, gw *Gateway) ([]kvState, error) {
	var states []kvState
	if err := getJSON(ctx, st.admin, gw.AdminBase+"/llm/engines", &states); err != nil {
		return nil, fmt.Errorf("gateway %s: %w", gw.AdminBase, err)
	}
	return states, nil
}

// settle waits until every running gateway has applied every event batch
// the engines have published since it subscribed. Nothing else publishes
// meanwhile (the requests go one at a time), so the wait ends, and a
// gateway that stops applying events is an error, not a hang.
func (st *stage) settle(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	dials := st.dials()
	for {
		pub := st.published()
		done := true
		for _, gw := range st.gws {
			states, err := st.kvStates(ctx, gw)
			if err != nil {
				return err
			}
			if !caughtUp(dials, pub, st.base[gw], states) {
				done = false
				break
			}
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gateways did not apply the engines' events (published %v): %w", pub, ctx.Err())
		case <-tick.C:
		}
	}
}

// caughtUp reports whether a gateway whose engines' streams stand at
// states has applied every batch published (counted from 0, numbered
// from 0) by the engines at dials, except those that engine published
// before the gateway subscribed (base, nil for none): an engine silent
// since then needs nothing.
func caughtUp(dials []string, published, base []uint64, states []kvState) bool {
	last := map[string]uint64{}
	for _, s := range states {
		if s.KV != nil && s.KV.LastSeq != nil {
			last[s.Dial] = *s.KV.LastSeq
		}
	}
	for i, d := range dials {
		if base != nil && published[i] <= base[i] {
			continue
		}
		if published[i] == 0 {
			continue
		}
		seq, ok := last[d]
		if !ok || seq+1 < published[i] {
			return false
		}
	}
	return true
}

// saveEngines writes gw's GET /llm/engines as it answers it.
func (st *stage) saveEngines(ctx context.Context, gw *Gateway, path string) error {
	return saveGet(ctx, st.admin, gw.AdminBase+"/llm/engines", path)
}

// mirrored is how many blocks gw mirrors over every engine.
func (st *stage) mirrored(ctx context.Context, gw *Gateway) (int, error) {
	states, err := st.kvStates(ctx, gw)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range states {
		if s.KV != nil {
			n += s.KV.Blocks
		}
	}
	return n, nil
}
