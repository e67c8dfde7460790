package openai

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
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
			[]MediaPart{{Modality: "image", UUID: "u-1", url: rawURL("data:,a")}}},
		{"order and kinds", `[{"role":"system","content":"s"},{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA"}},{"type":"image_url","image_url":{"url":"https://x/a.png"},"uuid":null}]},{"role":"user","content":[{"type":"video_url","video_url":{"url":"v"}}]}]`,
			[]MediaPart{{Modality: "audio"}, {Modality: "image", url: rawURL("https://x/a.png")}, {Modality: "video"}}},
		{"bare member with uuid", `[{"role":"user","content":[{"image_url":{"url":"u"},"uuid":"abc"}]}]`,
			[]MediaPart{{Modality: "image", UUID: "abc", url: rawURL("u")}}},
		{"embeds", `[{"role":"user","content":[{"type":"image_embeds","image_embeds":"AAAA"}]}]`,
			[]MediaPart{{Modality: "embeds"}}},
		{"not a list", `{"image_url":1}`, nil},
		{"code only", `[{"role":"user","content":"` + strings.Repeat("x_y = a_b; ", 100) + `"}]`, nil},
		{"code, then an image", `[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("x_y = a_b; ", 100) + `"},{"type":"input_image","image_url":"u","uuid":"z"}]}]`,
			[]MediaPart{{Modality: "image", UUID: "z", url: rawURL("u")}}},
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
	if got := MediaParts(req.Messages); !reflect.DeepEqual(got, []MediaPart{{Modality: "image", url: rawURL("data:image/png;base64,iVBORw0KGgo=")}}) {
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
	if got := MediaParts(req.Messages); !reflect.DeepEqual(got, []MediaPart{{Modality: "image", UUID: "photo-7", url: rawURL("data:image/png;base64,AAAA")}}) {
		t.Fatalf("%+v from %s", got, req.Messages)
	}
}

// rawURL is url as MediaParts keeps it: the raw JSON string.
func rawURL(url string) json.RawMessage { return json.RawMessage(`"` + url + `"`) }

// TestDataURLImage: a part's base64 data: URL yields the bytes vLLM
// decodes (checked on the images of kvindex's vLLM vectors, and through a
// JSON escape), anything vLLM would not decode as one yields nothing.
func TestDataURLImage(t *testing.T) {
	raw, err := os.ReadFile("../kvindex/testdata/mm_image_hash.json")
	if err != nil {
		t.Fatal(err)
	}
	var vec struct{ Cases []struct{ URL string } }
	if err := json.Unmarshal(raw, &vec); err != nil {
		t.Fatal(err)
	}
	for _, c := range vec.Cases {
		_, b64, _ := strings.Cut(c.URL, ",")
		want, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatal(err)
		}
		escaped, _ := json.Marshal(c.URL) // no escapes: base64 has none
		escaped = bytes.ReplaceAll(escaped, []byte("/"), []byte(`\/`))
		for _, u := range []json.RawMessage{rawURL(c.URL), escaped} {
			size, r, ok := MediaPart{Modality: "image", url: u}.DataURLImage()
			if !ok {
				t.Fatalf("%.40s: not a data URL", u)
			}
			got, err := io.ReadAll(r)
			if err != nil || size != int64(len(want)) || !bytes.Equal(got, want) {
				t.Fatalf("%.40s: %d bytes announced, %d read (%v), want %d", u, size, len(got), err, len(want))
			}
		}
	}
	for _, u := range []string{
		"https://x/a.png", "data:image/png,AAAA", "data:image/png;charset=x;base64,AAAA",
		"data:image/png;base64,AAA", "data:image/png;base64,AA=A", "data:image/png;base64,AA\tA",
		"data:image/png;base64,AA-_", "data:image/png;base64", "", "data:",
	} {
		if _, _, ok := (MediaPart{Modality: "image", url: rawURL(u)}).DataURLImage(); ok {
			t.Errorf("%q taken for a base64 data URL", u)
		}
	}
	if size, _, ok := (MediaPart{Modality: "image", url: rawURL("DATA:image/png;base64,AAA=")}).DataURLImage(); !ok || size != 2 {
		t.Errorf("an upper-case scheme with padding: size %d ok %v, want 2 true", size, ok)
	}
	if _, _, ok := (MediaPart{Modality: "image"}).DataURLImage(); ok {
		t.Error("a part without a URL has bytes")
	}
}
