package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
	"github.com/llmgw/caddy-llmgw/routing"
)

// uuidImageChat is a chat whose user message has text, an image part with
// uuid and a long question after it.
func uuidImageChat(t *testing.T, uuid string) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 2, "messages": []any{
		map[string]any{"role": "system", "content": longText(80)},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "Look:"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64,iVBORw0KGgo="}, "uuid": uuid},
			map[string]any{"type": "text", "text": longText(120)},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mmExplain is the part of /llm/explain this test reads.
type mmExplain struct {
	Tokens     int                `json:"tokens"`
	BlockSize  int                `json:"block_size"`
	Multimodal string             `json:"multimodal"`
	Candidates []explainCandidate `json:"candidates"`
}

func explainMM(t *testing.T, body string) mmExplain {
	t.Helper()
	var ex mmExplain
	if code := adminJSON(t, http.MethodPost, "/llm/explain", body, &ex); code != http.StatusOK {
		t.Fatalf("explain: %d", code)
	}
	return ex
}

func (ex mmExplain) matched(dial string) int {
	for _, c := range ex.Candidates {
		if c.Dial == dial {
			return c.MatchedBlocks
		}
	}
	return -1
}

// TestImagePromptThroughGateway: through Caddy to simulated vision engines
// that hash images as vLLM does, with the model's image token configured,
// a repeated image prompt with a uuid goes back to the engine that holds
// it on the precise tier, matched past the image; the explain API says it
// was keyed, and that another image matches only up to it; the metric
// counts the routed image prompts as keyed.
func TestImagePromptThroughGateway(t *testing.T) {
	engines := startEngines(t, 2, vllmsim.Config{ImageTokens: 64})
	gateway{engines: kvEngines(engines...), appExtra: "\t\ttokenizer * remote 151655\n", policy: "\t\t\tdebug_headers\n", patient: true}.load(t)
	waitKV(t, engines...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	body := uuidImageChat(t, "img-1")
	keyedBefore := metricValue(t, "llmgw_multimodal_prompts_total", `keys="keyed"`)
	first := send(ctx, "", body, nil)
	if first.err != nil || first.status != http.StatusOK || first.upstream == "" {
		t.Fatalf("first: %d %v %.200s", first.status, first.err, first.body)
	}
	holder := first.upstream
	whole := 0
	testwait.For(t, 20*time.Second, "the image prompt's blocks mirrored past the image", func() bool {
		ex := explainMM(t, body)
		whole = ex.Tokens / ex.BlockSize
		return whole > 0 && ex.matched(holder) == whole
	})
	second := send(ctx, "", body, nil)
	if second.err != nil || second.status != http.StatusOK || second.upstream != holder || second.tier != routing.Precise.String() {
		t.Fatalf("repeat: %d %v, to %s on tier %q, want %s precise", second.status, second.err, second.upstream, second.tier, holder)
	}
	if v := metricValue(t, "llmgw_multimodal_prompts_total", `keys="keyed"`); v != keyedBefore+2 {
		t.Errorf("llmgw_multimodal_prompts_total{keys=keyed} went %v → %v for 2 routed image prompts", keyedBefore, v)
	}
	if ex := explainMM(t, body); !strings.HasPrefix(ex.Multimodal, "keyed") {
		t.Errorf("explain says %q, want keyed", ex.Multimodal)
	}
	other := explainMM(t, uuidImageChat(t, "img-2"))
	if m := other.matched(holder); m <= 0 || m >= whole-4 || !strings.HasPrefix(other.Multimodal, "keyed") {
		t.Errorf("another image: %d of %d blocks matched (%q), want those before the image", m, whole, other.Multimodal)
	}
}
