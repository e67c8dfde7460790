package tokconformance

// exception is a gemma3 or llama2 vector on which the gateway may differ
// from the reference, for a reason checked and written down. Each must
// still differ: one that matches again fails the test, so the table stays
// honest. Exact models (qwen3, llama3_1, deepseek_v3, gptoss) may have
// none.
type exception struct {
	model   string
	section string // "text", "text+special", "chat render", "chat ids"
	index   int    // the vector's index in its file's texts or chats
	text    string // the start of the vector's text (for a chat, of the reference's rendered text)
	reason  string
}

type exceptionKey struct {
	section string
	index   int
}

var exceptions = []exception{
	{
		model: "gemma3", section: "chat render", index: 25,
		text: "<bos><start_of_turn>user\n你是一个乐于助人的助手。",
		reason: "the user turn starts with U+FEFF and the template trims it: @huggingface/jinja's trim is JS String.trim, which strips U+FEFF; " +
			"Python's str.strip (Jinja2's trim, what vLLM runs) keeps it, and so does chattemplate. The reference is wrong here " +
			"(gen/jinja2_check.py shows Jinja2 3.1.6 keeping it); llama3_1 chat 14 is the same case and, llama3_1 being exact, fails",
	},
}
