package openai

import (
	"reflect"
	"strings"
	"testing"
)

func TestMediaParts(t *testing.T) {
	for _, c := range []struct {
		name, messages string
		want           []MediaPart
	}{
		{"text only", `[{"role":"user","content":"an image_url in text"},{"role":"user","content":[{"type":"text","text":"hi"}]}]`, nil},
		{"image with uuid", `[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"data:,a"},"uuid":"u-1"}]}]`,
			[]MediaPart{{Modality: "image", UUID: "u-1"}}},
		{"order and kinds", `[{"role":"system","content":"s"},{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA"}},{"type":"image_url","image_url":{"url":"https://x/a.png"},"uuid":null}]},{"role":"user","content":[{"type":"video_url","video_url":{"url":"v"}}]}]`,
			[]MediaPart{{Modality: "audio"}, {Modality: "image"}, {Modality: "video"}}},
		{"bare member with uuid", `[{"role":"user","content":[{"image_url":{"url":"u"},"uuid":"abc"}]}]`,
			[]MediaPart{{Modality: "image", UUID: "abc"}}},
		{"embeds", `[{"role":"user","content":[{"type":"image_embeds","image_embeds":"AAAA"}]}]`,
			[]MediaPart{{Modality: "embeds"}}},
		{"not a list", `{"image_url":1}`, nil},
		{"code only", `[{"role":"user","content":"` + strings.Repeat("x_y = a_b; ", 100) + `"}]`, nil},
		{"code, then an image", `[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("x_y = a_b; ", 100) + `"},{"type":"input_image","image_url":"u","uuid":"z"}]}]`,
			[]MediaPart{{Modality: "image", UUID: "z"}}},
	} {
		if got := MediaParts([]byte(c.messages)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestMediaPartsOfConvertedMessages: the Anthropic parser's image blocks
// reach MediaParts as image parts (without a uuid: Anthropic has none).
func TestMediaPartsOfConvertedMessages(t *testing.T) {
	body := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"what is this?"}]}]}`
	req, err := ParseAnthropic([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if got := MediaParts(req.Messages); !reflect.DeepEqual(got, []MediaPart{{Modality: "image"}}) {
		t.Fatalf("%+v from %s", got, req.Messages)
	}
}

// TestMediaPartsOfResponsesInput: a Responses input message reaches the
// chat messages unchanged, its input_image part with its uuid.
func TestMediaPartsOfResponsesInput(t *testing.T) {
	body := `{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"what is this?"},{"type":"input_image","image_url":"data:image/png;base64,AAAA","uuid":"photo-7"}]}]}`
	req, err := ParseResponses([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if got := MediaParts(req.Messages); !reflect.DeepEqual(got, []MediaPart{{Modality: "image", UUID: "photo-7"}}) {
		t.Fatalf("%+v from %s", got, req.Messages)
	}
}
