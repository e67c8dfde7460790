package llmdsim_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/llmgw/caddy-llmgw/internal/testutil/llmdsim"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/kvindex/zmqsub"
)

// TestLLMDSimEvents starts a real llm-d-inference-sim, subscribes to its KV
// events with the gateway's own ZMTP subscriber (bound: the simulator
// connects), sends it two chats that share a prefix, and checks the two
// BlockStored batches as kvindex decodes them, in both wire formats: the
// tokens are /tokenize's, the hashes llm-d-kv-cache's, the first event has
// no parent and the second chains from the first's last shared block.
func TestLLMDSimEvents(t *testing.T) {
	for _, format := range []struct {
		name string
		maps bool
	}{{"array", false}, {"map", true}} {
		t.Run(format.name, func(t *testing.T) {
			const bs, seed = 16, "42"
			e := llmdsim.Start(t, llmdsim.Options{MapEvents: format.maps, BlockSize: bs, HashSeed: seed})
			sub := subscribe(t, e)
			sub.waitLive(t, e)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			system := llmdsim.Message{Role: "system", Content: prose("rome", 90)}
			first := []llmdsim.Message{system, {Role: "user", Content: "Who was Nero?"}}
			toks := tokenize(t, ctx, e, first)
			n := len(toks) / bs
			r, err := e.Chat(ctx, first)
			if err != nil {
				t.Fatal(err)
			}
			if r.Usage.PromptTokens != len(toks) || r.Usage.PromptTokensDetails == nil || r.CachedTokens() != 0 {
				t.Errorf("first chat usage %+v, want prompt_tokens %d (as /tokenize) and cached_tokens 0 reported", r.Usage, len(toks))
			}
			m := sub.stored(t, toks[:bs])
			if m.topic != e.Topic() {
				t.Errorf("topic %q, want %q", m.topic, e.Topic())
			}
			wantHashes := llmdHashes(seed, e.Model(), toks, bs)
			ev := onlyStored(t, m)
			checkStored(t, ev, bs, toks[:n*bs], wantHashes[:n])
			if ev.HasParent {
				// The array format writes parent_block_hash 0 for "none"
				// (wireParent below); kvindex reads 0 as no parent.
				t.Errorf("first event: HasParent true (Parent %d), want no parent", ev.Parent)
			}
			if p := wireParent(t, m.payload); format.maps && p != nil || !format.maps && !isZeroInt(p) {
				t.Errorf("first event's parent_block_hash on the wire is %#v, want %s", p, map[bool]string{false: "0", true: "nil"}[format.maps])
			}

			// The same system prompt with a longer question: the engine
			// holds the leading blocks, reports them cached, and stores
			// the rest chained from the last one it held.
			second := []llmdsim.Message{system, {Role: "user", Content: "Who was Nero, and who came after him?" + prose("succession", 30)}}
			toks2 := tokenize(t, ctx, e, second)
			shared := sharedBlocks(toks, toks2, bs)
			n2 := len(toks2) / bs
			if shared == 0 || shared >= n2 {
				t.Fatalf("test prompts share %d of %d blocks; want some but not all", shared, n2)
			}
			r2, err := e.Chat(ctx, second)
			if err != nil {
				t.Fatal(err)
			}
			if r2.CachedTokens() != shared*bs {
				t.Errorf("second chat cached_tokens %d, want %d (%d shared blocks)", r2.CachedTokens(), shared*bs, shared)
			}
			m2 := sub.stored(t, toks2[shared*bs:(shared+1)*bs])
			if m2.seq <= m.seq {
				t.Errorf("second batch seq %d after %d", m2.seq, m.seq)
			}
			ev2 := onlyStored(t, m2)
			checkStored(t, ev2, bs, toks2[shared*bs:n2*bs], llmdHashes(seed, e.Model(), toks2, bs)[shared:n2])
			if !ev2.HasParent || ev2.Parent != wantHashes[shared-1] {
				t.Errorf("second event parent %d (HasParent %v), want %d: the last block the engine held", ev2.Parent, ev2.HasParent, wantHashes[shared-1])
			}
		})
	}
}

// TestLLMDSimEndpoints checks what the gateway reads from the simulator besides
// events: /tokenize in both forms, /v1/models, and /metrics, whose prefix
// cache counter lacks vLLM's _total suffix.
func TestLLMDSimEndpoints(t *testing.T) {
	e := llmdsim.Start(t, llmdsim.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	models, err := e.Models(ctx)
	if err != nil || !slices.Contains(models, e.Model()) {
		t.Errorf("/v1/models: %q, %v; want %q listed", models, err, e.Model())
	}

	text := prose("tokenize", 40)
	chatToks, err := e.Tokenize(ctx, []llmdsim.Message{{Role: "user", Content: text}}, "")
	if err != nil {
		t.Fatal(err)
	}
	promptToks, err := e.Tokenize(ctx, nil, text)
	if err != nil {
		t.Fatal(err)
	}
	// The chat form renders "### user: <text>\n"; the completion form
	// tokenizes the text alone.
	wrapped, err := e.Tokenize(ctx, nil, "### user: "+text+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(promptToks) == 0 || slices.Equal(chatToks, promptToks) || !slices.Equal(chatToks, wrapped) {
		t.Errorf("/tokenize: chat form %d tokens, prompt form %d, prompt form of the rendered chat %d: want the chat form to equal the rendered chat's",
			len(chatToks), len(promptToks), len(wrapped))
	}

	msgs := []llmdsim.Message{{Role: "user", Content: text}}
	for range 2 {
		if _, err := e.Chat(ctx, msgs); err != nil {
			t.Fatal(err)
		}
	}
	page, err := e.Get(ctx, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	types, samples := scanMetrics(page)
	for name, typ := range map[string]string{
		"vllm:num_requests_running": "gauge",
		"vllm:num_requests_waiting": "gauge",
		"vllm:kv_cache_usage_perc":  "gauge",
		"vllm:cache_config_info":    "gauge",
		"vllm:prompt_tokens_total":  "counter",
		"vllm:prefix_cache_hits":    "counter",
		"vllm:prefix_cache_queries": "counter",
	} {
		if types[name] != typ {
			t.Errorf("/metrics: %s has TYPE %q, want %q", name, types[name], typ)
		}
	}
	if _, ok := types["vllm:prefix_cache_hits_total"]; ok {
		t.Errorf("/metrics has vllm:prefix_cache_hits_total: the simulator now names it as vLLM does; update the facts in the llmdsim package doc")
	}
	// The second chat found its full blocks cached.
	if want := float64(len(chatToks) / 16 * 16); samples[`vllm:prefix_cache_hits{model_name="`+e.Model()+`"}`] != want {
		t.Errorf("vllm:prefix_cache_hits = %v, want %v", samples[`vllm:prefix_cache_hits{model_name="`+e.Model()+`"}`], want)
	}
	if s := `vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"}`; samples[s] != 1 {
		t.Errorf("/metrics lacks %s 1", s)
	}
}

// message is one event message as the subscriber delivered it.
type message struct {
	topic   string
	seq     uint64
	payload []byte
}

// subscriber collects an engine's event messages.
type subscriber struct {
	msgs chan message
	sub  *zmqsub.Subscriber
}

// subscribe binds a SUB at the engine's ZMQ endpoint until the test ends.
func subscribe(t *testing.T, e *llmdsim.Engine) *subscriber {
	t.Helper()
	sub, err := zmqsub.NewSubscriber(zmqsub.Config{Endpoint: e.ZMQEndpoint(), Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	s := &subscriber{msgs: make(chan message, 256), sub: sub}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sub.Run(ctx, handler{ctx: ctx, msgs: s.msgs})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s
}

// handler forwards messages to a channel.
type handler struct {
	ctx  context.Context
	msgs chan<- message
}

func (handler) Connected()         {}
func (handler) Disconnected(error) {}
func (h handler) Message(topic []byte, seq uint64, payload []byte) {
	select {
	case h.msgs <- message{string(topic), seq, payload}:
	case <-h.ctx.Done():
	}
}

// waitLive returns once a message from e has arrived: the engine has
// connected and has our subscription (a PUB drops what it sends before
// the subscription reaches it, so seeing the connection is not enough).
// It sends probe chats, each of its own prefix, until one's event arrives.
func (s *subscriber) waitLive(t *testing.T, e *llmdsim.Engine) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("no KV event from the engine within 20s of probing; subscriber %+v", s.sub.Stats())
		}
		if !s.sub.Stats().Connected {
			// The engine redials once a second until something listens.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := e.Chat(ctx, []llmdsim.Message{{Role: "user", Content: prose(fmt.Sprintf("probe%d", i), 40)}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-s.msgs:
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// stored returns the next message whose BlockStored event starts with
// the tokens firstBlock, skipping others (late probes), or fails after
// 10s.
func (s *subscriber) stored(t *testing.T, firstBlock []uint32) message {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-s.msgs:
			b, err := kvindex.DecodeBatch(m.payload)
			if err != nil {
				t.Fatalf("DecodeBatch seq %d: %v", m.seq, err)
			}
			for _, ev := range b.Events {
				if ev.Kind == kvindex.EventBlockStored && len(ev.TokenIDs) >= len(firstBlock) && equalTokens(ev.TokenIDs[:len(firstBlock)], firstBlock) {
					return m
				}
			}
		case <-timeout:
			t.Fatalf("no BlockStored event starting with tokens %v within 10s", firstBlock)
		}
	}
}

// onlyStored decodes m and returns its one event, a BlockStored from the
// GPU of data-parallel rank 0.
func onlyStored(t *testing.T, m message) kvindex.Event {
	t.Helper()
	b, err := kvindex.DecodeBatch(m.payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || b.Unknown != 0 || b.Events[0].Kind != kvindex.EventBlockStored {
		t.Fatalf("batch seq %d: %d events (%d unknown), want one BlockStored: %+v", m.seq, len(b.Events), b.Unknown, b.Events)
	}
	if !b.HasDPRank || b.DPRank != 0 || b.TS <= 0 {
		t.Errorf("batch seq %d: ts %v, dp rank %d (present %v); want a timestamp and rank 0", m.seq, b.TS, b.DPRank, b.HasDPRank)
	}
	return b.Events[0]
}

// checkStored checks a BlockStored event's block size, tokens and hashes.
func checkStored(t *testing.T, ev kvindex.Event, bs int, tokens []uint32, hashes []uint64) {
	t.Helper()
	if ev.BlockSize != bs || ev.Medium != "GPU" {
		t.Errorf("event block size %d medium %q, want %d GPU", ev.BlockSize, ev.Medium, bs)
	}
	if !equalTokens(ev.TokenIDs, tokens) {
		t.Errorf("event tokens (%d) are not the prompt's full blocks as /tokenize gives them (%d)", len(ev.TokenIDs), len(tokens))
	}
	if !slices.Equal(ev.BlockHashes, hashes) {
		t.Errorf("event block hashes %v, want llm-d-kv-cache's %v", ev.BlockHashes, hashes)
	}
}

// wireParent is the first event's parent_block_hash as msgpack decodes it
// generically, independent of kvindex's decoder.
func wireParent(t *testing.T, payload []byte) any {
	t.Helper()
	var batch []any
	if err := msgpack.Unmarshal(payload, &batch); err != nil || len(batch) < 2 {
		t.Fatalf("batch: %v (%d elements)", err, len(batch))
	}
	events, _ := batch[1].([]any)
	if len(events) == 0 {
		t.Fatal("batch without events")
	}
	switch ev := events[0].(type) {
	case []any:
		if len(ev) != 9 {
			t.Errorf("array BlockStored has %d elements, want 9", len(ev))
		}
		return ev[2]
	case map[string]any:
		p, ok := ev["parent_block_hash"]
		if !ok {
			t.Error("map BlockStored without parent_block_hash")
		}
		return p
	}
	t.Fatalf("event of type %T", events[0])
	return nil
}

// isZeroInt reports whether v is an integer 0 of any Go integer type
// (msgpack decodes a 0 as the type its encoding names).
func isZeroInt(v any) bool {
	r := reflect.ValueOf(v)
	return r.CanInt() && r.Int() == 0 || r.CanUint() && r.Uint() == 0
}

// llmdHashes is llm-d-kv-cache's ChunkedTokenDatabase, written out: each
// full block's hash is FNV-64a of the canonical CBOR of [parent, tokens,
// extra], chained from hash(fnv64a(seed), nil, model).
func llmdHashes(seed, model string, tokens []uint32, bs int) []uint64 {
	enc, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		panic(err)
	}
	hash := func(parent uint64, toks []uint32, extra any) uint64 {
		b, err := enc.Marshal([]any{parent, toks, extra})
		if err != nil {
			panic(err)
		}
		h := fnv.New64a()
		h.Write(b)
		return h.Sum64()
	}
	s := fnv.New64a()
	s.Write([]byte(seed))
	parent := hash(s.Sum64(), nil, model)
	var out []uint64
	for i := 0; i+bs <= len(tokens); i += bs {
		parent = hash(parent, tokens[i:i+bs], nil)
		out = append(out, parent)
	}
	return out
}

// tokenize is Engine.Tokenize for a chat, failing the test on error.
func tokenize(t *testing.T, ctx context.Context, e *llmdsim.Engine, msgs []llmdsim.Message) []uint32 {
	t.Helper()
	toks, err := e.Tokenize(ctx, msgs, "")
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// sharedBlocks counts the leading full blocks a and b have in common.
func sharedBlocks(a, b []uint32, bs int) int {
	n := 0
	for (n+1)*bs <= min(len(a), len(b)) && slices.Equal(a[n*bs:(n+1)*bs], b[n*bs:(n+1)*bs]) {
		n++
	}
	return n
}

func equalTokens(got []uint64, want []uint32) bool {
	if len(got) != len(want) {
		return false
	}
	for i, w := range want {
		if got[i] != uint64(w) {
			return false
		}
	}
	return true
}

// prose is n distinct words, each one token for the simulator's
// tokenizer.
func prose(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, " %s%d", tag, i)
	}
	return b.String()
}

// scanMetrics reads a text exposition page: each family's TYPE, and each
// sample's value by its series as written.
func scanMetrics(page []byte) (types map[string]string, samples map[string]float64) {
	types, samples = map[string]string{}, map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(page))
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
			samples[line[:i]] = v
		}
	}
	return types, samples
}
