package openai

import (
	"strings"
	"testing"
)

// BenchmarkMediaParts is MediaParts over a chat with a 6 MiB base64 image
// and over text-only 1 MiB chats, of prose and of code full of '_' (the
// quick test's cost).
func BenchmarkMediaParts(b *testing.B) {
	for _, c := range []struct{ name, messages string }{
		{"image6MiB", `[{"role":"user","content":[{"type":"text","text":"what?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 6<<20) + `"},"uuid":"u"}]}]`},
		{"text1MiB", `[{"role":"user","content":"` + strings.Repeat("word ", 200<<10) + `"}]`},
		{"code1MiB", `[{"role":"user","content":"` + strings.Repeat("if user_id in audio_map: ", 40<<10) + `"}]`},
	} {
		msgs := []byte(c.messages)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(msgs)))
			for b.Loop() {
				if p := MediaParts(msgs); (len(p) == 1) != (c.name == "image6MiB") {
					b.Fatalf("%+v", p)
				}
			}
		})
	}
}
