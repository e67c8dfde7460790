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
	tk := withPrefixes(withoutSections(loadReal(b, "qwen3")))
	doc := strings.ReplaceAll(strings.ReplaceAll(benchPrompt(b, 1), "\n", " "), "<|", "< |")
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

// BenchmarkEncodeResumedCJK is BenchmarkEncodeResumed for Chinese text: an
// 8k-token document (sentences of ideographs and fullwidth punctuation)
// with a new last word each time. Nothing in it is a fence, so it is
// encoded whole on every call; its normalization check is most of what
// the NFC normalizer costs on such text.
func BenchmarkEncodeResumedCJK(b *testing.B) {
	tk := withPrefixes(withoutSections(loadReal(b, "qwen3")))
	doc := strings.Repeat("模型的输出取决于提示中的上下文，以及缓存中已经存在的前缀。我们在网关中计算每个请求的令牌。", 300)
	dst := tk.Encode(doc+" u0", false)
	dst = tk.AppendEncode(dst[:0], doc+" u1", false)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	i := 1
	for b.Loop() {
		i++
		dst = tk.AppendEncode(dst[:0], doc+" u"+strconv.Itoa(i), false)
	}
	b.ReportMetric(float64(len(dst)), "tokens")
}
