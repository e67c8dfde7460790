package chattemplate

import (
	"encoding/json"
	"testing"
)

// benchDecodeDoc is the JSON a request carries for the template: the
// messages and tools of benchConversation (the first turns only when
// small), as the gateway hands them to DecodeJSONArena.
func benchDecodeDoc(b *testing.B, small bool) []byte {
	msgs, tools := benchConversation()
	if small {
		msgs = msgs[:9]
	}
	doc, err := json.Marshal(map[string]any{"messages": msgs, "tools": tools})
	if err != nil {
		b.Fatal(err)
	}
	return doc
}

// BenchmarkDecodeMessages times DecodeJSONArena, the chat request path's
// decoder, on a few-KB chat and on the ~32 KB one, reusing the arena as
// the gateway does.
func BenchmarkDecodeMessages(b *testing.B) {
	for _, c := range []struct {
		name  string
		small bool
	}{{"small", true}, {"32KB", false}} {
		b.Run(c.name, func(b *testing.B) {
			doc := benchDecodeDoc(b, c.small)
			var arena []byte
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			for b.Loop() {
				arena = arena[:0]
				if _, err := DecodeJSONArena(doc, &arena); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
