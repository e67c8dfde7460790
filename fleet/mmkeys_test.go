package fleet

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmgw/caddy-llmgw/internal/sim/vllmsim"
	"github.com/llmgw/caddy-llmgw/internal/testutil/testwait"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/llmgw/caddy-llmgw/openai"
	"github.com/llmgw/caddy-llmgw/routing"
)

// simImagePad is vllmsim's image placeholder id (Qwen2-VL's <|image_pad|>).
const simImagePad = 151655

// imageChatBody is a chat request: a long system prompt, then a user
// message with text, one image part (with uuid unless "") and more text.
func imageChatBody(t testing.TB, url, uuid string) string {
	t.Helper()
	img := map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}
	if uuid != "" {
		img["uuid"] = uuid
	}
	b, err := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1, "messages": []any{
		map[string]any{"role": "system", "content": simWords("sys", 100)},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "Look at this:"},
			img,
			map[string]any{"type": "text", "text": simWords("q", 120)},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mmFleet is two vision engines (64 placeholders an image) and a fleet
// subscribed to their events, told the image token when imageToken.
func mmFleet(t *testing.T, imageToken bool) (*Fleet, []*vllmsim.Engine, []string) {
	t.Helper()
	var engines []*vllmsim.Engine
	for range 2 {
		e, err := vllmsim.Start(context.Background(), vllmsim.Config{TimeScale: 10000, ImageTokens: 64,
			KVEvents: &vllmsim.KVEventsConfig{Endpoint: "tcp://*:0"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		engines = append(engines, e)
	}
	cfg := testConfig()
	cfg.PollInterval, cfg.TokenizeTimeout = time.Second, 10*time.Second
	ttl := time.Hour // predictions outlive the test
	cfg.SpeculativeTTL = &ttl
	tc := &TokenizerConfig{Model: "*", Dir: RemoteTokenizer}
	if imageToken {
		tc.ImageTokenID = simImagePad
	}
	cfg.Tokenizers = []*TokenizerConfig{tc}
	var dials []string
	for _, e := range engines {
		cfg.Engines = append(cfg.Engines, &EngineConfig{Dial: e.Addr(), KVEvents: e.KVEndpoint()})
		dials = append(dials, e.Addr())
	}
	f := New(zap.NewNop(), Options{})
	t.Cleanup(f.Close)
	f.Start(f.NewGeneration(cfg, zap.NewNop()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, e := range engines {
		if err := e.WaitKVSubscribers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, time.Minute, dials[i]+" mirrored and gauged", func() bool {
			m := f.index.Mirror(dials[i])
			return m != nil && m.Connected() && f.registry.Ensure(dials[i]).Load().Known
		})
	}
	return f, engines, dials
}

// TestImagePromptMatchesPastImage: an image prompt served by engine 0 (its
// blocks hashed with the image's uuid, as vLLM does) is matched by the
// fleet past the image when repeated with the same uuid, and only up to
// the image with another uuid, without a uuid, or when the model's image
// token is not configured; explain says which.
func TestImagePromptMatchesPastImage(t *testing.T) {
	for _, configured := range []bool{true, false} {
		f, engines, dials := mmFleet(t, configured)
		ctx := context.Background()
		body := imageChatBody(t, "data:image/png;base64,AAAA", "img-A")
		simPost(t, ctx, engines[0].URL()+"/v1/chat/completions", body)
		req, err := openai.ParseRequest([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		s := f.PolicySettings("default")
		tokens, tr := f.tokenize(ctx, req, f.view(dials, s))
		if tr.Err != nil {
			t.Fatal(tr.Err)
		}
		whole, before := len(tokens)/16, slices.Index(tokens, simImagePad)/16
		if before < 2 || whole < before+6 {
			t.Fatalf("prompt of %d tokens, image at block %d", len(tokens), before)
		}
		testwait.For(t, time.Minute, "engine 0's blocks mirrored", func() bool {
			return f.index.Mirror(dials[0]).Stats().Blocks >= whole
		})
		for _, c := range []struct {
			name, url, uuid string
			want            int
			say             string
		}{
			{"same uuid", "data:image/png;base64,AAAA", "img-A", whole, "keyed: 1 images"},
			{"other uuid", "data:image/png;base64,AAAA", "img-B", before, "keyed: 1 images"},
			{"no uuid", "data:image/png;base64,AAAA", "", before, "without a uuid"},
		} {
			if !configured {
				c.want, c.say = before, "no image_token_id"
				if c.uuid == "" {
					c.say = "without a uuid"
				}
			}
			req, err := openai.ParseRequest([]byte(imageChatBody(t, c.url, c.uuid)))
			if err != nil {
				t.Fatal(err)
			}
			d := f.Route(ctx, Query{Request: req, Dials: dials, Settings: s, Explain: true})
			if d.Tokenize.Err != nil || d.Index != 0 || d.Scored[0].Tier != routing.Precise {
				t.Fatalf("configured %v, %s: decision %+v, %v", configured, c.name, d.Decision, d.Tokenize.Err)
			}
			if got := d.Scored[0].MatchedBlocks; got != c.want || d.Scored[1].MatchedBlocks != 0 {
				t.Errorf("configured %v, %s: engine 0 matched %d blocks (want %d of %d, image at %d), engine 1 %d",
					configured, c.name, got, c.want, whole, before, d.Scored[1].MatchedBlocks)
			}
			if !strings.Contains(d.Multimodal, c.say) {
				t.Errorf("configured %v, %s: explain says %q, want %q", configured, c.name, d.Multimodal, c.say)
			}
		}
	}
}

// TestMMPromptKeys: the placeholder runs become items only when every
// media part is an image with a uuid and the runs are as many as the
// images.
func TestMMPromptKeys(t *testing.T) {
	const pad = 9
	tokens := []uint64{1, 2, pad, pad, pad, 3, 4, pad, pad, 5}
	img := func(uuid string) openai.MediaPart { return openai.MediaPart{Modality: "image", UUID: uuid} }
	for _, c := range []struct {
		name  string
		p     mmPrompt
		items []kvindex.MMItem
		why   string
	}{
		{"text", mmPrompt{imageToken: pad}, nil, ""},
		{"two images", mmPrompt{parts: []openai.MediaPart{img("a"), img("b")}, imageToken: pad},
			[]kvindex.MMItem{{ID: "a", Offset: 2, Length: 3}, {ID: "b", Offset: 7, Length: 2}}, ""},
		{"more runs", mmPrompt{parts: []openai.MediaPart{img("a")}, imageToken: pad}, nil, "more image placeholder runs"},
		{"fewer runs", mmPrompt{parts: []openai.MediaPart{img("a"), img("b"), img("c")}, imageToken: pad}, nil, "2 image placeholder runs for 3"},
		{"no uuid", mmPrompt{parts: []openai.MediaPart{img("a"), img("")}, imageToken: pad}, nil, "without a uuid"},
		{"audio", mmPrompt{parts: []openai.MediaPart{{Modality: "audio", UUID: "x"}}, imageToken: pad}, nil, "audio items"},
		{"no token", mmPrompt{parts: []openai.MediaPart{img("a"), img("b")}}, nil, "no image_token_id"},
	} {
		m := c.p.keys(tokens)
		if !slices.Equal(m.items, c.items) || !strings.Contains(m.reason, c.why) || (c.why == "") != (m.reason == "") {
			t.Errorf("%s: items %v reason %q", c.name, m.items, m.reason)
		}
		if m.media != (len(c.p.parts) > 0) || m.keyed() != (c.items != nil) {
			t.Errorf("%s: media %v keyed %v", c.name, m.media, m.keyed())
		}
	}
}

// TestImagePromptPredictions: a keyed image prompt routed to an engine is
// predicted there past its image (a repeat matches it whole, another
// image only up to it); an unkeyed one predicts nothing, as its keys past
// the image would be every image's.
func TestImagePromptPredictions(t *testing.T) {
	f, _, dials := mmFleet(t, true)
	ctx := context.Background()
	s := f.PolicySettings("default")
	route := func(url, uuid string) *Pick {
		t.Helper()
		req, err := openai.ParseRequest([]byte(imageChatBody(t, url, uuid)))
		if err != nil {
			t.Fatal(err)
		}
		d := f.Route(ctx, Query{Request: req, Dials: dials, Settings: s, Explain: true})
		if d.Tokenize.Err != nil || len(d.Scored) != 2 {
			t.Fatalf("decision %+v, %v", d.Decision, d.Tokenize.Err)
		}
		return d
	}
	commit := func(url, uuid string) {
		t.Helper()
		req, err := openai.ParseRequest([]byte(imageChatBody(t, url, uuid)))
		if err != nil {
			t.Fatal(err)
		}
		p := f.Route(ctx, Query{Request: req, Dials: dials, Settings: s})
		p.Commit(dials[1]).Outcome(nil, 200)
	}
	d := route("https://x/a.png", "")
	whole := d.Tokens / 16
	commit("https://x/a.png", "")
	if d := route("https://x/b.png", ""); d.Scored[1].MatchedBlocks != 0 {
		t.Fatalf("an unkeyed image prompt was predicted: %d blocks match another image's", d.Scored[1].MatchedBlocks)
	}
	commit("https://x/a.png", "img-C")
	if d := route("https://x/a.png", "img-C"); d.Scored[1].SpeculativeBlocks != whole {
		t.Errorf("a keyed repeat matches %d predicted blocks, want %d", d.Scored[1].SpeculativeBlocks, whole)
	}
	if before := route("https://x/a.png", "img-D").Scored[1].SpeculativeBlocks; before == 0 || before >= whole-4 {
		t.Errorf("another image matches %d predicted blocks of %d, want those before the image", before, whole)
	}
}
