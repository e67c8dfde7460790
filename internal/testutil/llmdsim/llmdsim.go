// Package llmdsim runs llm-d-inference-sim, the llm-d project's vLLM
// simulator, as a test peer: a real third-party engine that publishes
// KV-cache events, hashes blocks its own way (llm-d-kv-cache's
// ChunkedTokenDatabase) and serves /tokenize, /metrics and the OpenAI API.
//
// The binary is built from the nested module peer/ by build.sh, outside the
// root module's dependency graph; ./xcaddy.sh test builds it into
// .cache/bin and names it in LLMGW_LLMD_SIM. Without it the tests that need
// it skip with a loud message, and under CI (CI set) they fail.
//
// What an engine started here does, established against v0.10.2 (see
// llmdsim_test.go, which checks each point):
//   - Its ZMQ PUB socket connects to --zmq-endpoint (retrying every
//     second until something listens): the subscriber binds. For the
//     gateway that is kv_events bind tcp://host:port (Engine.KVEvents).
//     Each message is [topic, 8-byte big-endian seq from 1, msgpack
//     batch], topic "kv@<POD_IP>@<--model>".
//   - A batch is [ts, [event...], 0]; BlockStored is a 9-element array
//     [tag, hashes, parent, tokens, block_size, lora_id, "GPU", lora_name,
//     nil] whose parent is 0 for a prompt's first block, or with
//     --use-vllm-map-event-format a map whose parent_block_hash is nil.
//     Only the prompt's full blocks are stored, one event per request with
//     the blocks it did not hold (parent: the last block it held).
//   - Block hashes are FNV-64a over canonical CBOR [parent, tokens, extra],
//     chained from hash(fnv64a(seed), nil, model) where model is the first
//     served model name (whatever alias the request used), or the LoRA
//     adapter's name for a LoRA request.
//   - The tokenizer is the simulator's own (--force-dummy-tokenizer: one
//     FNV-32a id per word or punctuation mark, a chat rendered as
//     "### role: content\n" per message), the same for /tokenize and for
//     what it caches.
package llmdsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/freeport"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testdep"
)

// Version is the llm-d-inference-sim release build.sh builds and these
// tests were written against.
const Version = "v0.10.2"

// EnvBinary names the environment variable holding the simulator binary's
// path; ./xcaddy.sh test sets it.
const EnvBinary = "LLMGW_LLMD_SIM"

// DefaultModel is the model an engine serves unless Options.Model says
// otherwise. It is not a Hugging Face model name, and the engines run with
// --force-dummy-tokenizer anyway, so the simulator never looks it up
// online.
const DefaultModel = "llmdsim-model"

// Binary returns the simulator binary named by LLMGW_LLMD_SIM. When it is
// unset or not an executable file it fails the test under CI and skips it
// loudly elsewhere.
func Binary(t testing.TB) string {
	t.Helper()
	path := os.Getenv(EnvBinary)
	var err error
	if path == "" {
		err = errors.New(EnvBinary + " is not set")
	} else if st, serr := os.Stat(path); serr != nil {
		err = serr
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		err = fmt.Errorf("%s is not an executable file", path)
	}
	testdep.Dep{
		What: "llm-d-inference-sim " + Version + " (the third-party engine peer)",
		Hint: "build it with internal/testutil/llmdsim/build.sh DIR and set " + EnvBinary + "=DIR/llm-d-inference-sim-" + Version + " (./xcaddy.sh test does both)",
	}.Require(t, err)
	return path
}

// Options configure one simulated engine. Zero fields take the defaults
// noted.
type Options struct {
	// MapEvents selects vLLM's map-encoded events
	// (--use-vllm-map-event-format) instead of positional arrays.
	MapEvents bool
	// BlockSize is tokens per KV block: 8, 16, 32, 64 or 128; default 16.
	BlockSize int
	// KVCacheSize is the cache's capacity in blocks; default 1024.
	KVCacheSize int
	// HashSeed is the block hash seed; "" is the simulator's default,
	// the empty seed (PYTHONHASHSEED is kept from the engine's
	// environment, which would otherwise set it).
	HashSeed string
	// Model is the model served and hashed; default DefaultModel.
	Model string
	// MaxModelLen bounds prompt plus output tokens; default 8192 (the
	// simulator's 1024 is short for long shared prefixes).
	MaxModelLen int
	// EventBatchSize is how many events the engine sends in one batch;
	// default 1, so a request's events go out as it is admitted rather
	// than with the simulator's one-second flush.
	EventBatchSize int
	// Args are more command-line flags, appended last.
	Args []string
}

func (o Options) withDefaults() Options {
	if o.BlockSize == 0 {
		o.BlockSize = 16
	}
	if o.KVCacheSize == 0 {
		o.KVCacheSize = 1024
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.MaxModelLen == 0 {
		o.MaxModelLen = 8192
	}
	if o.EventBatchSize == 0 {
		o.EventBatchSize = 1
	}
	return o
}

// Engine is one running simulator process.
type Engine struct {
	opts    Options
	port    int
	zmqPort int
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has exited
	waitErr error         // the process's exit status, once exited is closed
	log     *tailBuffer
	client  *http.Client
}

// startTimeout bounds one process's start until it answers /v1/models;
// startAttempts bounds the retries after losing a port race.
const (
	startTimeout  = 30 * time.Second
	startAttempts = 5
)

// Start starts one engine on ports chosen now, waits until it serves, and
// stops it when the test ends. Its events go to ZMQEndpoint, where the
// caller binds a subscriber (the engine connects, and keeps retrying until
// one listens).
func Start(t testing.TB, opts Options) *Engine {
	t.Helper()
	return StartN(t, 1, opts)[0]
}

// StartN starts n engines with the same options, each on its own ports,
// concurrently (each takes a third of a second or so).
func StartN(t testing.TB, n int, opts Options) []*Engine {
	t.Helper()
	bin := Binary(t)
	opts = opts.withDefaults()
	engines := make([]*Engine, n)
	errs := make([]error, n)
	ports := &portSet{taken: map[int]bool{}}
	var wg sync.WaitGroup
	for i := range engines {
		wg.Go(func() { engines[i], errs[i] = start(bin, opts, ports) })
	}
	wg.Wait()
	for _, e := range engines {
		if e != nil {
			t.Cleanup(func() {
				if err := e.stop(); err != nil {
					t.Errorf("stopping llm-d-inference-sim on %s: %v", e.Addr(), err)
				}
				if t.Failed() {
					t.Logf("llm-d-inference-sim on %s, last log lines:\n%s", e.Addr(), lastLines(e.Log(), 20))
				}
			})
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return engines
}

// start starts one engine, retrying on fresh ports when another process
// takes the HTTP port between the probe and the engine's listen. ports
// keeps the engines started together off each other's ports: nothing
// listens on a ZMQ port until the subscriber binds it, so probing alone
// could hand two engines the same one.
func start(bin string, opts Options, ports *portSet) (*Engine, error) {
	var lastErr error
	for range startAttempts {
		// The ZMQ port is probed free on loopback only: the engine dials
		// it, the subscriber binds it there. The HTTP port must be free
		// on every interface, since the simulator listens on all.
		zmqPort, err := ports.free("127.0.0.1")
		if err != nil {
			return nil, err
		}
		port, err := ports.free("")
		if err != nil {
			return nil, err
		}
		e, err := startOn(bin, opts, port, zmqPort)
		if err == nil {
			return e, nil
		}
		lastErr = err
		if !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("llm-d-inference-sim: %d attempts lost a port race: %w", startAttempts, lastErr)
}

var errPortTaken = errors.New("port taken")

// startOn runs the binary on the given ports and waits until it serves.
func startOn(bin string, opts Options, port, zmqPort int) (*Engine, error) {
	e := &Engine{
		opts:    opts,
		port:    port,
		zmqPort: zmqPort,
		exited:  make(chan struct{}),
		log:     &tailBuffer{max: 64 << 10},
		client:  &http.Client{Timeout: 30 * time.Second},
	}
	args := []string{
		"--port", strconv.Itoa(port),
		"--model", opts.Model,
		// Never ask huggingface.co whether the model exists (the
		// simulator does at start for any name it is not told to
		// simulate): tests run offline, and the dummy tokenizer is what
		// they expect.
		"--force-dummy-tokenizer",
		"--enable-kvcache",
		"--zmq-endpoint", e.ZMQEndpoint(),
		"--block-size", strconv.Itoa(opts.BlockSize),
		"--kv-cache-size", strconv.Itoa(opts.KVCacheSize),
		"--event-batch-size", strconv.Itoa(opts.EventBatchSize),
		"--max-model-len", strconv.Itoa(opts.MaxModelLen),
		// Echo mode answers with the prompt's last message: deterministic
		// output, with no simulated latency by default.
		"--mode", "echo",
	}
	if opts.HashSeed != "" {
		args = append(args, "--hash-seed", opts.HashSeed)
	}
	if opts.MapEvents {
		args = append(args, "--use-vllm-map-event-format")
	}
	args = append(args, opts.Args...)
	e.cmd = exec.Command(bin, args...)
	e.cmd.Env = engineEnv()
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("llm-d-inference-sim: %w", err)
	}
	go func() {
		e.waitErr = e.cmd.Wait()
		close(e.exited)
	}()
	if err := e.waitReady(); err != nil {
		_ = e.stop()
		if strings.Contains(e.Log(), "address already in use") {
			return nil, fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return nil, fmt.Errorf("llm-d-inference-sim on port %d: %w; last log lines:\n%s", port, err, lastLines(e.Log(), 40))
	}
	return e, nil
}

// engineEnv is the test process's environment for an engine, with
// POD_IP (which the simulator requires for KV events, and puts in the
// topic) set to loopback, and without the variables that would override
// its flags' defaults.
func engineEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "POD_IP", "PYTHONHASHSEED", "SIM_MODEL":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "POD_IP=127.0.0.1")
}

// waitReady polls /v1/models until it lists the engine's model, the
// process exits, or startTimeout passes.
func (e *Engine) waitReady() error {
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		models, err := e.Models(ctx)
		cancel()
		if err == nil {
			for _, m := range models {
				if m == e.opts.Model {
					return nil
				}
			}
			// Another process answered on the port we probed free.
			return fmt.Errorf("%w: /v1/models lists %q, not %q", errPortTaken, models, e.opts.Model)
		}
		select {
		case <-e.exited:
			return fmt.Errorf("exited before serving (%v)", e.waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving /v1/models after %v: %v", startTimeout, err)
		}
	}
}

// stop ends the process: SIGTERM (the simulator shuts down its servers
// gracefully), then SIGKILL if it has not exited within 5 s. Stopping a
// stopped engine does nothing.
func (e *Engine) stop() error {
	// Idle keep-alive connections to a stopped engine would hold two
	// goroutines each until the engine's side closes.
	defer e.client.CloseIdleConnections()
	select {
	case <-e.exited:
		return nil
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
		return nil
	case <-time.After(5 * time.Second):
	}
	_ = e.cmd.Process.Kill()
	select {
	case <-e.exited:
		return errors.New("did not exit within 5s of SIGTERM; killed")
	case <-time.After(5 * time.Second):
		return errors.New("did not exit even after SIGKILL")
	}
}

// Addr is the engine's HTTP address, host:port, as the gateway dials it.
func (e *Engine) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)) }

// URL is the engine's base URL.
func (e *Engine) URL() string { return "http://" + e.Addr() }

// Model is the model the engine serves, and hashes its blocks with.
func (e *Engine) Model() string { return e.opts.Model }

// Options are the options the engine was started with, defaults filled
// in.
func (e *Engine) Options() Options { return e.opts }

// ZMQEndpoint is where the engine's PUB socket connects:
// tcp://127.0.0.1:port. A subscriber binds it.
func (e *Engine) ZMQEndpoint() string {
	return "tcp://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(e.zmqPort))
}

// KVEvents is the gateway's kv_events argument for this engine: bind
// ZMQEndpoint, since the engine connects.
func (e *Engine) KVEvents() string { return "bind " + e.ZMQEndpoint() }

// Topic is the ZMQ topic of the engine's event messages.
func (e *Engine) Topic() string { return "kv@127.0.0.1@" + e.opts.Model }

// Log returns the last 64 KiB the process wrote.
func (e *Engine) Log() string { return e.log.String() }

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatResponse is what Chat reads from an engine's answer.
type ChatResponse struct {
	Model string `json:"model"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// CachedTokens is usage.prompt_tokens_details.cached_tokens: the prompt
// tokens the engine found in its prefix cache (0 when absent).
func (r *ChatResponse) CachedTokens() int {
	if r.Usage.PromptTokensDetails == nil {
		return 0
	}
	return r.Usage.PromptTokensDetails.CachedTokens
}

// ChatBody is the JSON of a short, non-streaming chat completion request
// for model.
func ChatBody(model string, messages []Message) []byte {
	b, err := json.Marshal(map[string]any{"model": model, "messages": messages, "max_tokens": 1})
	if err != nil {
		panic(err) // strings only: cannot fail
	}
	return b
}

// Chat sends a short chat completion straight to the engine (warming its
// cache as another gateway or a direct client would) and decodes the
// answer.
func (e *Engine) Chat(ctx context.Context, messages []Message) (*ChatResponse, error) {
	out, err := e.Post(ctx, "/v1/chat/completions", ChatBody(e.opts.Model, messages))
	if err != nil {
		return nil, err
	}
	var r ChatResponse
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("llm-d-inference-sim chat answer %.200q: %w", out, err)
	}
	return &r, nil
}

// Tokenize asks the engine's /tokenize for the token ids of a chat
// (messages) or of a completion prompt (messages nil).
func (e *Engine) Tokenize(ctx context.Context, messages []Message, prompt string) ([]uint32, error) {
	req := map[string]any{"model": e.opts.Model}
	if messages != nil {
		req["messages"] = messages
	} else {
		req["prompt"] = prompt
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	out, err := e.Post(ctx, "/tokenize", body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("llm-d-inference-sim /tokenize answer %.200q: %w", out, err)
	}
	if r.Count != len(r.Tokens) {
		return nil, fmt.Errorf("llm-d-inference-sim /tokenize: count %d with %d tokens", r.Count, len(r.Tokens))
	}
	return r.Tokens, nil
}

// Models lists the ids /v1/models answers.
func (e *Engine) Models(ctx context.Context) ([]string, error) {
	out, err := e.Get(ctx, "/v1/models")
	if err != nil {
		return nil, err
	}
	var r struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("/v1/models answer %.200q: %w", out, err)
	}
	ids := make([]string, len(r.Data))
	for i, m := range r.Data {
		ids[i] = m.ID
	}
	return ids, nil
}

// Post posts a JSON body to path and returns a 200's body; other statuses
// are errors.
func (e *Engine) Post(ctx context.Context, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return e.do(req)
}

// Get gets path and returns a 200's body.
func (e *Engine) Get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.URL()+path, nil)
	if err != nil {
		return nil, err
	}
	return e.do(req)
}

// maxBody bounds what the helpers read of an answer.
const maxBody = 8 << 20

func (e *Engine) do(req *http.Request) ([]byte, error) {
	res, err := e.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	out, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", req.Method, req.URL.Path, err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %.300s", req.Method, req.URL.Path, res.Status, out)
	}
	return out, nil
}

// portSet hands out free ports, each once.
type portSet struct {
	mu    sync.Mutex
	taken map[int]bool
}

// free is freeport.Port, never returning a port it returned before.
func (s *portSet) free(host string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range 100 {
		port, err := freeport.Port(host)
		if err != nil {
			return 0, err
		}
		if !s.taken[port] {
			s.taken[port] = true
			return port, nil
		}
	}
	return 0, errors.New("llmdsim: no TCP port free that was not handed out already")
}

// lastLines is the last n lines of s: a failing test shows what the
// engine said last, not its start-up configuration dump.
func lastLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	i := len(s)
	for ; n > 0 && i > 0; n-- {
		i = strings.LastIndexByte(s[:i], '\n')
		if i < 0 {
			return s
		}
	}
	return s[i+1:]
}

// tailBuffer keeps the last max bytes written to it; the process writes
// from its own goroutines while tests read.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
