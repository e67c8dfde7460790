package tokenizer

import (
	"slices"
	"testing"
)

// TestRealTokenizers checks the real tokenizers against ids produced by the
// JS reference, @huggingface/tokenizers 0.2.0, in real_ids_test.go. It runs
// when LLMGW_TOKENIZER_FILES names a directory holding
// <name>/tokenizer.json for qwen3, llama3_1, deepseek_v3, gptoss, gemma3
// and llama2; the big conformance suite lives in internal/testutil/tokconformance.
func TestRealTokenizers(t *testing.T) {
	for _, name := range realNames {
		t.Run(name, func(t *testing.T) {
			tk := loadReal(t, name)
			for i, text := range realTexts {
				if got := tk.Encode(text, false); !slices.Equal(got, realIDs[name][i]) {
					t.Errorf("Encode(%q) = %v,\nwant %v", text, got, realIDs[name][i])
				}
			}
			if got := tk.Encode(realTexts[0], true); !slices.Equal(got, realSpecialIDs[name]) {
				t.Errorf("Encode(%q, true) = %v, want %v", realTexts[0], got, realSpecialIDs[name])
			}
		})
	}
}

// TestRealRoundTrip checks that the byte-level real tokenizers decode what
// they encode back to the same text, as normalized (Qwen's NFC).
func TestRealRoundTrip(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3_1", "deepseek_v3", "gptoss"} {
		t.Run(name, func(t *testing.T) {
			tk := loadReal(t, name)
			for _, text := range realTexts {
				want := text
				if tk.normalizer != nil {
					want = tk.normalizer.normalize(text)
				}
				if got := tk.Decode(tk.Encode(text, false), false); got != want {
					t.Errorf("Decode(Encode(%q)) = %q, want %q", text, got, want)
				}
			}
		})
	}
}
