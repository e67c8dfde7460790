package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/simwords"
)

// The images scenario (issue 38): chat prompts that carry a base64 image,
// a few distinct images asked about again and again, in front of
// simulated vision engines that expand each image into placeholder tokens
// and hash it into the blocks it covers as vLLM does (vllmsim's
// Config.ImageTokens). Precise routing can match such a prompt past its
// image only when the gateway knows the model's image placeholder id
// (`tokenizer * remote <id>`); without it the match stops at the block
// holding the image, as it did before multimodal keys.

// imagePadID is the image placeholder token the simulated vision engines
// render, Qwen2-VL's <|image_pad|>: the id the gateway is configured with.
const imagePadID = 151655

// imageSide is the side in pixels of the generated images: a 32×32 noise
// PNG is about 3 KiB, 4 KiB as a data: URL. The engines' placeholder count
// (ImageTokens), not the bytes, sets what an image costs in the prompt.
const imageSide = 32

// ImageRef is one image part of a turn.
type ImageRef struct {
	// URL is a base64 data: URL of a PNG.
	URL string
	// UUID is the part's uuid, "" for none (the engine and the gateway
	// then hash the image's bytes).
	UUID string
}

// contentPart is an OpenAI chat content part, text or image_url.
type contentPart struct {
	Type     string     `json:"type"`
	Text     string     `json:"text,omitempty"`
	ImageURL *imagePart `json:"image_url,omitempty"`
	UUID     string     `json:"uuid,omitempty"`
}

type imagePart struct {
	URL string `json:"url"`
}

// content is the turn's message content: its text, or with an image the
// image part followed by the text.
func (t Turn) content() any {
	if t.Image == nil {
		return t.User
	}
	return []contentPart{
		{Type: "image_url", ImageURL: &imagePart{URL: t.Image.URL}, UUID: t.Image.UUID},
		{Type: "text", Text: t.User},
	}
}

// noisePNG is a side × side PNG of random pixels drawn from rng, as a
// base64 data: URL: distinct images that no encoder compresses to the
// same bytes.
func noisePNG(rng *rand.Rand, side int) (string, error) {
	img := image.NewNRGBA(image.Rect(0, 0, side, side))
	for y := range side {
		for x := range side {
			img.SetNRGBA(x, y, color.NRGBA{R: uint8(rng.UintN(256)), G: uint8(rng.UintN(256)), B: uint8(rng.UintN(256)), A: 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return "", fmt.Errorf("encoding an image: %w", err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes()), nil
}

// buildImages generates an images workload's sessions (see WorkloadSpec),
// each asking for out tokens, the groups interleaved.
func (w WorkloadSpec) buildImages(rng *rand.Rand, out int) ([]Session, error) {
	if w.PerGroup <= 0 || w.ImageTokens <= 0 {
		return nil, fmt.Errorf("workload %s: per_group and image tokens must be positive", w.Name)
	}
	system := ""
	if w.SystemTokens > 0 {
		system = simwords.Words(rng, "assistant", w.SystemTokens)
	}
	images := make([]ImageRef, w.Groups)
	for g := range images {
		url, err := noisePNG(rng, imageSide)
		if err != nil {
			return nil, fmt.Errorf("workload %s: %w", w.Name, err)
		}
		images[g].URL = url
		if w.UUIDEvery > 0 && g%w.UUIDEvery == 0 {
			images[g].UUID = fmt.Sprintf("image-%d", g)
		}
	}
	var sessions []Session
	for g := range images {
		for i := 0; i < w.PerGroup; i++ {
			sessions = append(sessions, Session{
				Key:    fmt.Sprintf("image-%d", g),
				System: system,
				Turns:  []Turn{{User: simwords.Words(rng, fmt.Sprintf("q%d", i), w.QuestionTokens), MaxTokens: out, Image: &images[g]}},
			})
		}
	}
	rng.Shuffle(len(sessions), func(i, j int) { sessions[i], sessions[j] = sessions[j], sessions[i] })
	return sessions, nil
}

// ImageStats are an images run's figures beyond the summary's.
type ImageStats struct {
	// Blocks counts the completed requests' full prompt blocks from the
	// one holding the first image's first placeholder on — the blocks a
	// match keyed as text cannot reach — and Hit those of them the
	// engine found cached.
	Blocks int `json:"blocks"`
	Hit    int `json:"hit"`
	// UUIDRequests counts the requests whose image carried a uuid.
	UUIDRequests int `json:"uuid_requests"`
	// Keyed and Text are the gateways' llmgw_multimodal_prompts_total:
	// prompts routed with their images in the block keys, and prompts
	// keyed as text (matched up to the first image).
	Keyed float64 `json:"keyed"`
	Text  float64 `json:"text"`
}

// PastShare is Hit ÷ Blocks (0 without any).
func (s *ImageStats) PastShare() float64 {
	if s == nil || s.Blocks == 0 {
		return 0
	}
	return float64(s.Hit) / float64(s.Blocks)
}

// imageOffsets finds, for every distinct system prompt of the sessions'
// image turns, how many tokens come before the first image, from an
// engine's /tokenize (the image is the first part of the user message, so
// what comes before it is the system prompt and the chat template's
// tokens).
func imageOffsets(ctx context.Context, tk engineTokenize, sessions []Session) (map[string]int, error) {
	out := map[string]int{}
	for _, s := range sessions {
		if len(s.Turns) == 0 || s.Turns[0].Image == nil {
			continue
		}
		if _, ok := out[s.System]; ok {
			continue
		}
		msgs := []chatMsg{{Role: "user", Content: s.Turns[0].content()}}
		if s.System != "" {
			msgs = append([]chatMsg{{Role: "system", Content: s.System}}, msgs...)
		}
		toks, err := tk.chat(ctx, msgs)
		if err != nil {
			return nil, err
		}
		i := slices.Index(toks, imagePadID)
		if i < 0 {
			return nil, fmt.Errorf("the engine's /tokenize of an image prompt has no image placeholder %d", imagePadID)
		}
		out[s.System] = i
	}
	return out, nil
}

// engineTokenize is an engine's /tokenize, for model's prompts.
type engineTokenize struct {
	url, model string // the engine's base URL, the served model
	client     *http.Client
}

// chat asks the engine's /tokenize for the prompt tokens of msgs.
func (tk engineTokenize) chat(ctx context.Context, msgs []chatMsg) ([]int, error) {
	engineURL, client := tk.url, tk.client
	body, err := json.Marshal(map[string]any{"model": tk.model, "messages": msgs})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, engineURL+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxLine))
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tokenize: status %d: %.200s", resp.StatusCode, b)
	}
	var tr struct {
		Tokens []int `json:"tokens"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	return tr.Tokens, nil
}

// imageStats counts, over the completed requests of image turns, the
// prompt blocks past the block holding the image's start (offsets: tokens
// before it, by system prompt) and how many of them hit, with blocks of
// blockSize tokens.
func imageStats(recs []Record, sessions []Session, offsets map[string]int, blockSize int) *ImageStats {
	st := &ImageStats{}
	for i := range recs {
		r := &recs[i]
		if r.Session < 0 || r.Session >= len(sessions) {
			continue
		}
		s := &sessions[r.Session]
		if r.Turn >= len(s.Turns) || s.Turns[r.Turn].Image == nil {
			continue
		}
		if s.Turns[r.Turn].Image.UUID != "" {
			st.UUIDRequests++
		}
		off, ok := offsets[s.System]
		if !ok || !r.OK() {
			continue
		}
		first, full := off/blockSize, r.PromptTokens/blockSize
		if full <= first {
			continue
		}
		st.Blocks += full - first
		st.Hit += max(0, min(r.CachedTokens/blockSize, full)-first)
	}
	return st
}

// addMultimodalMetric adds the gateways' llmgw_multimodal_prompts_total
// samples (name{keys="..."} → value) to st.
func (st *ImageStats) addMultimodalMetric(samples map[string]float64) {
	for k, v := range samples {
		switch {
		case strings.Contains(k, `keys="keyed"`):
			st.Keyed += v
		case strings.Contains(k, `keys="text"`):
			st.Text += v
		}
	}
}

// renderImages writes the images scenario's table: per policy the
// client's figures, the share of the blocks past the image that hit, and
// how the gateway keyed the prompts.
func renderImages(b *strings.Builder, q *QualityResult, qw QualityWorkload) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	name := qw.Spec.Name
	var sc ScenarioOptions
	if qw.Scenario != nil {
		sc = *qw.Scenario
	}
	w("### %s\n\n%s\n\n", name, sc.Desc)
	w("| rate | policy | hit rate | blocks past the image hit | TTFT p50 | p90 | p99 | completed | 503 | failed | prompts keyed with their image / as text | sim lag | decisions |\n")
	w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, x := range q.rates(name) {
		for _, pol := range q.Params.Policies {
			r := q.at(name, pol.Name, x)
			if r == nil || r.Images == nil {
				continue
			}
			s, im := r.Summary, r.Images
			w("| %.1f/s (%g×) | `%s` | %.1f%% | %s | %s | %s | %s | %d/%d | %d | %d | %.0f / %.0f | %s | %s |\n",
				r.Rate, x, pol.Name, s.HitRate*100, pastText(im), secs(s.TTFT.P50), secs(s.TTFT.P90), secs(s.TTFT.P99),
				s.OK, s.Requests, s.Rejected, s.Errors+s.Timeouts, im.Keyed, im.Text, lagText(r, q.Params), decisions(r.Decisions))
		}
	}
	w("\n")
	if sc.Why != "" {
		w("Why: %s\n\n", sc.Why)
	}
}

// pastText is "81.2% (1234 of 1520)": the blocks past the image that hit.
func pastText(im *ImageStats) string {
	if im.Blocks == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%% (%d of %d)", im.PastShare()*100, im.Hit, im.Blocks)
}

// imagesGoal is issue 38's figure for an images scenario at rate x: the
// share of blocks past the image that hit under `llm`, and under the
// other policies of the run.
func imagesGoal(q *QualityResult, name string, x float64) string {
	llm := q.at(name, "llm", x)
	if llm == nil || llm.Images == nil {
		return ""
	}
	line := fmt.Sprintf("%s at %.1f req/s (%g× cap₀): blocks past the image hit `llm` %s, TTFT p90 %s", name, llm.Rate, x, pastText(llm.Images), secs(llm.Summary.TTFT.P90))
	for _, pol := range q.Params.Policies {
		if r := q.at(name, pol.Name, x); r != nil && r.Images != nil && pol.Name != "llm" {
			line += fmt.Sprintf("; `%s` %s, TTFT p90 %s", pol.Name, pastText(r.Images), secs(r.Summary.TTFT.P90))
		}
	}
	return line
}
