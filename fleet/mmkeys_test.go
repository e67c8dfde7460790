package fleet

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
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
	return mmFleetOf(t, imageToken, vllmsim.Config{})
}

// mmFleetOf is mmFleet with engines configured as sim, but for the
// settings mmFleet sets.
func mmFleetOf(t *testing.T, imageToken bool, sim vllmsim.Config) (*Fleet, []*vllmsim.Engine, []string) {
	t.Helper()
	sim.TimeScale, sim.ImageTokens = 10000, 64
	var engines []*vllmsim.Engine
	for range 2 {
		sim.KVEvents = &vllmsim.KVEventsConfig{Endpoint: "tcp://*:0"}
		e, err := vllmsim.Start(context.Background(), sim)
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

// mmFixture is a fleet of mmFleetOf's engines, with the dial of each.
type mmFixture struct {
	f       *Fleet
	engines []*vllmsim.Engine
	dials   []string
}

// serve sends body to engine i and waits until the fleet mirrors its
// blocks. It returns the parsed request, the prompt's full blocks and the
// block its image starts in.
func (fx mmFixture) serve(t *testing.T, i int, body string) (req *openai.Request, whole, before int) {
	t.Helper()
	ctx, f, dials := context.Background(), fx.f, fx.dials
	simPost(t, ctx, fx.engines[i].URL()+"/v1/chat/completions", body)
	req, err := openai.ParseRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	tokens, tr := f.tokenize(ctx, req, f.view(dials, f.PolicySettings("default")))
	if tr.Err != nil {
		t.Fatal(tr.Err)
	}
	whole, before = len(tokens)/16, slices.Index(tokens, simImagePad)/16
	testwait.For(t, time.Minute, fmt.Sprintf("engine %d's blocks mirrored", i), func() bool {
		return f.index.Mirror(dials[i]).Stats().Blocks >= whole
	})
	return req, whole, before
}

// TestImagePromptMatchesPastImage: an image prompt served by engine 0 (its
// blocks hashed with the image's uuid, as vLLM does) is matched by the
// fleet past the image when repeated with the same uuid, and only up to
// the image with another uuid, without a uuid (its identifier is then the
// hash of its bytes, not the uuid), or when the model's image token is not
// configured; explain says which.
func TestImagePromptMatchesPastImage(t *testing.T) {
	for _, configured := range []bool{true, false} {
		f, engines, dials := mmFleet(t, configured)
		ctx, s := context.Background(), f.PolicySettings("default")
		_, whole, before := mmFixture{f, engines, dials}.serve(t, 0, imageChatBody(t, "data:image/png;base64,AAAA", "img-A"))
		if before < 2 || whole < before+6 {
			t.Fatalf("prompt of %d blocks, image at block %d", whole, before)
		}
		for _, c := range []struct {
			name, url, uuid string
			want            int
			say             string
		}{
			{"same uuid", "data:image/png;base64,AAAA", "img-A", whole, "keyed: 1 images"},
			{"other uuid", "data:image/png;base64,AAAA", "img-B", before, "keyed: 1 images"},
			{"no uuid", "data:image/png;base64,AAAA", "", before, "keyed: 1 images"},
			{"no uuid, http URL", "https://x/a.png", "", before, "not a base64 data: URL"},
		} {
			if !configured {
				c.want, c.say = before, "no image_token_id"
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

// TestImageWithoutUUIDMatchesPastImage: an image prompt without a uuid,
// its image a base64 data: URL, served by engine 0 (which hashes the
// image's bytes with its model id, as vLLM does) is matched past the image
// when repeated as it is, and only up to the image with other bytes or
// with a uuid.
func TestImageWithoutUUIDMatchesPastImage(t *testing.T) {
	f, engines, dials := mmFleet(t, true)
	ctx := context.Background()
	image := func(seed byte) string {
		b := make([]byte, 3000)
		for i := range b {
			b[i] = byte(i*7) ^ seed
		}
		return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b)
	}
	s := f.PolicySettings("default")
	_, whole, before := mmFixture{f, engines, dials}.serve(t, 0, imageChatBody(t, image(1), ""))
	for _, c := range []struct {
		name, url, uuid string
		want            int
	}{
		{"same bytes", image(1), "", whole},
		{"other bytes", image(2), "", before},
		{"same bytes with a uuid", image(1), "img-A", before},
	} {
		req, err := openai.ParseRequest([]byte(imageChatBody(t, c.url, c.uuid)))
		if err != nil {
			t.Fatal(err)
		}
		d := f.Route(ctx, Query{Request: req, Dials: dials, Settings: s, Explain: true})
		if d.Tokenize.Err != nil || d.Index != 0 || d.Scored[0].Tier != routing.Precise {
			t.Fatalf("%s: decision %+v, %v", c.name, d.Decision, d.Tokenize.Err)
		}
		if got := d.Scored[0].MatchedBlocks; got != c.want || !strings.Contains(d.Multimodal, "keyed: 1 images") {
			t.Errorf("%s: engine 0 matched %d blocks (want %d of %d, image at %d), explain %q",
				c.name, got, c.want, whole, before, d.Multimodal)
		}
	}
}

// TestImageHashModelIsRoot: an image without a uuid is hashed with the
// engine's model path (its /v1/models root), not the name the request
// uses: a repeat under another served name of the model, or under a LoRA
// adapter of it, matches past the image.
func TestImageHashModelIsRoot(t *testing.T) {
	f, engines, dials := mmFleetOf(t, true, vllmsim.Config{Model: "org/vision-7b",
		ModelAliases: []string{"vision"}, LoRAModules: []string{"style"}})
	testwait.For(t, time.Minute, "the engines' model lists", func() bool {
		list, known := f.ListModels("")
		return known && len(list) == 3
	})
	if got := f.imageHashModel("style"); got != "org/vision-7b" {
		t.Fatalf("an adapter's image hash model is %q", got)
	}
	ctx := context.Background()
	s := f.PolicySettings("default")
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("pixels", 500)))
	for i, model := range []string{"vision", "style"} {
		body := strings.Replace(imageChatBody(t, url, ""), `"model":"sim-model"`, `"model":"`+model+`"`, 1)
		req, whole, _ := mmFixture{f, engines, dials}.serve(t, i, body)
		d := f.Route(ctx, Query{Request: req, Dials: dials, Settings: s, Explain: true})
		if d.Tokenize.Err != nil || d.Index != i || d.Scored[i].MatchedBlocks != whole {
			t.Errorf("%s: routed to %d, engine %d matched %d of %d blocks, %v",
				model, d.Index, i, d.Scored[i].MatchedBlocks, whole, d.Tokenize.Err)
		}
	}
}

// TestMMPromptKeys: the placeholder runs become items only when every
// media part is an image with an identifier (its uuid, or the hash of its
// data: URL's bytes) and the runs are as many as the images.
func TestMMPromptKeys(t *testing.T) {
	const pad = 9
	tokens := []uint64{1, 2, pad, pad, pad, 3, 4, pad, pad, 5}
	part := func(member string) string {
		return `{"role":"user","content":[{"type":"text","text":"t"},` + member + `]}`
	}
	img := func(uuid string) string {
		return part(`{"type":"image_url","image_url":{"url":"https://x/a.png"},"uuid":"` + uuid + `"}`)
	}
	data := part(`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}`)
	hash, err := kvindex.ImageBytesID("", "m", kvindex.ImageBytes{Size: 3, R: strings.NewReader("\x00\x00\x00")})
	if err != nil {
		t.Fatal(err)
	}
	prompt := func(token uint64, msgs ...string) mmPrompt {
		p := mmPrompt{parts: openai.MediaParts([]byte("[" + strings.Join(msgs, ",") + "]")),
			imageKeying: imageKeying{imageToken: token, hashModel: "m"}}
		p.identify()
		return p
	}
	for _, c := range []struct {
		name  string
		p     mmPrompt
		items []kvindex.MMItem
		why   string
	}{
		{"text", prompt(pad), nil, ""},
		{"two images", prompt(pad, img("a"), img("b")),
			[]kvindex.MMItem{{ID: "a", Offset: 2, Length: 3}, {ID: "b", Offset: 7, Length: 2}}, ""},
		{"data URL without uuid", prompt(pad, img("a"), data),
			[]kvindex.MMItem{{ID: "a", Offset: 2, Length: 3}, {ID: hash, Offset: 7, Length: 2}}, ""},
		{"more runs", prompt(pad, img("a")), nil, "more image placeholder runs"},
		{"fewer runs", prompt(pad, img("a"), img("b"), img("c")), nil, "2 image placeholder runs for 3"},
		{"http URL without uuid", prompt(pad, img("a"), img("")), nil, "not a base64 data: URL"},
		{"audio", prompt(pad, part(`{"type":"input_audio","input_audio":{"data":"AA"},"uuid":"x"}`)), nil, "audio items"},
		{"no token", prompt(0, img("a"), data), nil, "no image_token_id"},
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

// TestImageHashAlgorithmValidated: a tokenizer entry's image hash
// algorithm must be one vLLM offers.
func TestImageHashAlgorithmValidated(t *testing.T) {
	for alg, ok := range map[string]bool{"": true, "blake3": true, "sha256": true, "sha512": true, "md5": false, "SHA256": false} {
		cfg := testConfig(&EngineConfig{Dial: "127.0.0.1:1"})
		cfg.Tokenizers = []*TokenizerConfig{{Model: "*", Dir: RemoteTokenizer, ImageTokenID: 9, ImageHashAlgorithm: alg}}
		if err := cfg.Validate(); (err == nil) != ok {
			t.Errorf("algorithm %q: %v", alg, err)
		}
	}
}
