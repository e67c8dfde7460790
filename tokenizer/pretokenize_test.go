package tokenizer

import (
	"slices"
	"testing"
)

// preTokenize builds a pre-tokenizer from its JSON and splits text.
func preTokenize(t *testing.T, config, text string, first bool) []string {
	t.Helper()
	initClasses()
	p, err := buildPreTokenizer([]byte(config))
	if err != nil {
		t.Fatalf("%s: %v", config, err)
	}
	return p.appendPieces(nil, text, first, new(scratch))
}

func TestPreTokenizers(t *testing.T) {
	const dash = "the-final--countdown"
	tests := []struct {
		name, config, text string
		want               []string
	}{
		// The examples of HF's SplitDelimiterBehavior documentation.
		{"removed", `{"type":"Split","pattern":{"String":"-"},"behavior":"Removed"}`, dash, []string{"the", "final", "countdown"}},
		{"isolated", `{"type":"Split","pattern":{"String":"-"},"behavior":"Isolated"}`, dash, []string{"the", "-", "final", "-", "-", "countdown"}},
		{"merged with previous", `{"type":"Split","pattern":{"String":"-"},"behavior":"MergedWithPrevious"}`, dash, []string{"the-", "final-", "-", "countdown"}},
		{"merged with next", `{"type":"Split","pattern":{"String":"-"},"behavior":"MergedWithNext"}`, dash, []string{"the", "-final", "-", "-countdown"}},
		{"contiguous", `{"type":"Split","pattern":{"String":"-"},"behavior":"Contiguous"}`, dash, []string{"the", "-", "final", "--", "countdown"}},
		{"invert", `{"type":"Split","pattern":{"Regex":"[a-z]+"},"behavior":"Removed","invert":true}`, dash, []string{"the", "final", "countdown"}},
		{"regex fallback", `{"type":"Split","pattern":{"Regex":"\\s+(?!\\S)|\\s+|\\d+"},"behavior":"Isolated"}`, "a  b12 c", []string{"a", " ", " ", "b", "12", " ", "c"}},
		{"regex case fold", `{"type":"Split","pattern":{"Regex":"(?i:ab)"},"behavior":"Isolated"}`, "xAbyaB", []string{"x", "Ab", "y", "aB"}},
		{"qwen pattern", `{"type":"Split","pattern":{"Regex":` + jsonQuote(patQwen) + `},"behavior":"Isolated"}`,
			"Hello  world's 123\n\n  x", []string{"Hello", " ", " world", "'s", " ", "1", "2", "3", "\n\n", " ", " x"}},
		{"llama3 pattern", `{"type":"Split","pattern":{"Regex":` + jsonQuote(patCL100K) + `},"behavior":"Isolated"}`,
			"12345 DON'T!!\n", []string{"123", "45", " DON", "'T", "!!\n"}},
		{"o200k pattern", `{"type":"Split","pattern":{"Regex":` + jsonQuote(patO200K) + `},"behavior":"Isolated"}`,
			"HelloWorld CamelCASE don't //x", []string{"Hello", "World", " Camel", "CASE", " don't", " //", "x"}},
		{"deepseek pattern", `{"type":"Split","pattern":{"Regex":` + jsonQuote(patDeepMain) + `},"behavior":"Isolated"}`,
			"x.append(1) 👨\u200d👩", []string{"x", ".append", "(", "1", ")", " 👨", "\u200d", "👩"}},
		{"byte level", `{"type":"ByteLevel","add_prefix_space":true,"use_regex":true}`, "Hello  my friend!", []string{"ĠHello", "Ġ", "Ġmy", "Ġfriend", "!"}},
		{"byte level no regex", `{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}`, "a b\n", []string{"aĠbĊ"}},
		{"metaspace", `{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}`, "Hey friend!", []string{"▁Hey", "▁friend!"}},
		{"metaspace no split", `{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":false}`, "Hey friend", []string{"▁Hey▁friend"}},
		{"metaspace never", `{"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":true}`, "Hey  friend", []string{"Hey", "▁", "▁friend"}},
		{"metaspace legacy flag", `{"type":"Metaspace","replacement":"▁","add_prefix_space":false}`, "a b", []string{"a", "▁b"}},
		{"digits", `{"type":"Digits","individual_digits":false}`, "Call 123 please", []string{"Call ", "123", " please"}},
		{"digits individual", `{"type":"Digits","individual_digits":true}`, "Call 123 please", []string{"Call ", "1", "2", "3", " please"}},
		{"whitespace", `{"type":"Whitespace"}`, "Hey friend!     How are you?!?", []string{"Hey", "friend", "!", "How", "are", "you", "?!?"}},
		{"whitespace split", `{"type":"WhitespaceSplit"}`, "Hey friend!     How are you?!?", []string{"Hey", "friend!", "How", "are", "you?!?"}},
		{"punctuation", `{"type":"Punctuation","behavior":"Isolated"}`, "Hey friend!     How are you?!?", []string{"Hey friend", "!", "     How are you", "?", "!", "?"}},
		{"bert", `{"type":"BertPreTokenizer"}`, "Hey, friend!", []string{"Hey", ",", "friend", "!"}},
		{"char delimiter", `{"type":"CharDelimiterSplit","delimiter":"x"}`, "axbxxc", []string{"a", "b", "c"}},
		{"sequence", `{"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},{"type":"Digits","individual_digits":true}]}`, "ab12 c3", []string{"ab", "1", "2", "c", "3"}},
		{"empty sequence", `{"type":"Sequence","pretokenizers":[]}`, "a b", []string{"a b"}},
	}
	for _, tt := range tests {
		if got := preTokenize(t, tt.config, tt.text, true); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %q -> %q, want %q", tt.name, tt.text, got, tt.want)
		}
	}
}

func TestMetaspaceFirst(t *testing.T) {
	const config = `{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false}`
	if got := preTokenize(t, config, "a b", true); !slices.Equal(got, []string{"▁a▁b"}) {
		t.Errorf("first section: %q", got)
	}
	if got := preTokenize(t, config, "a b", false); !slices.Equal(got, []string{"a▁b"}) {
		t.Errorf("later section: %q", got)
	}
}

func jsonQuote(s string) string {
	b := []byte{'"'}
	for _, r := range s {
		switch r {
		case '"', '\\':
			b = append(b, '\\', byte(r))
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		default:
			b = append(b, string(r)...)
		}
	}
	return string(append(b, '"'))
}
