package vllmsim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/llmgw/caddy-llmgw/kvindex"
)

// errRestarted fails the requests in flight when the engine restarts.
var errRestarted = errors.New("vllmsim: engine restarted")

// Faults are injected failures, settable with SetFaults or over
// GET/POST /sim/faults as JSON.
type Faults struct {
	// Metrics: "" ok | "error" (500) | "hang" (never answers until the
	// client gives up) | "garbage" | "html" | "huge" (50 MB body).
	Metrics         string        `json:"metrics"`
	TokenizeDelay   time.Duration `json:"tokenize_delay"`
	TokenizeFail    bool          `json:"tokenize_fail"`     // /tokenize answers 500
	DropStreamAfter int           `json:"drop_stream_after"` // >0: streams are cut abruptly after this many tokens
	SeqGap          int           `json:"seq_gap"`           // >0: the next published batch skips this many sequence numbers
	Error500        bool          `json:"error_500"`         // completions answer 500 with vLLM's JSON error
}

// UnmarshalJSON accepts tokenize_delay as nanoseconds or as a Go duration
// string ("250ms"), so the control API is easy to drive with curl.
func (f *Faults) UnmarshalJSON(b []byte) error {
	type plain Faults
	var aux struct {
		plain
		TokenizeDelay json.RawMessage `json:"tokenize_delay"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*f = Faults(aux.plain)
	f.TokenizeDelay = 0
	if d := bytes.TrimSpace(aux.TokenizeDelay); len(d) > 0 && !bytes.Equal(d, []byte("null")) {
		if d[0] == '"' {
			var s string
			if err := json.Unmarshal(d, &s); err != nil {
				return err
			}
			v, err := time.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("tokenize_delay: %w", err)
			}
			f.TokenizeDelay = v
		} else if err := json.Unmarshal(d, (*int64)(&f.TokenizeDelay)); err != nil {
			return fmt.Errorf("tokenize_delay: %w", err)
		}
	}
	return nil
}

func (f Faults) validate() error {
	switch f.Metrics {
	case "", "error", "hang", "garbage", "html", "huge":
	default:
		return fmt.Errorf("faults: unknown metrics mode %q", f.Metrics)
	}
	if f.TokenizeDelay < 0 || f.DropStreamAfter < 0 || f.SeqGap < 0 {
		return errors.New("faults: negative value")
	}
	return nil
}

// Stats is a snapshot of an engine's state and its counters since the last
// (simulated) process start.
type Stats struct {
	Running            int     `json:"running"`
	Waiting            int     `json:"waiting"`
	KVCacheUsage       float64 `json:"kv_cache_usage"`
	CachedBlocks       int     `json:"cached_blocks"`
	RequestsServed     uint64  `json:"requests_served"`
	PromptTokens       uint64  `json:"prompt_tokens"`
	CachedTokens       uint64  `json:"cached_tokens"` // prefix-cache hits, in tokens
	PrefixCacheQueries uint64  `json:"prefix_cache_queries"`
	GenerationTokens   uint64  `json:"generation_tokens"`
	Preemptions        uint64  `json:"preemptions"`
	BatchesPublished   uint64  `json:"batches_published"`
	EventsPublished    uint64  `json:"events_published"`
	KVMessagesDropped  uint64  `json:"kv_messages_dropped"` // subscriber queues full (HWM)
	Restarts           int     `json:"restarts"`
	Steps              uint64  `json:"steps"` // scheduler steps completed since the last restart
	// LoRALoads counts adapters loaded into a GPU slot (each costs
	// Config.LoRALoadTime).
	LoRALoads uint64 `json:"lora_loads"`
	// AdapterArrivals counts requests for a LoRA adapter; of those,
	// AdapterArrivalsInFlight arrived while the engine had requests for
	// the same adapter running or waiting (what vllm:lora_requests_info
	// shows a router): a request that joins its adapter's requests
	// neither loads it nor waits for a slot behind other adapters.
	AdapterArrivals         uint64 `json:"adapter_arrivals"`
	AdapterArrivalsInFlight uint64 `json:"adapter_arrivals_in_flight"`
	// RequestsByEndpoint counts the requests received on each API path
	// ("/v1/chat/completions", "/v1/responses", "/v1/messages",
	// "/v1/embeddings", "/pooling", "/score", "/rerank", "/v1/rerank",
	// "/classify", ...), valid or not, so that tests can check where a
	// gateway sent them.
	RequestsByEndpoint map[string]uint64 `json:"requests_by_endpoint"`
	// PoolingRequestsServed counts the pooling requests (one per input or
	// pair) that finished their prefill; they are also in RequestsServed.
	PoolingRequestsServed uint64 `json:"pooling_requests_served"`
	// ResponsesStored is the number of Responses API responses the engine
	// keeps for previous_response_id (at most Config.ResponsesStoreSize).
	ResponsesStored int `json:"responses_stored"`
}

// Engine is one simulated vLLM engine (one DP rank): an HTTP server, a
// scheduler goroutine and, optionally, a KV-event publisher.
type Engine struct {
	cfg      Config
	ln       net.Listener
	srv      *http.Server
	hashers  sync.Pool // *kvindex.Hasher for handlers
	pubEP    endpoint
	replayEP *endpoint
	loraIDs  map[string]int  // adapter name → lora_id, 1-based in Config order; read-only after Start
	aliases  map[string]bool // Config.ModelAliases; read-only after Start
	// responses are the stored Responses API conversations, for
	// previous_response_id; own lock.
	responses *responseStore

	mu       sync.Mutex
	waiting  []*simRequest
	running  []*simRequest
	step     []*simRequest
	hitBuf   []int32
	events   []kvEvent
	pool     *blockPool
	slots    *loraSlots      // --max-loras: the planned batch's adapters and the loaded ones
	hasher   *kvindex.Hasher // scheduler's, for generated blocks
	enc      *eventEncoder
	pub      *publisher
	ctr      counters
	epoch    uint64
	restarts int
	faults   Faults
	// sleepLevel is vLLM's sleep mode: 0 awake, else the level of the
	// last POST /sleep (see sleep.go).
	sleepLevel int
	simClock   float64   // simulated seconds at the end of the last step
	inStep     bool      // a step is being simulated
	stepWall   time.Time // wall time the current step started
	stepEnd    float64   // simulated time the current step ends
	// The gauges /metrics shows: vLLM renders them from the scheduler
	// stats of its last step, so a request shows only once a step has
	// run since it arrived (requests that arrive during a step are taken
	// in before the next one). submitted numbers arrivals; stepSeq is
	// submitted when the current or last step was planned.
	submitted, stepSeq         uint64
	shownRunning, shownWaiting int

	restartMu sync.Mutex // serialises Restart and Close
	closed    bool
	wake      chan struct{}
	stop      chan struct{}
	wg        sync.WaitGroup

	connMu   sync.Mutex
	conns    map[net.Conn]struct{}
	accepted uint64         // HTTP connections accepted, ever; guarded by connMu
	byModel  map[string]int // RequestsByModel; guarded by connMu
	handlers sync.WaitGroup
	stopping bool
}

// Start starts an engine. When it returns, the HTTP server is listening and
// the KV-event sockets are bound (or connecting). ctx only bounds startup;
// stop the engine with Close.
func Start(ctx context.Context, cfg Config) (*Engine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.DataParallelSize > 1 {
		return nil, fmt.Errorf("vllmsim: data parallel size %d: start it with StartDataParallel", cfg.DataParallelSize)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("vllmsim: start: %w", err)
	}
	hasher, err := kvindex.NewHasher(cfg.HashSeed, cfg.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("vllmsim: %w", err)
	}
	e := &Engine{
		cfg:     cfg,
		hasher:  hasher,
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		conns:   make(map[net.Conn]struct{}),
		byModel: make(map[string]int),
		ctr:     newCounters(),
	}
	e.loraIDs = loraIDs(cfg.LoRAModules)
	e.responses = newResponseStore(cfg.ResponsesStoreSize, maxStoredResponseBytes)
	e.aliases = make(map[string]bool, len(cfg.ModelAliases))
	for _, name := range cfg.ModelAliases {
		e.aliases[name] = true
	}
	e.hashers.New = func() any {
		h, _ := kvindex.NewHasher(cfg.HashSeed, cfg.BlockSize)
		return h
	}
	e.pool = newBlockPool(cfg.NumGPUBlocks, e.onEvict)
	e.slots = newLoRASlots(cfg.MaxLoRAs, len(cfg.LoRAModules))

	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("vllmsim: addr %q: %w", cfg.Addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if kv := cfg.KVEvents; kv != nil {
		e.enc = newEventEncoder(kv.MapEvents, kv.BytesHashes)
		if e.pubEP, err = parseEndpoint(kv.Endpoint, host); err != nil {
			return nil, fmt.Errorf("vllmsim: kv events: %w", err)
		}
		if kv.ReplayEndpoint != "" {
			rep, err := parseEndpoint(kv.ReplayEndpoint, host)
			if err != nil {
				return nil, fmt.Errorf("vllmsim: kv replay: %w", err)
			}
			rep.bind = true // vLLM always binds the ROUTER
			e.replayEP = &rep
		}
		pub, err := startPublisher(*kv, e.pubEP, e.replayEP)
		if err != nil {
			return nil, fmt.Errorf("vllmsim: %w", err)
		}
		// Restarts re-open on the ports actually bound.
		if pub.ln != nil {
			e.pubEP.addr = pub.ln.Addr().String()
		}
		if pub.rln != nil {
			e.replayEP.addr = pub.rln.Addr().String()
		}
		e.pub = pub
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Addr)
	if err != nil {
		if e.pub != nil {
			e.pub.close()
		}
		return nil, fmt.Errorf("vllmsim: listen %s: %w", cfg.Addr, err)
	}
	e.ln = ln
	e.srv = &http.Server{
		Handler:           e.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnState:         e.trackConn,
		ErrorLog:          nil,
	}
	e.wg.Add(2)
	go e.run()
	go func() {
		defer e.wg.Done()
		_ = e.srv.Serve(ln) // returns http.ErrServerClosed on Close
	}()
	return e, nil
}

// Config returns the engine's effective configuration (defaults applied).
func (e *Engine) Config() Config { return e.cfg }

// Addr is the "host:port" of the HTTP server, the address to dial.
func (e *Engine) Addr() string { return e.ln.Addr().String() }

// URL is "http://" + Addr().
func (e *Engine) URL() string { return "http://" + e.Addr() }

// KVEndpoint is the PUB endpoint a subscriber dials, or "" when events are
// off or the publisher connects out.
func (e *Engine) KVEndpoint() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cfg.KVEvents == nil || !e.pubEP.bind {
		return ""
	}
	return endpointString(addrOf(e.pubEP))
}

// ReplayEndpoint is the ROUTER replay endpoint, or "".
func (e *Engine) ReplayEndpoint() string {
	if e.replayEP == nil {
		return ""
	}
	return endpointString(addrOf(*e.replayEP))
}

func addrOf(ep endpoint) net.Addr {
	if ep.network == "unix" {
		return &net.UnixAddr{Name: ep.addr, Net: "unix"}
	}
	a, err := net.ResolveTCPAddr("tcp", ep.addr)
	if err != nil {
		return &net.TCPAddr{}
	}
	return a
}

// WaitKVSubscribers blocks until exactly n peers are connected to the PUB
// socket and subscribed to a prefix of the topic (n = 0 waits for every
// subscriber to go away). ZMQ drops what a PUB sends before a subscription
// arrives, so tests wait for this before sending.
func (e *Engine) WaitKVSubscribers(ctx context.Context, n int) error {
	for {
		e.mu.Lock()
		pub := e.pub
		e.mu.Unlock()
		if pub == nil {
			if e.cfg.KVEvents == nil {
				return errors.New("vllmsim: kv events are off")
			}
			if n == 0 {
				return nil // between the sockets of a restart nobody is subscribed
			}
			// Between the sockets of a restart.
			select {
			case <-ctx.Done():
				return fmt.Errorf("vllmsim: waiting for subscribers: %w", ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		have, changed := pub.subscribers()
		if have == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vllmsim: waiting for %d subscribers (have %d): %w", n, have, ctx.Err())
		case <-changed:
		case <-time.After(100 * time.Millisecond): // the publisher may have been replaced
		}
	}
}

// SetFaults replaces the injected faults.
func (e *Engine) SetFaults(f Faults) {
	e.mu.Lock()
	e.faults = f
	gap := f.SeqGap
	pub := e.pub
	e.faults.SeqGap = 0 // one-shot: applied to the publisher now
	e.mu.Unlock()
	if gap > 0 && pub != nil {
		pub.skip(gap)
	}
}

// Faults returns the injected faults.
func (e *Engine) Faults() Faults {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.faults
}

// Stats returns a snapshot of the engine's state and counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	var dropped uint64
	if e.pub != nil {
		e.pub.mu.Lock()
		dropped = e.pub.dropped
		e.pub.mu.Unlock()
	}
	return Stats{
		KVMessagesDropped:       dropped,
		Running:                 len(e.running),
		Waiting:                 len(e.waiting),
		KVCacheUsage:            e.pool.usage(),
		CachedBlocks:            e.pool.numCache,
		RequestsServed:          e.ctr.requestsServed,
		PromptTokens:            e.ctr.promptTokens,
		CachedTokens:            e.ctr.hits,
		PrefixCacheQueries:      e.ctr.queries,
		GenerationTokens:        e.ctr.genTokens,
		Preemptions:             e.ctr.preemptions,
		BatchesPublished:        e.ctr.batches,
		EventsPublished:         e.ctr.events,
		Restarts:                e.restarts,
		Steps:                   e.ctr.steps,
		LoRALoads:               e.ctr.loraLoads,
		AdapterArrivals:         e.ctr.adapterArrivals,
		AdapterArrivalsInFlight: e.ctr.adapterInFlight,
		RequestsByEndpoint:      maps.Clone(e.ctr.byEndpoint),
		PoolingRequestsServed:   e.ctr.poolingServed,
		ResponsesStored:         e.responses.len(),
	}
}

// countEndpoint counts a request for Stats.RequestsByEndpoint.
func (e *Engine) countEndpoint(path string) {
	e.mu.Lock()
	e.ctr.byEndpoint[path]++
	e.mu.Unlock()
}

// ResetPrefixCache is vLLM's reset_prefix_cache: it succeeds only when no
// block is in use, drops every cached block and publishes AllBlocksCleared.
func (e *Engine) ResetPrefixCache() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.pool.resetPrefixCache() {
		return false
	}
	if e.pub != nil {
		e.events = append(e.events, kvEvent{kind: evCleared})
		e.flushEventsLocked(time.Now())
	}
	return true
}

// Restart simulates a process restart: requests in flight fail and their
// connections close, the KV cache is emptied without an AllBlocksCleared
// event, counters and sequence numbers restart at 0, and the PUB/ROUTER
// sockets are closed and re-opened on the same ports.
func (e *Engine) Restart() error {
	e.restartMu.Lock()
	defer e.restartMu.Unlock()
	if e.closed {
		return errors.New("vllmsim: restart: engine closed")
	}
	e.mu.Lock()
	e.epoch++
	e.restarts++
	e.abortAllLocked(errRestarted)
	clear(e.events)
	e.events = e.events[:0]
	e.pool.reset()
	e.slots.reset()
	e.responses.clear() // stored responses live in the process's memory
	e.ctr = newCounters()
	e.shownRunning, e.shownWaiting = 0, 0
	old := e.pub
	e.pub = nil
	e.mu.Unlock()

	e.closeConns()
	if old == nil {
		return nil
	}
	old.close()
	pub, err := startPublisher(*e.cfg.KVEvents, e.pubEP, e.replayEP)
	if err != nil {
		return fmt.Errorf("vllmsim: restart: %w", err)
	}
	e.mu.Lock()
	e.pub = pub
	e.mu.Unlock()
	return nil
}

// abortAllLocked fails every request in flight with err and ends the
// step being simulated. e.mu held.
func (e *Engine) abortAllLocked(err error) {
	for _, r := range e.running {
		e.finishLocked(r, "abort", err)
	}
	for _, r := range e.waiting {
		e.finishLocked(r, "abort", err)
	}
	for _, r := range e.step {
		r.stepTokens = 0
	}
	e.running, e.waiting, e.step = nil, nil, e.step[:0]
	if e.inStep {
		e.simClock, e.inStep = e.stepEnd, false
	}
}

// Close stops the engine and waits for all of its goroutines.
func (e *Engine) Close() error {
	e.restartMu.Lock()
	defer e.restartMu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	close(e.stop)
	e.connMu.Lock()
	e.stopping = true
	e.connMu.Unlock()
	err := e.srv.Close()
	e.mu.Lock()
	for _, r := range e.running {
		e.finishLocked(r, "abort", errRestarted)
	}
	for _, r := range e.waiting {
		e.finishLocked(r, "abort", errRestarted)
	}
	pub := e.pub
	e.pub = nil
	e.mu.Unlock()
	e.handlers.Wait()
	e.wg.Wait()
	if pub != nil {
		pub.close()
	}
	if err != nil {
		return fmt.Errorf("vllmsim: close: %w", err)
	}
	return nil
}

func (e *Engine) trackConn(c net.Conn, s http.ConnState) {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	switch s {
	case http.StateNew:
		e.conns[c] = struct{}{}
		e.accepted++
	case http.StateClosed, http.StateHijacked:
		delete(e.conns, c)
	}
}

// Accepted is the number of HTTP connections the engine has accepted
// since it started: what a client that reuses its connections keeps low.
func (e *Engine) Accepted() uint64 {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	return e.accepted
}

// OtherModels is the RequestsByModel key that counts the requests for
// names it does not keep: beyond maxCountedModels distinct names, or longer
// than maxCountedName bytes.
const OtherModels = "<other>"

const (
	maxCountedModels = 1024
	maxCountedName   = 256
)

// RequestsByModel returns how many requests (completions, chat, responses,
// messages and pooling) the engine has received since Start, by the "model"
// their JSON body named ("" for none), whether it serves that model or not
// (it answers unknown names 404). It is test and bench instrumentation, not a vLLM metric: with
// Serves, a gateway test checks that no request reached an engine that does
// not serve its model. Restart does not reset it.
func (e *Engine) RequestsByModel() map[string]int {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	return maps.Clone(e.byModel)
}

// Serves reports whether the engine accepts model as a request's "model":
// the base model under any of its names (or "", which means the base
// model), or one of its adapters.
func (e *Engine) Serves(model string) bool {
	_, ok := e.lookupModel(model)
	return ok
}

// countRequest counts a request for RequestsByModel, keeping the map
// bounded whatever names clients send.
func (e *Engine) countRequest(model string) {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	if _, ok := e.byModel[model]; !ok && (len(model) > maxCountedName || len(e.byModel) >= maxCountedModels) {
		model = OtherModels
	}
	e.byModel[model]++
}

// closeConns drops every client connection, as a dying process would.
func (e *Engine) closeConns() {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	for c := range e.conns {
		_ = c.Close()
	}
}

// enterHandler registers a running handler unless the engine is closing.
func (e *Engine) enterHandler() bool {
	e.connMu.Lock()
	defer e.connMu.Unlock()
	if e.stopping {
		return false
	}
	e.handlers.Add(1)
	return true
}

// submit queues a request for the scheduler.
func (e *Engine) submit(r *simRequest) error {
	e.mu.Lock()
	select {
	case <-e.stop:
		e.mu.Unlock()
		return errRestarted
	default:
	}
	r.arrival = e.simNowLocked()
	e.countAdapterArrivalLocked(r.loraID)
	e.submitted++
	r.seq = e.submitted
	e.waiting = append(e.waiting, r)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return nil
}

// abort cancels a request whose client went away.
func (e *Engine) abort(r *simRequest) {
	e.mu.Lock()
	r.aborted = true
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// StartFleet starts n engines as the data-parallel ranks 0..n-1 of base.
// Fixed ports (HTTP, KV, replay) are offset by the rank, as vLLM does for DP
// ranks; port 0 gives every engine its own OS port. On error, the engines
// already started are closed.
func StartFleet(ctx context.Context, n int, base Config) ([]*Engine, error) {
	if n <= 0 {
		return nil, fmt.Errorf("vllmsim: fleet size %d must be positive", n)
	}
	engines := make([]*Engine, 0, n)
	fail := func(err error) ([]*Engine, error) {
		for _, e := range engines {
			_ = e.Close()
		}
		return nil, err
	}
	for r := range n {
		cfg := base
		cfg.DPRank = base.DPRank + r
		var err error
		if cfg.Addr, err = offsetHostPort(base.Addr, r); err != nil {
			return fail(fmt.Errorf("vllmsim: fleet addr: %w", err))
		}
		if base.KVEvents != nil {
			kv := *base.KVEvents
			if kv.Endpoint, err = offsetEndpoint(kv.Endpoint, r); err != nil {
				return fail(fmt.Errorf("vllmsim: fleet kv endpoint: %w", err))
			}
			if kv.ReplayEndpoint, err = offsetEndpoint(kv.ReplayEndpoint, r); err != nil {
				return fail(fmt.Errorf("vllmsim: fleet replay endpoint: %w", err))
			}
			cfg.KVEvents = &kv
		}
		e, err := Start(ctx, cfg)
		if err != nil {
			return fail(fmt.Errorf("vllmsim: fleet rank %d: %w", r, err))
		}
		engines = append(engines, e)
	}
	return engines, nil
}

// offsetHostPort adds r to a non-zero port.
func offsetHostPort(hostport string, r int) (string, error) {
	if hostport == "" {
		return "", nil
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("bad port in %q", hostport)
	}
	if p == 0 {
		return hostport, nil
	}
	if p+r > 65535 {
		return "", fmt.Errorf("port %d + rank %d out of range", p, r)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+r)), nil
}

// offsetEndpoint is vLLM's offset_endpoint_port for tcp endpoints; ipc
// endpoints get a "_dp<r>" suffix for r > 0 (vLLM refuses them).
func offsetEndpoint(ep string, r int) (string, error) {
	if ep == "" || r == 0 {
		return ep, nil
	}
	const tcp = "tcp://"
	if len(ep) > len(tcp) && ep[:len(tcp)] == tcp {
		hp, err := offsetHostPort(ep[len(tcp):], r)
		if err != nil {
			return "", err
		}
		return tcp + hp, nil
	}
	return ep + "_dp" + strconv.Itoa(r), nil
}

// loraIDs numbers adapters as vLLM numbers its --lora-modules: lora_int_id
// 1, 2, ... in the order given.
func loraIDs(names []string) map[string]int {
	if len(names) == 0 {
		return nil
	}
	ids := make(map[string]int, len(names))
	for i, name := range names {
		ids[name] = i + 1
	}
	return ids
}

// randomID returns a 32-hex-digit request id suffix.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
