package tokenizer

import (
	"strconv"
	"strings"
	"testing"
)

// BenchmarkEncodeResumed encodes an 8k-token document of plain words with
// a new last word each time, through the prefix cache, as a gateway sees
// a document sent again with a new question: what is encoded afresh is the
// text from where the prefix cache resumes.
func BenchmarkEncodeResumed(b *testing.B) {
	benchEncodeResumed(b, strings.ReplaceAll(strings.ReplaceAll(benchPrompt(b, 1), "\n", " "), "<|", "< |"))
}

// BenchmarkEncodeResumedCJK is BenchmarkEncodeResumed for Chinese text: an
// 8k-token document of sentences of ideographs and fullwidth punctuation,
// whose fences are the punctuation marks (isCJKFence) and whose NFC check
// reads every character.
func BenchmarkEncodeResumedCJK(b *testing.B) {
	benchEncodeResumed(b, strings.Repeat("模型的输出取决于提示中的上下文，以及缓存中已经存在的前缀。我们在网关中计算每个请求的令牌。", 300))
}

// benchEncodeResumed encodes doc with a new last word each time through
// qwen3 with a prefix cache, after the two encodings that store it.
func benchEncodeResumed(b *testing.B, doc string) {
	tk := withPrefixes(withoutSections(loadReal(b, "qwen3")))
	dst := tk.Encode(doc+" u0", false)
	dst = tk.AppendEncode(dst[:0], doc+" u1", false) // stored from its second sighting
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	i := 1
	for b.Loop() {
		i++
		dst = tk.AppendEncode(dst[:0], doc+" u"+strconv.Itoa(i), false)
	}
	b.ReportMetric(float64(len(dst)), "tokens")
}
