package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// realFilesDir returns the directory named by LLMGW_TOKENIZER_FILES, which
// holds <name>/tokenizer.json for real models, or skips the test.
func realFilesDir(tb testing.TB) string {
	dir := os.Getenv("LLMGW_TOKENIZER_FILES")
	if dir == "" {
		tb.Skip("LLMGW_TOKENIZER_FILES is not set")
	}
	return dir
}

// loadReal loads a real tokenizer, skipping when it is not present.
func loadReal(tb testing.TB, name string) *Tokenizer {
	path := filepath.Join(realFilesDir(tb), name, "tokenizer.json")
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("no %s", path)
	}
	tk, err := LoadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return tk
}

// benchPrompt returns the ~8k-token chat prompt of testdata, repeated
// copies times with a distinct header each so that the text is not one
// block repeated verbatim.
func benchPrompt(tb testing.TB, copies int) string {
	b, err := os.ReadFile("testdata/prompt_8k.txt")
	if err != nil {
		tb.Fatal(err)
	}
	var sb strings.Builder
	for i := range copies {
		fmt.Fprintf(&sb, "\n\n## Part %d of %d\n\n", i+1, copies)
		sb.Write(b)
	}
	return sb.String()
}

var realNames = []string{"qwen3", "llama3_1", "deepseek_v3", "gptoss", "gemma3", "llama2"}

// BenchmarkEncode encodes the 8k-token and 128k-token prompts with each real
// tokenizer. The word cache is warm after the first iteration, as it is in
// a running gateway.
func BenchmarkEncode(b *testing.B) {
	for _, size := range []struct {
		name   string
		copies int
	}{{"8k", 1}, {"128k", 16}} {
		text := benchPrompt(b, size.copies)
		for _, name := range realNames {
			b.Run(name+"/"+size.name, func(b *testing.B) {
				tk := withoutSections(loadReal(b, name)) // the encoding, not the section cache
				dst := tk.Encode(text, true)
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					dst = tk.AppendEncode(dst[:0], text, true)
				}
				b.ReportMetric(float64(len(dst)), "tokens")
			})
		}
	}
}

// BenchmarkEncodeCold is BenchmarkEncode with an empty word cache each
// time: the cost of a prompt full of words never seen before.
func BenchmarkEncodeCold(b *testing.B) {
	text := benchPrompt(b, 1)
	for _, name := range realNames {
		b.Run(name, func(b *testing.B) {
			tk := withoutSections(loadReal(b, name))
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.model.cache = newWordCache()
				tk.Encode(text, true)
			}
		})
	}
}

// BenchmarkLoad parses each real tokenizer.json.
func BenchmarkLoad(b *testing.B) {
	dir := realFilesDir(b)
	for _, name := range realNames {
		b.Run(name, func(b *testing.B) {
			data, err := os.ReadFile(filepath.Join(dir, name, "tokenizer.json"))
			if err != nil {
				b.Skip(err)
			}
			for b.Loop() {
				if _, err := Parse(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncodeLatency times single encodes of the 8k prompt with a warm
// word cache, for each real tokenizer, and reports their p50 and p99: the
// latency one request sees, where BenchmarkEncode gives the mean.
func BenchmarkEncodeLatency(b *testing.B) {
	text := benchPrompt(b, 1)
	for _, name := range realNames {
		b.Run(name, func(b *testing.B) {
			tk := withoutSections(loadReal(b, name))
			tk.Encode(text, true) // warm the word cache
			var times []time.Duration
			for b.Loop() {
				start := time.Now()
				tk.Encode(text, true)
				times = append(times, time.Since(start))
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

// BenchmarkEncodeFixture encodes the 8k prompt with the small fixtures, so
// that it runs without the real files. The fixtures' vocabularies are tiny,
// which makes BPE do more merging per word than a real model would.
func BenchmarkEncodeFixture(b *testing.B) {
	text := benchPrompt(b, 1)
	for _, name := range fuzzFixtures {
		b.Run(name, func(b *testing.B) {
			tk := withoutSections(loadFixture(b, name, nil))
			dst := tk.Encode(text, true)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for b.Loop() {
				dst = tk.AppendEncode(dst[:0], text, true)
			}
		})
	}
}

// BenchmarkDecodeFixture decodes the 8k prompt's ids with the byte-level
// fixture.
func BenchmarkDecodeFixture(b *testing.B) {
	tk := loadFixture(b, "bytelevel.json", nil)
	ids := tk.Encode(benchPrompt(b, 1), false)
	b.ReportAllocs()
	for b.Loop() {
		tk.Decode(ids, false)
	}
}
