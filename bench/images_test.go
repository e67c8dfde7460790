package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestImagesWorkload: an images workload sends each group's image with
// every one of its requests, every UUIDEvery-th image with a uuid, one
// system prompt for all; the images are distinct PNG data: URLs and the
// same spec builds the same bodies.
func TestImagesWorkload(t *testing.T) {
	w := WorkloadSpec{Name: "im", Kind: "images", Groups: 4, PerGroup: 3, SystemTokens: 8, ImageTokens: 64, QuestionTokens: 4, OutputTokens: 4, UUIDEvery: 2, Seed: 3}
	sessions, err := w.Build(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != w.Requests() {
		t.Fatalf("%d sessions, want %d", len(sessions), w.Requests())
	}
	byKey := map[string]*ImageRef{}
	perKey := map[string]int{}
	for _, s := range sessions {
		im := s.Turns[0].Image
		if im == nil || !strings.HasPrefix(im.URL, "data:image/png;base64,") {
			t.Fatalf("session %s: image %+v", s.Key, im)
		}
		if s.System != sessions[0].System || s.System == "" {
			t.Errorf("session %s has a system prompt of its own", s.Key)
		}
		if prev := byKey[s.Key]; prev != nil && prev != im {
			t.Errorf("group %s sends two images", s.Key)
		}
		byKey[s.Key] = im
		perKey[s.Key]++
	}
	urls := map[string]bool{}
	uuids := 0
	for k, im := range byKey {
		urls[im.URL] = true
		if im.UUID != "" {
			uuids++
		}
		if perKey[k] != 3 {
			t.Errorf("group %s: %d requests, want 3", k, perKey[k])
		}
	}
	if len(urls) != 4 || uuids != 2 {
		t.Errorf("%d distinct images, %d with a uuid; want 4 and 2", len(urls), uuids)
	}
	again, _ := w.Build(1)
	a, _ := json.Marshal(sessions)
	b, _ := json.Marshal(again)
	if string(a) != string(b) {
		t.Error("the same spec built different sessions")
	}
	if got, want := w.PromptTokens(), 8+64+4; got != want {
		t.Errorf("prompt tokens %d, want %d", got, want)
	}
	if got := w.SharedTokens(); got != 72 {
		t.Errorf("shared tokens %d, want 72", got)
	}
	w.ImageTokens = 0
	if _, err := w.Build(1); err == nil {
		t.Error("an images workload without image tokens built")
	}
}

// TestTurnContent: a turn with an image is sent as an image_url part
// (with its uuid when it has one) followed by the text, as the OpenAI
// API and vLLM read it; a turn without one as a plain string.
func TestTurnContent(t *testing.T) {
	for _, tc := range []struct {
		turn Turn
		want string
	}{
		{Turn{User: "hi"}, `"hi"`},
		{Turn{User: "what is it", Image: &ImageRef{URL: "data:image/png;base64,AA=="}},
			`[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}},{"type":"text","text":"what is it"}]`},
		{Turn{User: "and this", Image: &ImageRef{URL: "data:x", UUID: "u1"}},
			`[{"type":"image_url","image_url":{"url":"data:x"},"uuid":"u1"},{"type":"text","text":"and this"}]`},
	} {
		b, err := json.Marshal(tc.turn.content())
		if err != nil || string(b) != tc.want {
			t.Errorf("content = %s (%v), want %s", b, err, tc.want)
		}
	}
}

// TestImageStats counts the blocks from the one holding the image's start
// to the prompt's last full block, and of them those cached; failed
// requests count only for the uuid tally.
func TestImageStats(t *testing.T) {
	withUUID, without := &ImageRef{URL: "a", UUID: "u"}, &ImageRef{URL: "b"}
	sessions := []Session{
		{System: "s1", Turns: []Turn{{Image: withUUID}}},
		{System: "s1", Turns: []Turn{{Image: without}}},
		{System: "s2", Turns: []Turn{{Image: without}}},
		{System: "s1", Turns: []Turn{{User: "no image"}}},
	}
	offsets := map[string]int{"s1": 20, "s2": 40}
	recs := []Record{
		{Session: 0, Status: 200, PromptTokens: 100, CachedTokens: 96}, // blocks 1..5 of 6: 5 past, 5 hit
		{Session: 1, Status: 200, PromptTokens: 100, CachedTokens: 16}, // 5 past, 0 hit
		{Session: 2, Status: 200, PromptTokens: 100, CachedTokens: 64}, // blocks 2..5: 4 past, 2 hit
		{Session: 0, Status: 503, Err: "status 503"},
		{Session: 3, Status: 200, PromptTokens: 100, CachedTokens: 96},
	}
	st := imageStats(recs, sessions, offsets, 16)
	if st.Blocks != 14 || st.Hit != 7 || st.UUIDRequests != 2 {
		t.Errorf("stats = %+v, want 14 blocks, 7 hit, 2 uuid requests", st)
	}
	if st.PastShare() != 0.5 || (&ImageStats{}).PastShare() != 0 {
		t.Errorf("past share = %v", st.PastShare())
	}
	st.addMultimodalMetric(map[string]float64{`llmgw_multimodal_prompts_total{keys="keyed"}`: 5, `llmgw_multimodal_prompts_total{keys="text"}`: 2})
	st.addMultimodalMetric(map[string]float64{`llmgw_multimodal_prompts_total{keys="keyed"}`: 1})
	if st.Keyed != 6 || st.Text != 2 {
		t.Errorf("keyed %v, text %v; want 6 and 2", st.Keyed, st.Text)
	}
}

// TestRenderImages renders the scenario's table and its goal line.
func TestRenderImages(t *testing.T) {
	run := func(pol string, hit int) QualityRun {
		return QualityRun{Workload: "im", Policy: pol, RateX: 1, Rate: 9.5,
			Summary: Summary{Requests: 10, OK: 10, HitRate: 0.5, TTFT: Pcts{P50: 0.4, P90: 2, P99: 3}},
			Images:  &ImageStats{Blocks: 200, Hit: hit, Keyed: 10}}
	}
	q := &QualityResult{
		Params:    QualityParams{Policies: []PolicySpec{{Name: "llm"}, {Name: "round_robin"}}, LagThreshold: 1.12},
		Workloads: []QualityWorkload{{Spec: WorkloadSpec{Name: "im", Kind: "images"}, Scenario: &ScenarioOptions{Desc: "desc", Why: "why"}}},
		Runs:      []QualityRun{run("llm", 150), run("round_robin", 30)},
	}
	var b strings.Builder
	renderScenario(&b, q, q.Workloads[0])
	for _, want := range []string{
		"### im\n\ndesc\n\n",
		"| 9.5/s (1×) | `llm` | 50.0% | 75.0% (150 of 200) | 0.40 s | 2.00 s | 3.00 s | 10/10 | 0 | 0 | 10 / 0 | – |  |\n",
		"| 9.5/s (1×) | `round_robin` | 50.0% | 15.0% (30 of 200) |",
		"Why: why\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
	goals := scenarioGoals(q)
	want := "im at 9.5 req/s (1× cap₀): blocks past the image hit `llm` 75.0% (150 of 200), TTFT p90 2.00 s; `round_robin` 15.0% (30 of 200), TTFT p90 2.00 s"
	if len(goals) != 1 || goals[0] != want {
		t.Errorf("goals = %q, want [%q]", goals, want)
	}
}
