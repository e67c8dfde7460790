package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"

	"github.com/llmgw/caddy-llmgw/internal/testutil/llmdsim"
)

// The conformance scenario's shape: engines, prompt groups, how many
// first requests must land on the engine that holds their group's prefix,
// and the engines' hash seed (llm-d's, which the gateway's hash_seed must
// match for hash_algo llmd_fnv64a_cbor).
const (
	confEngines   = 4
	confGroups    = 8
	confMinHits   = 7
	confHashSeed  = "1234"
	confBlockSize = 16
)

// TestLLMDSimConformance routes in front of four real llm-d-inference-sim
// engines (a third-party engine: its own event encoder, its own block
// hashing, its PUB connecting to the gateway) in both of its event
// formats. Eight groups of requests each share a long system prompt; each
// group's prefix is warmed directly on an engine picked by a seeded
// shuffle, and the group's first request through Caddy must find it there
// (7 of 8 at least: the engine's own cached_tokens and the gateway's
// X-LLM-Upstream say where it went).
//
//   - subscribed: the gateway is subscribed before the warm-up and sees
//     every block from the first.
//   - late: the gateway starts after the warm-up; then each group's
//     engine gets a second direct request, whose event extends the
//     warmed prefix from a parent the gateway never saw. Only the
//     engines' own hashes (hash_algo llmd_fnv64a_cbor, hash_seed) let
//     the gateway recognise that prefix in a prompt.
func TestLLMDSimConformance(t *testing.T) {
	for fi, format := range []struct {
		name string
		maps bool
	}{{"array", false}, {"map", true}} {
		t.Run(format.name, func(t *testing.T) {
			t.Run("subscribed", func(t *testing.T) { runConformance(t, format.maps, false, uint64(2*fi)) })
			t.Run("late", func(t *testing.T) { runConformance(t, format.maps, true, uint64(2*fi+1)) })
		})
	}
}

// runConformance runs one case; stream seeds the shuffle that assigns
// groups to engines.
func runConformance(t *testing.T, maps, late bool, stream uint64) {
	engines := llmdsim.StartN(t, confEngines, llmdsim.Options{MapEvents: maps, BlockSize: confBlockSize, HashSeed: confHashSeed})
	groups := confGroupsFor(stream)
	gw := gateway{
		// patient: no /tokenize or scrape timeout on a loaded machine may
		// push a decision onto the approximate tier.
		patient:  true,
		engines:  llmdsimEngines(engines),
		appExtra: "\t\thash_algo llmd_fnv64a_cbor\n\t\thash_seed " + confHashSeed + "\n",
		policy:   "\t\t\tdebug_headers\n",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if !late {
		t.Cleanup(func() { resetGateway(t) })
		gw.load(t)
		stored := waitLLMDSimEvents(t, engines)
		warmGroups(t, ctx, engines, groups, 0)
		waitStored(t, engines, stored, groups, "the warm-up's events")
	} else {
		// Nothing listens yet: the engines drop these events (a PUB
		// without subscribers sends nowhere).
		warmGroups(t, ctx, engines, groups, 0)
		t.Cleanup(func() { resetGateway(t) })
		gw.load(t)
		stored := waitLLMDSimEvents(t, engines)
		// The engines now hold each prefix and store the blocks after it
		// with the last one as parent: unknown to this gateway.
		warmGroups(t, ctx, engines, groups, 1)
		waitStored(t, engines, stored, groups, "the second requests' events (parents unseen)")
	}

	// An engine that looks busy in its last scrape is rightly weighed
	// against the prefill it saves; the direct requests above must not
	// be what decides.
	for _, e := range engines {
		waitIdle(t, e.Addr())
	}
	results := make([]confResult, len(groups))
	for i, g := range groups {
		body := string(llmdsim.ChatBody(llmdsim.DefaultModel, g.messages(2)))
		results[i] = confResult{group: i, warmed: engines[g.engine].Addr(), explain: explainSummary(t, body)}
		r := send(ctx, "", body, nil)
		if r.err != nil || r.status != http.StatusOK || r.upstream == "" {
			t.Fatalf("group %d through the gateway: status %d, err %v, X-LLM-Upstream %q, body %.300s", i, r.status, r.err, r.upstream, r.body)
		}
		var cr llmdsim.ChatResponse
		if err := json.Unmarshal([]byte(r.body), &cr); err != nil {
			t.Fatalf("group %d: answer %.300q: %v", i, r.body, err)
		}
		results[i].served, results[i].tier, results[i].cached = r.upstream, r.tier, cr.CachedTokens()
		// The next group's decision should see this request's engine as
		// idle again too.
		waitIdle(t, r.upstream)
	}

	hits := 0
	for _, r := range results {
		if r.served == r.warmed {
			hits++
		}
		// The engine's own account: a request on the warmed engine finds
		// at least the system prompt's full blocks cached, anywhere else
		// nothing (no other engine saw the group).
		if (r.served == r.warmed) != (r.cached > 0) {
			t.Errorf("group %d served by %s (warmed %s) with cached_tokens %d: the engines disagree with X-LLM-Upstream", r.group, r.served, r.warmed, r.cached)
		}
	}
	if hits < confMinHits {
		t.Errorf("%d of %d groups' first requests went to the engine holding their prefix, want at least %d:\n%s\nengines' KV view: %s",
			hits, len(groups), confMinHits, confTable(results), llmdsimKVStates(t))
	} else {
		t.Logf("%d of %d groups on their warmed engine:\n%s\nengines' KV view: %s", hits, len(groups), confTable(results), llmdsimKVStates(t))
	}
}

// confGroup is one group of requests: its long system prompt, the engine
// it is warmed on (an index into the engines), and its questions.
type confGroup struct {
	system string
	engine int
	id     int
}

// messages is the group's i-th request: the shared system prompt and a
// question of its own. Each question is longer than two blocks, so every
// request stores at least one block past the shared prefix.
func (g confGroup) messages(i int) []llmdsim.Message {
	q := fmt.Sprintf("Question %d of group %d: %s what does the archive record about these matters, and why?", i, g.id, confWords(seedQuestion+uint64(1000*g.id+i), 30))
	return []llmdsim.Message{{Role: "system", Content: g.system}, {Role: "user", Content: q}}
}

// confGroupsFor builds the groups, each warmed on an engine from a seeded
// shuffle that gives every engine two groups: a gateway that always picks
// one engine gets two of eight right.
func confGroupsFor(stream uint64) []confGroup {
	rng := rand.New(rand.NewPCG(20260101, stream))
	owners := make([]int, confGroups)
	for i := range owners {
		owners[i] = i % confEngines
	}
	rng.Shuffle(len(owners), func(i, j int) { owners[i], owners[j] = owners[j], owners[i] })
	groups := make([]confGroup, confGroups)
	for i := range groups {
		system := fmt.Sprintf("You are the archivist of collection %d. Answer from the collection only.%s", i, confWords(seedSystem+uint64(i), 420))
		groups[i] = confGroup{system: system, engine: owners[i], id: i}
	}
	return groups
}

// confVocabulary is the words the prompts are made of.
var confVocabulary = strings.Fields(`archive river mountain ledger harvest winter merchant harbor lantern
	council treaty garden bridge village scholar manuscript orchard festival weaver miller
	tower forest meadow castle pilgrim market beacon shepherd valley quarry chapel fountain
	granary library mason voyage compass anchor timber furnace bell clock mirror candle
	thread needle loom wheel barrel saddle bridle plough sickle anvil hammer chisel ink
	quill parchment seal charter decree census tithe toll ferry canal lock dam mill well
	cistern aqueduct road milestone inn tavern stable forge kiln pottery glass silver copper
	tin salt wool linen silk spice pepper saffron honey wax grain barley oats rye wine ale`)

// Seed ranges of confWords for the texts of each kind, so that no two
// texts of the scenario are drawn alike.
const (
	seedSystem   = 1_000_000
	seedQuestion = 2_000_000
	seedProbe    = 3_000_000
)

// confWords is n words from the vocabulary in sentences of eight, drawn
// by a generator seeded with seed: distinct texts for distinct seeds.
func confWords(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var b strings.Builder
	for i := range n {
		b.WriteByte(' ')
		b.WriteString(confVocabulary[rng.IntN(len(confVocabulary))])
		if i%8 == 7 {
			b.WriteByte('.')
		}
	}
	return b.String()
}

// llmdsimEngines lists the engines for the llm app, each with kv_events
// bind: llm-d-inference-sim's PUB connects to the gateway.
func llmdsimEngines(es []*llmdsim.Engine) []gatewayEngine {
	out := make([]gatewayEngine, len(es))
	for i, e := range es {
		out[i] = gatewayEngine{dial: e.Addr(), kv: e.KVEvents()}
	}
	return out
}

// warmGroups sends each group's i-th request straight to its engine.
func warmGroups(t *testing.T, ctx context.Context, engines []*llmdsim.Engine, groups []confGroup, i int) {
	t.Helper()
	for _, g := range groups {
		if _, err := engines[g.engine].Chat(ctx, g.messages(i)); err != nil {
			t.Fatalf("warming group %d on %s: %v", g.id, engines[g.engine].Addr(), err)
		}
	}
}

// waitLLMDSimEvents waits until every engine's events reach the gateway
// and returns each engine's stored-event count then. The engine connects
// to the gateway's bound socket (redialling once a second), and a PUB
// drops what it sends before our subscription reaches it, so a connected
// session is not enough: each engine gets probe requests, every one a
// prefix of its own, until the gateway has counted one's event.
func waitLLMDSimEvents(t *testing.T, engines []*llmdsim.Engine) map[string]uint64 {
	t.Helper()
	stored := map[string]uint64{}
	for i, e := range engines {
		testwait.For(t, 15*time.Second, "the KV session from "+e.Addr(), func() bool {
			r := getEngineReport(t, e.Addr())
			return r.KV != nil && r.KV.Connected
		})
		base := getEngineReport(t, e.Addr()).KV.Stored
		for probe := 0; ; probe++ {
			if probe == 50 {
				t.Fatalf("no KV event from %s reached the gateway after %d probes: %s", e.Addr(), probe, llmdsimKVStates(t))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := e.Chat(ctx, []llmdsim.Message{{Role: "user", Content: fmt.Sprintf("probe %d of engine %d:%s", probe, i, confWords(seedProbe+uint64(1000*i+probe), 40))}})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			counted := func() bool { return getEngineReport(t, e.Addr()).KV.Stored > base }
			for deadline := time.Now().Add(300 * time.Millisecond); !counted() && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if counted() {
				break
			}
		}
		// Late probes' events may still be on their way; the callers
		// wait for at least their own on top of this.
		stored[e.Addr()] = getEngineReport(t, e.Addr()).KV.Stored
	}
	return stored
}

// waitStored waits until the gateway has counted one more BlockStored
// event per group warmed on each engine than stored says it had.
func waitStored(t *testing.T, engines []*llmdsim.Engine, stored map[string]uint64, groups []confGroup, what string) {
	t.Helper()
	want := map[string]uint64{}
	for _, g := range groups {
		want[engines[g.engine].Addr()]++
	}
	for _, e := range engines {
		dial := e.Addr()
		testwait.For(t, 15*time.Second, fmt.Sprintf("%s on %s (%d events)", what, dial, want[dial]), func() bool {
			return getEngineReport(t, dial).KV.Stored >= stored[dial]+want[dial]
		})
	}
}

// confResult is where one group's first request through the gateway went.
type confResult struct {
	group          int
	warmed, served string
	tier           string
	cached         int
	explain        string
}

// confTable lists the groups' results for a failure message.
func confTable(rs []confResult) string {
	var b strings.Builder
	for _, r := range rs {
		mark := "MISS"
		if r.served == r.warmed {
			mark = "hit "
		}
		fmt.Fprintf(&b, "  %s group %d: warmed %s, served %s (tier %s, engine cached_tokens %d); explain before: %s\n",
			mark, r.group, r.warmed, r.served, r.tier, r.cached, r.explain)
	}
	return b.String()
}

// explainSummary is /llm/explain's decision for body in one line: the
// pick, the tier and each candidate's matched blocks.
func explainSummary(t *testing.T, body string) string {
	t.Helper()
	var ex explainReply
	if code := adminJSON(t, http.MethodPost, "/llm/explain", body, &ex); code != http.StatusOK {
		return fmt.Sprintf("explain answered %d", code)
	}
	var b strings.Builder
	pick := "none"
	if ex.Pick != nil {
		pick = *ex.Pick
	}
	fmt.Fprintf(&b, "pick %s tier %s tokens %d; matched", pick, ex.Tier, ex.Tokens)
	for _, c := range ex.Candidates {
		fmt.Fprintf(&b, " %s=%d", c.Dial, c.MatchedBlocks)
	}
	return b.String()
}

// llmdsimKVStates is every engine's KV mirror as /llm/engines shows it,
// for failure messages. It decodes the JSON itself, so that it shows the
// counters this gateway version has (orphan_events, recognized_blocks)
// without the test depending on them.
func llmdsimKVStates(t *testing.T) string {
	t.Helper()
	var all []struct {
		Dial string         `json:"dial"`
		KV   map[string]any `json:"kv"`
	}
	if code := adminJSON(t, http.MethodGet, "/llm/engines", "", &all); code != http.StatusOK {
		return fmt.Sprintf("/llm/engines answered %d", code)
	}
	var b strings.Builder
	for _, e := range all {
		fmt.Fprintf(&b, "\n  %s:", e.Dial)
		for _, k := range []string{"connected", "trusted", "blocks", "stored_events", "unapplied_events", "orphan_events", "orphan_blocks", "recognized_blocks", "hash_verification", "resyncs"} {
			if v, ok := e.KV[k]; ok {
				j, _ := json.Marshal(v)
				fmt.Fprintf(&b, " %s=%s", k, j)
			}
		}
	}
	return b.String()
}
